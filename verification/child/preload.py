"""The runtime every verifier sandbox shares: torch, and each backend's DSL runtime
(``Backend.preload``: Triton's), imported once by the warm process before it forks (never
initialising CUDA), and checked under the sandbox's limits by the probe that picks the
sandbox plan (``Backend.check_runtime``).

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import os

from kernelflow.sandbox import apply_limits
from kernelflow.verification.backends import registered
from kernelflow.verification.child.loading import load_module

__all__ = ["check_runtime", "preload"]


def preload() -> None:
    """Import what every sandbox needs, so that a forked sandbox starts with it."""
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    import numpy  # noqa: F401
    import torch
    import torch.utils._python_dispatch  # the op guard's mode (not torch._dynamo: guards.py)

    for dsl in registered():
        dsl.preload()
    del torch


def check_runtime(device: str, memory_kind: str, memory_mb: int, fs: bool) -> int:
    """Under the limits, import torch and each backend's runtime (and on CUDA, compute on
    the device and, inside the read-only file system, let each backend build a kernel);
    print ``ok`` last."""
    apply_limits(memory_kind, memory_mb)
    import torch

    if device == "cuda":
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        assert float(x.sum()) == 1024.0
    for dsl in registered():
        dsl.check_runtime(device, fs, load_module)
    print("ok", flush=True)
    return 0
