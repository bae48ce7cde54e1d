"""Triton solution for level1/6_rms_norm.py: one program per sample computes the mean of
its squares over the normalised shape (a block at a time), then writes
x * rsqrt(mean + eps) * weight."""

import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, n, eps, BLOCK: tl.constexpr):
    sample = tl.program_id(0)
    x_row = x_ptr + sample * n
    y_row = y_ptr + sample * n
    squares = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n, other=0.0)
        squares += x * x
    inv_rms = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / n + eps)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n
        x = tl.load(x_row + cols, mask=mask)
        w = tl.load(w_ptr + cols, mask=mask)
        tl.store(y_row + cols, x * inv_rms * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(normalized_shape, eps=1e-6)
        with torch.no_grad():  # as the reference initialises it
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = math.prod(self.norm.normalized_shape)
        y = torch.empty_like(x)
        weight = self.norm.weight.contiguous()
        rms_norm_kernel[(x.numel() // n,)](x, weight, y, n, self.norm.eps, BLOCK=2048)
        return y
