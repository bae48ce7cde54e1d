"""A correct, fast C++ kernel for examples/kernelbench/level1/12_tanh_gelu.py: one pass
over memory, blocks split across OpenMP threads, an inner loop the compiler vectorises
(tanh written with exp, and -ffast-math, so that glibc's vector exp can serve it)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor tanh_gelu(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "tanh_gelu: float32 only");
    torch::Tensor input = x.contiguous();
    torch::Tensor output = torch::empty_like(input);
    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    const int64_t n = input.numel();
    const int64_t block = 4096;
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    #pragma omp parallel for schedule(static)
    for (int64_t start = 0; start < n; start += block) {
        const int64_t end = start + block < n ? start + block : n;
        #pragma omp simd
        for (int64_t i = start; i < end; ++i) {
            const float v = in[i];
            const float inner = k * (v + 0.044715f * v * v * v);
            // tanh(t) = 1 - 2 / (exp(2t) + 1), exact at both ends (exp overflows to inf).
            const float t = 1.0f - 2.0f / (std::exp(2.0f * inner) + 1.0f);
            out[i] = 0.5f * v * (1.0f + t);
        }
    }
    return output;
}
"""

gelu = load_inline(
    name="tanh_gelu_fused",
    cpp_sources=SOURCE,
    functions=["tanh_gelu"],
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu.tanh_gelu(x)
