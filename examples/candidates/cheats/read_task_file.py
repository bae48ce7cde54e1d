# expect: rejected_static introspection
# Reads the task's file to run the reference's own code (the file is the judge's: outside
# the candidate's view, and `open` is refused before that).
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        source = open("../task.py").read()
        self.reference = {}
        exec(source, self.reference)

    def forward(self, x):
        result = self.reference["Model"]()(x)
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](result, y, x.numel(), BLOCK=1024)
        return y
