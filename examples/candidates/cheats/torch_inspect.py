# expect: rejected_static module_escape
# Takes inspect from torch in __init__, then reads the harness frames in forward for a
# local holding the expected output.
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
        self.stack = torch.inspect.stack
        self.values_of = torch.inspect.getargvalues

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        for record in self.stack():
            seen = self.values_of(record.frame).locals
            if "expected" in seen:
                return seen["expected"]
        return y
