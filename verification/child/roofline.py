"""How far a timed candidate is from the machine's limit: the roofline
(docs/verifier.md, "Speed-of-light").

The operator's work is counted from the reference at the task's shapes: its floating-point
operations by torch's FLOP counter (matmuls, convolutions and the other ops it knows; an
elementwise op counts as none, which makes it memory-bound, as it is), and the bytes it
must move at the least: its inputs, its parameters and buffers, and its outputs, each once.
The machine's peaks are the bandwidth of a large copy and the throughput of a square matmul
in the inputs' floating dtype, measured once per node (on the verifier's cores and threads,
in a timing slot) and cached by the parent: the job carries what the node's cache holds
(``job["peaks"]``), and :class:`Peaks` measures only what it lacks, which the judge leaves
in ``WORKDIR/peaks.json`` for the parent to cache. The attainable time is the larger of
work over peak compute and bytes over peak bandwidth; the op is compute-bound when the
first is larger, memory-bound otherwise; the candidate's fraction of speed-of-light is the
attainable time over its median time. The inputs of every timed call are cold copies, so
the bandwidth that bounds them is the memory's; a fraction above 1 means the counts
missed something (an op whose outputs are views of its inputs, say).

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from kernelflow.verification.child.device import synchronize
from kernelflow.verification.child.loading import clone, flatten

PROBE_MATMUL_N = 1024  # the square matmul the compute peak is measured with
PROBE_COPY_BYTES = 128 * 1024 * 1024  # the copy the bandwidth is measured with (each side)
PROBE_REPS = 10  # the best of these: load only ever slows a run (measured once per node)
PEAKS_FILE = "peaks.json"  # what the judge measured, in its work dir, for the parent


def count_flops(ref: Any, inputs: list[Any]) -> float | None:
    """The floating-point operations of one call of the reference (None: torch's counter
    could not follow it)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            ref(*clone(inputs))
        return float(counter.get_total_flops())
    except Exception:  # an op the counter cannot follow: no roofline, not a failed check
        return None


def moved_bytes(ref: Any, inputs: list[Any], outputs: Any) -> int:
    """The bytes one call must read and write at the least: inputs, the reference's
    parameters and buffers, and outputs, each once."""
    import torch

    def nbytes(value: Any) -> int:
        return sum(t.nbytes for _, t in flatten(value, "x") if isinstance(t, torch.Tensor))

    state = 0
    if isinstance(ref, torch.nn.Module):
        state = sum(t.nbytes for t in (*ref.parameters(), *ref.buffers()))
    return nbytes(inputs) + state + nbytes(outputs)


def float_dtype(inputs: list[Any]) -> Any:
    """The floating dtype of the first floating input (float32 without one)."""
    import torch

    for _, t in flatten(inputs, "x"):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.dtype
    return torch.float32


def copy_bandwidth_gbs(device: str) -> float:
    """Achievable memory bandwidth of ``device`` (GB/s): the best of a few large copies
    (bytes read and written)."""
    import torch

    # Written first: the pages of a tensor never written would all read as one zero page.
    a = torch.ones(PROBE_COPY_BYTES // 4, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    synchronize(device)
    best = float("inf")
    for _ in range(PROBE_REPS):
        started = time.perf_counter()
        b.copy_(a)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * a.nbytes / best / 1e9


def peak_gflops(device: str, dtype: Any) -> float:
    """Arithmetic throughput of ``device`` (GFLOP/s) in ``dtype``: the best of a few square
    matmuls."""
    import torch

    n = PROBE_MATMUL_N
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    synchronize(device)
    best = float("inf")
    for _ in range(PROBE_REPS):
        started = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best / 1e9


def dtype_name(dtype: Any) -> str:
    """``torch.float32`` -> ``float32``: how the peaks' cache names a dtype."""
    return str(dtype).removeprefix("torch.")


class Peaks:
    """The machine's peaks for one job: those the node's cache holds (``known``, the job's
    ``peaks``: ``copy_gbs`` and ``matmul_gflops`` by dtype name), the others measured here
    on first use and kept in :attr:`measured` (the same shape) for the parent to cache."""

    def __init__(self, known: dict[str, Any] | None) -> None:
        known = known or {}
        self.copy_gbs: float | None = known.get("copy_gbs")
        self.matmul_gflops: dict[str, float] = dict(known.get("matmul_gflops") or {})
        self.measured: dict[str, Any] = {}

    def bandwidth(self, device: str) -> float:
        if not self.copy_gbs:
            self.copy_gbs = self.measured["copy_gbs"] = copy_bandwidth_gbs(device)
        return float(self.copy_gbs)

    def gflops(self, device: str, dtype: Any) -> float:
        name = dtype_name(dtype)
        if not self.matmul_gflops.get(name):
            self.matmul_gflops[name] = peak_gflops(device, dtype)
            self.measured.setdefault("matmul_gflops", {})[name] = self.matmul_gflops[name]
        return float(self.matmul_gflops[name])

    def note(self) -> str:
        """Where this job's peaks came from, in words (for the report's notes)."""
        if self.measured:
            return "roofline: the machine's peaks were measured by this check (cached for the node)"
        return "roofline: the machine's peaks are the node's cached measurements"

    def leave_for_parent(self, workdir: str | Path) -> None:
        """Write what was measured to ``WORKDIR/peaks.json`` (nothing if nothing was)."""
        if self.measured:  # the parent keeps only finite, positive figures
            Path(workdir, PEAKS_FILE).write_text(json.dumps(self.measured))


def roofline(
    flops: float,
    moved: float,
    peak_gbs: float,
    peak_gflops: float,
    candidate_ms: float | None = None,
) -> dict[str, Any]:
    """The roofline of one op (the module's docstring): what ``TimingStats.roofline``
    records; without ``candidate_ms``, no ``sol_fraction``."""
    compute_s = flops / (peak_gflops * 1e9)
    memory_s = moved / (peak_gbs * 1e9)
    attainable_s = max(compute_s, memory_s)
    found: dict[str, Any] = {
        "flops": flops,
        "bytes": moved,
        "peak_gbs": round(peak_gbs, 3),
        "peak_gflops": round(peak_gflops, 3),
        "attainable_ms": attainable_s * 1000,
        "bound": "compute" if compute_s > memory_s else "memory",
    }
    if candidate_ms is not None and math.isfinite(candidate_ms):
        found["sol_fraction"] = attainable_s * 1000 / max(candidate_ms, 1e-12)
    return found
