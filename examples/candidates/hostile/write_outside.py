# expect: rejected_runtime filesystem
# Writes next to its sandbox dir (the system temp dir, world-writable: dropping to `nobody`
# alone would not stop it). The gate refuses `open`/`os`; with the gate off, the sandbox's
# read-only file system must (the write fails with EROFS and nothing appears).
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
