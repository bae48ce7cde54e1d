"""Timing a candidate against its baseline on the GPU, by the judge: eager PyTorch (or
``torch.compile`` of the reference) in the judge's process and the candidate in its own,
in interleaved rounds, warm-up, an L2 flush before every call, and flags for speedups too
good to be true. Interpreted Triton on the CPU is never timed.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from kernelflow.verification.child.loading import clone, flatten
from kernelflow.verification.child.remote import RemoteCandidate

__all__ = ["timing_report"]

TIMING_WARMUP = 5
TIMING_REPS = 50
TIMING_ROUNDS = 6
# Checks a batch's outputs against the reference's (raises VerificationFailure).
Check = Callable[[Any], object]
PLAUSIBLE_SPEEDUP = 10.0
CANDIDATE = "candidate"  # the candidate's side among the timed ones
METHOD = (
    "the judge's host clock around batches of calls, a device-wide sync after every call "
    "and a 256 MB L2 flush before it; baseline(s) and candidate interleaved in rounds "
    "(their order turning), after warm-up calls; medians, with 95 % intervals"
)


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


def median_ci95(samples: list[float]) -> list[float]:
    """A distribution-free 95 % confidence interval of the median: the order statistics
    whose ranks the binomial(n, 1/2) distribution gives (for few samples it is wider than
    95 %: with 6 rounds, [min, max] at 97 %)."""
    ordered = sorted(samples)
    n = len(ordered)
    # The largest k with P(Binomial(n, 1/2) < k) <= 2.5 %: the interval is [x_k, x_{n-k+1}].
    k, below = 0, 0.0
    while k < n // 2 and below + math.comb(n, k) / 2**n <= 0.025:
        below += math.comb(n, k) / 2**n
        k += 1
    k = max(k, 1)
    return [ordered[k - 1], ordered[n - k]]


def time_both(
    baselines: dict[str, Any],
    candidate: RemoteCandidate,
    inputs: list[Any],
    reps: int,
    check: Check,
    output_bytes: int,
) -> dict[str, Any]:
    """The baselines (by kind: ``eager``, ``compile``) and the candidate timed in rounds,
    interleaved (the order turns each round), each round a batch of ``reps`` calls with an
    L2 flush and a device-wide sync around every call, by this process's clock: the
    candidate's process runs its batch on request and cannot move the judge's clock. The
    outputs of each of the candidate's batches are checked (``check``)."""
    import torch

    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    base_in = clone(inputs)
    sides = [*baselines, CANDIDATE]
    samples: dict[str, list[float]] = {side: [] for side in sides}
    with torch.no_grad():
        for baseline in baselines.values():
            for _ in range(TIMING_WARMUP):  # torch.compile compiles here, not in a round
                baseline(*base_in)
        candidate.time(inputs, TIMING_WARMUP, "cuda", output_bytes)
        torch.cuda.synchronize()
        for round_ in range(TIMING_ROUNDS):
            shift = round_ % len(sides)
            for side in sides[shift:] + sides[:shift]:
                started = time.perf_counter()
                if side == CANDIDATE:
                    answer = candidate.time(inputs, reps, "cuda", output_bytes)
                    samples[side].append((time.perf_counter() - started) * 1000 / reps)
                    check(answer.outputs)
                    continue
                for _ in range(reps):
                    flush.zero_()  # evict the L2 cache: no call profits from the last
                    baselines[side](*base_in)
                    torch.cuda.synchronize()
                samples[side].append((time.perf_counter() - started) * 1000 / reps)
    return {
        side: {"ms": quantiles(values), "ci95": median_ci95(values)}
        for side, values in samples.items()
    }


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
    kinds = [baseline_kind]
    if job.get("compare_compile") and baseline_kind != "compile":
        kinds.append("compile")  # a second baseline: the speedup over torch.compile too
    baselines = {kind: _baseline(ref, kind) for kind in kinds}
    output_bytes = tensor_bytes(expected)
    stats = time_both(baselines, cand, inputs, reps, check, output_bytes)
    flags: list[str] = []
    speedup = _speedup(stats, baseline_kind)
    moved = tensor_bytes(inputs) + tensor_bytes(expected)
    bandwidth = copy_bandwidth_gbs()
    implied = moved / (stats[CANDIDATE]["ms"]["median"] / 1000) / 1e9
    suspicious = speedup > PLAUSIBLE_SPEEDUP or implied > 1.5 * bandwidth
    if suspicious:
        reps *= 4
        stats = time_both(baselines, cand, inputs, reps, check, output_bytes)
        speedup = _speedup(stats, baseline_kind)
        implied = moved / (stats[CANDIDATE]["ms"]["median"] / 1000) / 1e9
        if speedup > PLAUSIBLE_SPEEDUP:
            flags.append(f"implausible speedup {speedup:.1f}x (> {PLAUSIBLE_SPEEDUP:g}x): re-timed")
        if implied > 1.5 * bandwidth:
            flags.append(
                f"candidate moves its inputs and outputs at {implied:.0f} GB/s, above the "
                f"device's measured copy bandwidth ({bandwidth:.0f} GB/s)"
            )
    return speedup, {
        "candidate_ms": stats[CANDIDATE]["ms"],
        "candidate_ci_ms": stats[CANDIDATE]["ci95"],
        "baseline_ms": stats[baseline_kind]["ms"],
        "baseline_ci_ms": stats[baseline_kind]["ci95"],
        "baseline": baseline_kind,
        "speedups": {kind: _speedup(stats, kind) for kind in kinds},
        "reps": reps,
        "rounds": TIMING_ROUNDS,
        "warmup": TIMING_WARMUP,
        "flags": flags,
        "method": METHOD,
    }


def _baseline(ref: Any, kind: str) -> Any:
    if kind == "compile":
        import torch

        return torch.compile(ref)
    return ref


def _speedup(stats: dict[str, Any], kind: str) -> float:
    return float(stats[kind]["ms"]["median"] / max(stats[CANDIDATE]["ms"]["median"], 1e-9))
