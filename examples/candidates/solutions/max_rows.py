"""Correct Triton solution for examples/tasks/max_rows.py: a looped, masked row max."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def max_rows_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.full((BLOCK,), -float("inf"), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        vals = tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=-float("inf"))
        acc = tl.maximum(acc, vals)
    tl.store(out_ptr + row, tl.max(acc, axis=0))


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        out = torch.empty((rows,), dtype=x.dtype, device=x.device)
        max_rows_kernel[(rows,)](x, out, x.stride(0), cols, BLOCK=256)
        return out
