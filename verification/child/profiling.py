"""Per-operator time by torch's profiler, the same in the judge's process (the reference)
and the candidate's (its kernels): docs/verifier.md, "The roofline and profile tools".

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any

from kernelflow.verification.child.device import synchronize

__all__ = ["NVTX_RANGE", "PROFILE_CALLS", "TOP_OPERATORS", "profile_calls"]

PROFILE_CALLS = 10  # calls each side makes under the profiler (after one untimed call)
TOP_OPERATORS = 12
# The range the candidate's profiled calls run in on a GPU: Nsight Compute profiles the
# kernels launched inside it only (kernelflow.verification.nsight).
NVTX_RANGE = "kf_candidate"
# The frames of the profiler, of torch's module machinery and of the verifier's own code,
# and addresses that differ each run, are left out of a table.
_PROFILER_FRAMES = re.compile(
    r"torch/(profiler|autograd/profiler|distributed|nn/modules/module\.py)|verification/child/"
)
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def profile_calls(
    call: Callable[[], Any], device: str, calls: int, *, workdir: str = "", nvtx: str = ""
) -> list[dict[str, Any]]:
    """The operators ``calls`` calls of ``call`` ran (after one untimed call), by self
    time (the device's on a GPU), the most costly first, at most TOP_OPERATORS: each one's
    name (paths under ``workdir`` made relative), self time per call (ms), calls per call,
    and share of the self time. Python functions and C functions called from Python (a
    C++ extension's op) are among them (the profiler's Python tracer). ``nvtx``: on a
    GPU, the NVTX range the profiled calls run in."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    marked: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if device == "cuda":
        activities.append(ProfilerActivity.CUDA)
        if nvtx:
            marked = torch.cuda.nvtx.range(nvtx)
    with torch.no_grad():
        call()
        synchronize(device)
        with profile(activities=activities, with_stack=True) as prof, marked:
            for _ in range(calls):
                call()
            synchronize(device)
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = [
        e for e in prof.key_averages() if not _PROFILER_FRAMES.search(e.key) and getattr(e, key)
    ]
    total = sum(getattr(e, key) for e in events) or 1.0
    prefix = workdir.rstrip("/") + "/" if workdir else "\0"
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    return [
        {
            "name": _ADDRESS.sub("", e.key.replace(prefix, ""))[:120],
            "self_ms": getattr(e, key) / 1000 / calls,
            "calls": e.count / calls,
            "share": getattr(e, key) / total,
        }
        for e in events[:TOP_OPERATORS]
    ]
