"""Timing a candidate against its baseline on the GPU, by the judge: eager PyTorch (or
``torch.compile`` of the reference) in the judge's process and the candidate in its own,
in interleaved rounds, warm-up, an L2 flush before every call, and flags for speedups too
good to be true. Interpreted Triton on the CPU is never timed.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from kernelflow.actors.verifier.child.loading import clone, flatten
from kernelflow.actors.verifier.child.remote import RemoteCandidate

__all__ = ["timing_report"]

TIMING_WARMUP = 5
TIMING_REPS = 50
TIMING_ROUNDS = 6
# Checks a batch's outputs against the reference's (raises VerificationFailure).
Check = Callable[[Any], object]
PLAUSIBLE_SPEEDUP = 10.0


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p * (len(ordered) - 1))))]

    return {
        "min": ordered[0],
        "p20": q(0.2),
        "median": statistics.median(ordered),
        "p80": q(0.8),
        "mean": statistics.fmean(ordered),
    }


def time_both(
    baseline: Any,
    candidate: RemoteCandidate,
    inputs: list[Any],
    reps: int,
    check: Check,
    output_bytes: int,
) -> dict[str, Any]:
    """Baseline and candidate timed in rounds, interleaved, each round a batch of ``reps``
    calls with an L2 flush and a device-wide sync around every call, by this process's
    clock: the candidate's process runs its batch on request and cannot move the judge's
    clock. The outputs of each of the candidate's batches are checked (``check``)."""
    import torch

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    base_in = clone(inputs)
    with torch.no_grad():
        for _ in range(TIMING_WARMUP):
            baseline(*base_in)
        candidate.time(inputs, TIMING_WARMUP, "cuda", output_bytes)
        torch.cuda.synchronize()
        base_ms: list[float] = []
        cand_ms: list[float] = []
        for round_ in range(TIMING_ROUNDS):
            for side in ("baseline", "candidate") if round_ % 2 == 0 else ("candidate", "baseline"):
                started = time.perf_counter()
                if side == "baseline":
                    for _ in range(reps):
                        flush.zero_()  # evict the L2 cache: no call profits from the last
                        baseline(*base_in)
                        torch.cuda.synchronize()
                    base_ms.append((time.perf_counter() - started) * 1000 / reps)
                else:
                    answer = candidate.time(inputs, reps, "cuda", output_bytes)
                    cand_ms.append((time.perf_counter() - started) * 1000 / reps)
                    check(answer.outputs)
    return {"candidate_ms": quantiles(cand_ms), "baseline_ms": quantiles(base_ms)}


def copy_bandwidth_gbs() -> float:
    """Achievable device memory bandwidth (GB/s), measured with a large copy."""
    import torch

    n = 128 * 1024 * 1024 // 4
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 5
    return 2 * a.nbytes / seconds / 1e9


def tensor_bytes(value: Any) -> int:
    import torch

    return sum(t.nbytes for _, t in flatten(value, "x") if isinstance(t, torch.Tensor))


def timing_report(
    ref: Any,
    cand: RemoteCandidate,
    inputs: list[Any],
    expected: Any,
    job: dict[str, Any],
    check: Check,
) -> tuple[float | None, dict[str, Any]]:
    """Speedup over eager (or torch.compile) PyTorch, with plausibility flags: a speedup
    above 10x, or a candidate moving its bytes faster than the device's copy bandwidth,
    is re-timed with more repetitions and flagged."""
    reps = int(job.get("timing_reps", TIMING_REPS))
    baseline_kind = str(job.get("baseline", "eager"))
    baseline = ref
    if baseline_kind == "compile":
        import torch

        baseline = torch.compile(ref)
    stats = time_both(baseline, cand, inputs, reps, check, tensor_bytes(expected))
    flags: list[str] = []
    speedup = stats["baseline_ms"]["median"] / max(stats["candidate_ms"]["median"], 1e-9)
    moved = tensor_bytes(inputs) + tensor_bytes(expected)
    bandwidth = copy_bandwidth_gbs()
    implied = moved / (stats["candidate_ms"]["median"] / 1000) / 1e9
    suspicious = speedup > PLAUSIBLE_SPEEDUP or implied > 1.5 * bandwidth
    if suspicious:
        stats = time_both(baseline, cand, inputs, reps * 4, check, tensor_bytes(expected))
        speedup = stats["baseline_ms"]["median"] / max(stats["candidate_ms"]["median"], 1e-9)
        implied = moved / (stats["candidate_ms"]["median"] / 1000) / 1e9
        if speedup > PLAUSIBLE_SPEEDUP:
            flags.append(f"implausible speedup {speedup:.1f}x (> {PLAUSIBLE_SPEEDUP:g}x): re-timed")
        if implied > 1.5 * bandwidth:
            flags.append(
                f"candidate moves its inputs and outputs at {implied:.0f} GB/s, above the "
                f"device's measured copy bandwidth ({bandwidth:.0f} GB/s)"
            )
    return speedup, {**stats, "baseline": baseline_kind, "reps": reps, "flags": flags}
