"""Correct Triton solution for examples/tasks/mean_cols.py: each program owns a block of
columns and walks down the rows."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mean_cols_kernel(x_ptr, out_ptr, n_rows, n_cols, stride, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for row in range(0, n_rows):
        acc += tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    tl.store(out_ptr + cols, acc / n_rows, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty((cols,), dtype=x.dtype, device=x.device)
        mean_cols_kernel[(triton.cdiv(cols, 128),)](x, out, rows, cols, x.stride(0), BLOCK=128)
        return out
