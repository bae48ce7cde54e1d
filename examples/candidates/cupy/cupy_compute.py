# expect: rejected_static torch_compute
# task: relu
# The raw kernel is launched (copying x), but CuPy's own library op computes the result.
import cupy
import torch
import torch.nn as nn

COPY_SOURCE = r"""
extern "C" __global__ void copy_kernel(const float* x, float* y, long long n)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.copy_kernel = cupy.RawKernel(COPY_SOURCE, "copy_kernel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        xc, yc = cupy.from_dlpack(x), cupy.from_dlpack(y)
        n = x.numel()
        self.copy_kernel(((n + 255) // 256,), (256,), (xc, yc, cupy.int64(n)))
        cupy.maximum(yc, 0.0, out=yc)
        return y
