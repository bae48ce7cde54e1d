# expect: pass
# Reads the environment it was started with, its own and its parents': a daemon's API
# keys and tokens would be there if the sandbox passed the daemon's environment on.
# Anything secret-looking it raises. The gate refuses `os`; with the gate off, the
# sandbox's environment must be the minimal one: it then computes ReLU and passes.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


NAMES = ("KEY", "TOKEN", "SECRET", "PASSWORD", "NATS", "KF_")


def steal():
    import os

    found = [f"{k}={v}" for k, v in os.environ.items() if any(n in k.upper() for n in NAMES)]
    found = [f for f in found if not f.startswith("KF_SANDBOX_")]
    for pid in ("self", "1", str(os.getppid())):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                entries = fh.read().decode("latin-1").split("\x00")
        except OSError:
            continue
        found += [
            f"{pid}: {e}" for e in entries
            if any(n in e.split("=")[0].upper() for n in NAMES) and not e.startswith("KF_SANDBOX_")
        ]
    return found


class ModelNew(nn.Module):
    def forward(self, x):
        found = steal()
        if found:
            raise RuntimeError("environment: " + " | ".join(found[:20]))
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
