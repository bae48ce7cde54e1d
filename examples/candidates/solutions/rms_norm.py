"""Correct Triton solution for examples/tasks/rms_norm.py."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, stride, n_cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=0.0)
    rms = tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask)
    tl.store(y_ptr + row * stride + cols, x / rms * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(normalized) + 0.5)
        self.eps = 1e-6

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        rms_norm_kernel[(rows,)](
            x, self.weight, y, x.stride(0), cols, self.eps, BLOCK=triton.next_power_of_2(cols)
        )
        return y
