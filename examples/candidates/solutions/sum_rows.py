"""Correct Triton solution for examples/tasks/sum_rows.py (the scripted coder's second answer)."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_rows_kernel(x_ptr, out_ptr, x_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(axis=0)
    row_ptr = x_ptr + row * x_row_stride
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        vals = tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
        acc += vals.to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_rows, n_cols = x.shape
        out = torch.empty((n_rows,), dtype=x.dtype, device=x.device)
        sum_rows_kernel[(n_rows,)](x, out, x.stride(0), n_cols, BLOCK_SIZE=256)
        return out
