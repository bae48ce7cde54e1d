"""Cheat (cpp backend): the C++ "kernel" calls ATen's GELU, so PyTorch does the work.
The gate must refuse it (torch_compute)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>

torch::Tensor tanh_gelu(torch::Tensor x) {
    return at::gelu(x, "tanh");
}
"""

gelu = load_inline(name="aten_gelu", cpp_sources=SOURCE, functions=["tanh_gelu"])


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu.tanh_gelu(x)
