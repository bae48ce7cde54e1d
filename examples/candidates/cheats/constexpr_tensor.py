# expect: rejected_runtime kernel_arguments
# Cheat: the input handed to the kernel as a tl.constexpr. The CPU interpreter passes a
# constexpr as the object itself, so the kernel body would compute with PyTorch (x * (x > 0)
# inside the launch, where the op guard looks away) and store the result.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, X: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, X * (X > 0), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), X=x, BLOCK=1024)
        return y
