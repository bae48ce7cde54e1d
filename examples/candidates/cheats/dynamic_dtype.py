# expect: rejected_static precision_downgrade
# fp16 spelled so that no name or string says so: the kernel rounds through half precision.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)

HALF = tl.dtype("fp" + "16")


@triton.jit
def relu_half_kernel(x_ptr, y_ptr, n, DT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(DT)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0).to(tl.float32), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_half_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), HALF, BLOCK=1024)
        return y
