"""Triton solution for KernelBench level1/89_cumsum.py: one program per row (the scan dim
made the last one), which scans it block by block and carries the running total."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cumsum_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    carry = tl.zeros((1,), tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_ptr + row * n + cols, mask=mask, other=0.0)
        scanned = tl.cumsum(x, axis=0) + carry
        tl.store(y_ptr + row * n + cols, scanned, mask=mask)
        carry += tl.sum(x, axis=0)


class ModelNew(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.movedim(self.dim, -1).contiguous()
        y = torch.empty_like(rows)
        n = rows.shape[-1]
        cumsum_kernel[(rows.numel() // n,)](rows, y, n, BLOCK=1024)
        return y.movedim(-1, self.dim)
