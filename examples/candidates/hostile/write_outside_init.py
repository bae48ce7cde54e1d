# expect: rejected_runtime filesystem
# Writes a file outside its sandbox dir from __init__, with torch.save and a path built at
# runtime (no `open`, no `os`): a planted "result" for a later verification to load. The
# gate's file_io rule refuses torch.save; with the gate off, the sandbox's read-only file
# system must stop the write.
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
        parts = ["..", "kf-hostile-" + "init-marker"]
        torch.save(torch.zeros(4), "/".join(parts))

    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
