# expect: rejected_static caching
# A decorator of its own memoises forward in a closure.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def remember(forward):
    results = {}

    def wrapper(self, x):
        key = tuple(x.shape)
        if key not in results:
            results[key] = forward(self, x)
        return results[key]

    return wrapper


class ModelNew(nn.Module):
    @remember
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
