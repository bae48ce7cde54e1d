"""A correct C++ kernel for examples/kernelbench/level1/12_tanh_gelu.py, between the slow
and the fused one: a single pass over memory across OpenMP threads, but std::tanh one
element at a time (without -ffast-math the compiler calls the scalar tanhf)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor tanh_gelu(torch::Tensor x) {
    torch::Tensor input = x.contiguous();
    torch::Tensor output = torch::empty_like(input);
    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    const int64_t n = input.numel();
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float v = in[i];
        out[i] = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    }
    return output;
}
"""

gelu = load_inline(
    name="tanh_gelu_scalar",
    cpp_sources=SOURCE,
    functions=["tanh_gelu"],
    extra_cflags=["-O3", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu.tanh_gelu(x)
