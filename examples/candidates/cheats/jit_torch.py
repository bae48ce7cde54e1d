# expect: rejected_static kernel_body
# The CPU interpreter runs a @triton.jit body as Python: this one calls PyTorch on tensors
# handed in as constexprs, inside the launch.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, X: tl.constexpr, Y: tl.constexpr, BLOCK: tl.constexpr):
    if tl.program_id(0) == 0:
        Y.copy_(torch.relu(X))
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(y_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_kernel[(1,)](x, y, 0, x, y, BLOCK=1024)
        return y
