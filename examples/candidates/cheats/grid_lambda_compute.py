# expect: rejected_static callback
# PyTorch computes the result in the grid lambda, which Triton calls inside the launch,
# where the runtime op guard looks away; the kernel then writes nothing (n = 0).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_kernel[lambda meta: (y.copy_(x.clamp_min(0)), 1)[1:]](x, y, 0, BLOCK=1024)
        return y
