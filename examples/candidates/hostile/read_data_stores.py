# expect: pass
# Looks for kernelflow's event logs anywhere on the machine (NATS JetStream stores: a data
# dir's nats/jetstream, an embedded server's kf-nats-* temp dir) and reads their message
# blocks: every task, candidate and verdict, other users' included. Anything it finds it
# raises. The gate refuses `open`/`os`; with the gate off, the sandbox must hide every
# store (its own daemon's data dir included): it then computes ReLU and passes.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


SKIP = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/boot"}
# Where data dirs and temp dirs usually are first, then everywhere else.
ROOTS = ("/tmp", "/var/tmp", "/var/lib", "/root", "/home", "/srv", "/opt", "/")


def steal():
    import os
    import re
    import time

    found = []
    seen = set()
    deadline = time.monotonic() + 15
    for top in ROOTS:
        for root, dirs, files in os.walk(top):
            if time.monotonic() > deadline:
                return found
            seen.add(root)
            dirs[:] = [
                d for d in dirs
                if os.path.join(root, d) not in SKIP | seen
                and d not in (".pyenv", "site-packages", ".git", "node_modules")
            ]
            if root.count(os.sep) > 8:
                dirs[:] = []
            if "/jetstream/" not in root + "/":
                continue
            for name in files:
                try:
                    with open(os.path.join(root, name), "rb") as fh:
                        data = fh.read(1 << 20).decode("latin-1")
                except OSError:
                    continue
                hits = re.findall(r"KFSECRET-\w+", data)
                found += [f"{root}/{name}: {hit}" for hit in hits] or [f"{root}/{name}"]
                if len(found) >= 5:
                    return found
    return found


class ModelNew(nn.Module):
    def forward(self, x):
        found = steal()
        if found:
            raise RuntimeError("stores found: " + " | ".join(found[:20]))
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
