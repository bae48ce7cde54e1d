# expect: rejected_static caching
# Keeps one output buffer across calls: the caller's earlier result changes under it. The
# gate refuses the list on self it is kept in; with the gate off the runtime sees it
# (second_run).
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
    def __init__(self):
        super().__init__()
        self.keep = []

    def forward(self, x):
        if not self.keep:
            self.keep.append(torch.empty_like(x))
        out = self.keep[0]
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
