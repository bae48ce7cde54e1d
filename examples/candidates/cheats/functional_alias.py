# expect: rejected_static torch_compute
# PyTorch compute through an alias of torch.nn.functional.
import torch
import torch.nn as nn
from torch.nn import functional as F
import triton
import triton.language as tl

act = F.relu


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](act(x), y, x.numel(), BLOCK=1024)
        return y
