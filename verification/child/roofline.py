"""How far a timed candidate is from the machine's limit: the roofline
(docs/verifier.md, "Speed-of-light").

The operator's work is counted from the reference at the task's shapes: its floating-point
operations by torch's FLOP counter (matmuls, convolutions and the other ops it knows; an
elementwise op counts as none, which makes it memory-bound, as it is), and the bytes it
must move at the least: its inputs, its parameters and buffers, and its outputs, each once.
The machine's peaks are measured where the candidate was timed, on the same cores, just
after it: the bandwidth of a large copy and the throughput of a square matmul in the
inputs' floating dtype. The attainable time is the larger of work over peak compute and
bytes over peak bandwidth; the op is compute-bound when the first is larger, memory-bound
otherwise; the candidate's fraction of speed-of-light is the attainable time over its
median time. The inputs of every timed call are cold copies, so the bandwidth that bounds
them is the memory's; a fraction above 1 means the counts missed something (an op whose
outputs are views of its inputs, say).

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import time
from typing import Any

from kernelflow.verification.child.device import synchronize
from kernelflow.verification.child.loading import clone, flatten

PROBE_MATMUL_N = 1024  # the square matmul the compute peak is measured with
PROBE_REPS = 3


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


def roofline(
    flops: float, moved: float, peak_gbs: float, peak_gflops: float, candidate_ms: float
) -> dict[str, Any]:
    """The roofline of one op (the module's docstring): what ``TimingStats.roofline``
    records."""
    compute_s = flops / (peak_gflops * 1e9)
    memory_s = moved / (peak_gbs * 1e9)
    attainable_s = max(compute_s, memory_s)
    return {
        "flops": flops,
        "bytes": moved,
        "peak_gbs": round(peak_gbs, 3),
        "peak_gflops": round(peak_gflops, 3),
        "attainable_ms": attainable_s * 1000,
        "bound": "compute" if compute_s > memory_s else "memory",
        "sol_fraction": attainable_s * 1000 / max(candidate_ms, 1e-12),
    }
