"""Triton solution for level1/7_mean_over_dim.py: the input seen as (outer, reduced,
inner); every (outer, inner) pair is a lane, and each program averages a block of lanes
over the reduced dim, a tile of it at a time, so any dim and any sizes work."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mean_kernel(x_ptr, y_ptr, lanes, reduced, inner, LANES: tl.constexpr, TILE: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    base = (lane // inner) * reduced * inner + lane % inner
    total = tl.zeros((LANES,), tl.float32)
    for start in range(0, reduced, TILE):
        r = start + tl.arange(0, TILE)
        mask = (lane[:, None] < lanes) & (r[None, :] < reduced)
        tile = tl.load(x_ptr + base[:, None] + r[None, :] * inner, mask=mask, other=0.0)
        total += tl.sum(tile, axis=1)
    tl.store(y_ptr + lane, total / reduced, mask=lane < lanes)


class ModelNew(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        inner = math.prod(x.shape[dim + 1 :])
        shape = (*x.shape[:dim], *x.shape[dim + 1 :])
        y = torch.empty(shape, dtype=x.dtype, device=x.device)
        lanes = y.numel()
        mean_kernel[(triton.cdiv(lanes, 64),)](x, y, lanes, x.shape[dim], inner, LANES=64, TILE=64)
        return y
