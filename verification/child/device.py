"""What timing needs of the device, the same in the judge's process and the candidate's:
the threads both compute with and the cores they run on, inputs no call finds cached, a
device-wide sync after each call.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any

from kernelflow.verification.child.loading import clone, flatten

__all__ = ["cold_copies", "last_level_cache_bytes", "pin_cores", "set_threads", "synchronize"]

GPU_COLD_BYTES = 256 * 1024 * 1024  # above any GPU's L2
MAX_COPIES = 1024
_CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")
_DEFAULT_LLC_BYTES = 32 * 1024 * 1024


def set_threads(threads: int) -> None:
    """Compute with ``threads`` threads: torch's intra-op pool, and the OpenMP runtime an
    extension links (it reads ``OMP_NUM_THREADS`` when it first starts its pool)."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def pin_cores(cores: list[int]) -> None:
    """Run every thread of this process (and those it starts later) on ``cores`` only: the
    verifier's core set, the same for the judge and the candidate's process. Nothing to
    do for an empty list, or where the machine refuses (not Linux, cores gone)."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    try:
        threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):  # a thread that just ended; a core not ours
            os.sched_setaffinity(tid, cores)


def last_level_cache_bytes() -> int:
    """The size of the CPU's largest cache, as Linux reports it (32 MiB where it does not)."""
    sizes = []
    for index in _CPU_CACHES.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=_DEFAULT_LLC_BYTES)


def cold_copies(inputs: list[Any], device: str) -> list[list[Any]]:
    """``inputs`` and copies of them, as many as together outgrow the caches a call could
    find them in (the L2 of a GPU, twice the last-level cache of a CPU): timed calls take
    them in turn, so none finds its inputs cached by the call before, and no cache flush
    adds its own time to theirs."""
    import torch

    size = sum(t.nbytes for _, t in flatten(inputs, "x") if isinstance(t, torch.Tensor))
    target = GPU_COLD_BYTES if device == "cuda" else 2 * last_level_cache_bytes()
    copies = max(1, min(MAX_COPIES, math.ceil(target / max(size, 1))))
    return [inputs, *(clone(inputs) for _ in range(copies - 1))]


def synchronize(device: str) -> None:
    """Wait for everything queued on ``device`` (device-wide on a GPU: side-stream work
    counts); nothing to wait for on the CPU."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
