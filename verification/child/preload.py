"""The runtime every verifier sandbox shares: torch and triton, imported once by the warm
worker before it forks (never initialising CUDA), and checked under the sandbox's limits
by the probe that picks the sandbox plan.

Child side: stdlib at module level; torch and triton are imported where they are used.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from kernelflow.sandbox import apply_limits
from kernelflow.verification.child.loading import load_module

__all__ = ["check_runtime", "preload"]

PROBE_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)
"""


def preload() -> None:
    """Import what every sandbox needs, so that a forked sandbox starts with it."""
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    import numpy  # noqa: F401
    import torch
    import torch._dynamo  # entering a TorchDispatchMode imports it lazily: 2+ s
    import torch.utils._python_dispatch
    import triton
    import triton.language

    with contextlib.suppress(ImportError):
        import triton.runtime.interpreter
    with contextlib.suppress(ImportError):
        # A launch specialises its arguments, which imports Gluon's language module on
        # first use: in every forked sandbox, 12 % of a Triton check on the CPU.
        import triton.experimental.gluon.language
    del torch, triton


def check_runtime(device: str, memory_kind: str, memory_mb: int, fs: bool) -> int:
    """Under the limits, import torch and triton (and on CUDA, compute on the device and,
    inside the read-only file system, compile a Triton kernel); print ``ok`` last."""
    apply_limits(memory_kind, memory_mb)
    import torch
    import triton  # noqa: F401  (importing is the check)

    if device == "cuda":
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        assert float(x.sum()) == 1024.0
        if fs:  # compiling a kernel writes Triton's cache and temp files: must still work
            # Loaded from a file like a candidate: compiled Triton resolves the kernel's
            # globals (tl) in its module, and needs its source.
            path = Path.cwd() / "probe_kernel.py"
            path.write_text(PROBE_KERNEL)
            kernel = load_module(path, "kf_probe_kernel").probe_kernel
            kernel[(1,)](x, x.numel(), BLOCK=1024)
            torch.cuda.synchronize()
            assert float(x.sum()) == 2048.0
    print("ok", flush=True)
    return 0
