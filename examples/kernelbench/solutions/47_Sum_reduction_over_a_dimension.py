"""Triton solution for KernelBench level1/47_Sum_reduction_over_a_dimension.py: the input
seen as (outer, reduced, inner); each program sums a block of inner positions over the
reduced dim, a tile of reduced positions at a time, so any dim and any sizes work."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_kernel(x_ptr, y_ptr, reduced, inner, TILE: tl.constexpr, BLOCK: tl.constexpr):
    outer = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    base = x_ptr + outer * reduced * inner
    total = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, reduced, TILE):
        rows = start + tl.arange(0, TILE)
        mask = (rows[:, None] < reduced) & (cols[None, :] < inner)
        tile = tl.load(base + rows[:, None] * inner + cols[None, :], mask=mask, other=0.0)
        total += tl.sum(tile, axis=0)
    tl.store(y_ptr + outer * inner + cols, total, mask=cols < inner)


class ModelNew(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer = math.prod(x.shape[:dim])
        inner = math.prod(x.shape[dim + 1 :])
        shape = (*x.shape[:dim], 1, *x.shape[dim + 1 :])
        y = torch.empty(shape, dtype=x.dtype, device=x.device)
        grid = (outer, triton.cdiv(inner, 128))
        sum_kernel[grid](x, y, x.shape[dim], inner, TILE=32, BLOCK=128)
        return y
