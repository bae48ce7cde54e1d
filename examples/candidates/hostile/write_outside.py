# expect: rejected_static (runtime write containment is not done: see tests)
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
    def forward(self, x):
        import os
        path = os.path.join(os.path.dirname(os.getcwd()), 'kf-hostile-marker')
        with open(path, 'w') as fh:
            fh.write('escaped')
        return x
