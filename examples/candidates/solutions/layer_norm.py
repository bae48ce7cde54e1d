"""Correct Triton solution for examples/tasks/layer_norm.py.

Parameters are created exactly as the reference creates them (same RNG calls in the same
order), so the verifier's seeded construction gives both models the same weights.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    centered = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / n_cols
    inv = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    b = tl.load(b_ptr + cols, mask=mask)
    tl.store(y_ptr + row * stride + cols, centered * inv * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(normalized)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        layer_norm_kernel[(rows,)](
            x, self.norm.weight, self.norm.bias, y, x.stride(0), cols, self.norm.eps,
            BLOCK=triton.next_power_of_2(cols),
        )
        return y
