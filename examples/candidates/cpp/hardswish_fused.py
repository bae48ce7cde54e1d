"""A correct C++ kernel for examples/kernelbench/level1/3_hardswish.py: one pass over
memory, blocks split across OpenMP threads, a branch-free inner loop the compiler
vectorises."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <algorithm>

torch::Tensor hardswish(torch::Tensor x) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "hardswish: float32 only");
    torch::Tensor input = x.contiguous();
    torch::Tensor output = torch::empty_like(input);
    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    const int64_t n = input.numel();
    const int64_t block = 8192;
    #pragma omp parallel for schedule(static)
    for (int64_t start = 0; start < n; start += block) {
        const int64_t end = std::min(start + block, n);
        #pragma omp simd
        for (int64_t i = start; i < end; ++i) {
            const float v = in[i];
            const float gate = std::min(std::max(v + 3.0f, 0.0f), 6.0f);
            out[i] = v * gate * (1.0f / 6.0f);
        }
    }
    return output;
}
"""

ops = load_inline(
    name="hardswish_fused",
    cpp_sources=SOURCE,
    functions=["hardswish"],
    extra_cflags=["-O3", "-march=native", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.hardswish(x)
