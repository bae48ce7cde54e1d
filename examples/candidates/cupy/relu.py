# expect: pass (with backend "cupy" on a CUDA GPU; "unsupported" on a machine without one)
# task: relu
"""ReLU as a CUDA C kernel compiled with CuPy: a correct candidate for backend "cupy".

The verifier hands forward() CUDA tensors. They are wrapped as CuPy arrays without a copy
(``cupy.from_dlpack``: same memory), and the raw kernel is launched on CuPy's current
stream, which the verifier keeps equal to torch's current stream: the launch is ordered
after the work that produced ``x`` and before whatever reads ``y``.
"""

import cupy
import torch
import torch.nn as nn

RELU_SOURCE = r"""
extern "C" __global__ void relu_kernel(const float* __restrict__ x,
                                       float* __restrict__ y,
                                       long long n)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
"""
THREADS = 256
MAX_BLOCKS = 65535


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.relu_kernel = cupy.RawModule(code=RELU_SOURCE).get_function("relu_kernel")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        blocks = max(1, min((n + THREADS - 1) // THREADS, MAX_BLOCKS))
        self.relu_kernel(
            (blocks,),
            (THREADS,),
            (cupy.from_dlpack(x), cupy.from_dlpack(y), cupy.int64(n)),
        )
        return y
