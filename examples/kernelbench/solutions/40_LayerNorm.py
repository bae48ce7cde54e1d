"""Triton solution for KernelBench level1/40_LayerNorm.py: each row (the trailing
normalized_shape dims, flattened) is one program, which reads it in blocks: once for the
mean, once for the variance, once to normalise. Rows of any length work."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * n
    y_row = y_ptr + row * n
    total = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        total += tl.load(x_row + cols, mask=cols < n, other=0.0)
    mean = tl.sum(total, axis=0) / n
    squares = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        centered = tl.where(mask, tl.load(x_row + cols, mask=mask, other=0.0) - mean, 0.0)
        squares += centered * centered
    inv_std = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_row + cols, mask=mask)
        w = tl.load(w_ptr + cols, mask=mask)
        b = tl.load(b_ptr + cols, mask=mask)
        tl.store(y_row + cols, (x - mean) * inv_std * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = math.prod(self.ln.normalized_shape)
        y = torch.empty_like(x)
        layer_norm_kernel[(x.numel() // n,)](
            x, self.ln.weight, self.ln.bias, y, n, self.ln.eps, BLOCK=1024
        )
        return y
