# expect: rejected_static caching
# An output cache kept on self with setdefault: later calls return the first result.
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
    def __init__(self) -> None:
        super().__init__()
        self.results = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        out = self.results.setdefault(tuple(x.shape), y)
        if out is y:
            relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return out
