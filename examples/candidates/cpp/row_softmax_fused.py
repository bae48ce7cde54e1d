"""A correct C++ kernel for examples/kernelbench/level1/5_row_softmax.py: rows split across
OpenMP threads, each in three vectorised passes (its maximum; the exponentials written and
summed; the scaling), the temperature folded into the exponent, and -ffast-math so that
glibc's vector exp serves the exponentials."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
#include <cmath>
#include <limits>

torch::Tensor row_softmax(torch::Tensor x, double temperature) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "row_softmax: float32 only");
    TORCH_CHECK(x.dim() == 2, "row_softmax: a matrix");
    torch::Tensor input = x.contiguous();
    torch::Tensor output = torch::empty_like(input);
    const int64_t rows = input.size(0), cols = input.size(1);
    const float scale = static_cast<float>(1.0 / temperature);
    const float* in = input.data_ptr<float>();
    float* out = output.data_ptr<float>();
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = in + r * cols;
        float* dst = out + r * cols;
        float best = -std::numeric_limits<float>::max();
        #pragma omp simd reduction(max : best)
        for (int64_t c = 0; c < cols; ++c) {
            best = std::fmax(best, row[c]);
        }
        const float shift = best * scale;
        float sum = 0.0f;
        #pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < cols; ++c) {
            const float e = std::exp(row[c] * scale - shift);
            dst[c] = e;
            sum += e;
        }
        const float inv = 1.0f / sum;
        #pragma omp simd
        for (int64_t c = 0; c < cols; ++c) {
            dst[c] *= inv;
        }
    }
    return output;
}
"""

ops = load_inline(
    name="row_softmax_fused",
    cpp_sources=SOURCE,
    functions=["row_softmax"],
    extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
    extra_ldflags=["-fopenmp"],
)


class ModelNew(nn.Module):
    def __init__(self, temperature: float) -> None:
        super().__init__()
        self.temperature = temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.row_softmax(x, self.temperature)
