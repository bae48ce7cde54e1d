"""Correct Triton solution for examples/tasks/log_softmax.py: one program per row."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, y_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    shifted = x - tl.max(x, axis=0)
    denom = tl.sum(tl.where(mask, tl.exp(shifted), 0.0), axis=0)
    tl.store(y_ptr + row * stride + cols, shifted - tl.log(denom), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        log_softmax_kernel[(rows,)](x, y, x.stride(0), cols, BLOCK=block)
        return y
