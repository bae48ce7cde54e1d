"""Correct Triton solution for examples/tasks/sum_dim.py: the tensor seen as (outer,
reduced, inner); each program sums one outer row's block of inner columns down the
reduced dimension."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_middle_kernel(x_ptr, out_ptr, reduced, inner, BLOCK: tl.constexpr):
    outer = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    base = x_ptr + outer * reduced * inner
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for r in range(0, reduced):
        acc += tl.load(base + r * inner + cols, mask=mask, other=0.0)
    tl.store(out_ptr + outer * inner + cols, acc, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        d = self.dim % x.dim()
        outer = math.prod(x.shape[:d])
        inner = math.prod(x.shape[d + 1 :])
        shape = x.shape[:d] + (1,) + x.shape[d + 1 :]
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
        grid = (outer, triton.cdiv(inner, 128))
        sum_middle_kernel[grid](x, out, x.shape[d], inner, BLOCK=128)
        return out
