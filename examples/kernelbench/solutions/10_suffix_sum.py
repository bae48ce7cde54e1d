"""Triton solution for level1/10_suffix_sum.py: the scanned dim made the last one, each
program takes a block of rows and walks their columns from the end, a tile at a time:
each tile is scanned in reverse and the total of the tiles after it added."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def suffix_sum_kernel(x_ptr, y_ptr, rows, n, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    n_blocks = tl.cdiv(n, BLOCK)
    carry = tl.zeros((ROWS,), tl.float32)
    for step in range(0, n_blocks):
        cols = (n_blocks - 1 - step) * BLOCK + tl.arange(0, BLOCK)
        mask = (row[:, None] < rows) & (cols[None, :] < n)
        offsets = row[:, None] * n + cols[None, :]
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
        scanned = tl.cumsum(x, axis=1, reverse=True) + carry[:, None]
        tl.store(y_ptr + offsets, scanned, mask=mask)
        carry += tl.sum(x, axis=1)


class ModelNew(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.movedim(self.dim, -1).contiguous()
        y = torch.empty_like(rows)
        n = rows.shape[-1]
        count = rows.numel() // n
        suffix_sum_kernel[(triton.cdiv(count, 16),)](rows, y, count, n, ROWS=16, BLOCK=256)
        return y.movedim(-1, self.dim)
