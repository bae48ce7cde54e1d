"""A correct but deliberately slow C++ kernel for examples/kernelbench/level1/12_tanh_gelu.py:
one thread, double precision with std::pow and std::tanh, and the matrix walked column by
column (every read a cache miss). Written as KernelBench's models write extensions: the
source binds its function itself (``PYBIND11_MODULE``, no ``functions=``), the template's
empty flags, the extension kept on ``self``."""

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
    const int64_t cols = input.size(-1);
    const int64_t rows = input.numel() / cols;
    for (int64_t c = 0; c < cols; ++c) {
        for (int64_t r = 0; r < rows; ++r) {
            const double v = in[r * cols + c];
            const double inner = std::sqrt(2.0 / M_PI) * (v + 0.044715 * std::pow(v, 3.0));
            out[r * cols + c] = static_cast<float>(0.5 * v * (1.0 + std::tanh(inner)));
        }
    }
    return output;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("tanh_gelu", &tanh_gelu, "tanh GELU, slowly");
}
"""

gelu = load_inline(
    name="tanh_gelu_slow",
    cpp_sources=SOURCE,
    extra_cflags=["-O0", ""],
    extra_ldflags=[""],
    verbose=True,
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gelu = gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gelu.tanh_gelu(x)
