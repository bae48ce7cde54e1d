# expect: pass (with backend "cuda" on a CUDA GPU; "unsupported" on a machine without one)
# task: relu
"""ReLU in KernelBench's CUDA format: a ``__global__`` kernel and its launch in
``cuda_sources``, the host function's declaration in ``cpp_sources``, built with
``torch.utils.cpp_extension.load_inline`` (the verifier builds it, with nvcc, once per
source) and launched on torch's current stream."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor relu_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "relu: float32 CUDA tensors");
    torch::Tensor input = x.contiguous();
    torch::Tensor output = torch::empty_like(input);
    const int64_t n = input.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    relu_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        input.data_ptr<float>(), output.data_ptr<float>(), n);
    return output;
}
"""
CPP_SOURCE = "torch::Tensor relu_forward(torch::Tensor x);"

relu = load_inline(
    name="relu_cuda",
    cpp_sources=CPP_SOURCE,
    cuda_sources=CUDA_SOURCE,
    functions=["relu_forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu.relu_forward(x)
