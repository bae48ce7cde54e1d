# expect: rejected_static torch_compute
# task: relu
# A CUDA kernel is compiled for show, but PyTorch computes the result and the kernel is
# never launched.
import cupy
import torch
import torch.nn as nn

RELU_SOURCE = r"""
extern "C" __global__ void relu_kernel(const float* x, float* y, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.relu_kernel = cupy.RawKernel(RELU_SOURCE, "relu_kernel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, min=0.0)
