"""Timing a candidate against its baseline, by the judge: eager PyTorch (or
``torch.compile`` of the reference) in the judge's process and the candidate in its own,
on the same threads, in interleaved rounds, warm-up, inputs no call finds cached, and
flags for speedups too good to be true. The parent asks
for timing where the backend's kernels have timing meaning (``Backend.timed_on``: Triton
and CUDA on GPUs, C++ on the CPU; interpreted Triton on the CPU never).

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from kernelflow.verification.child.device import cold_copies, synchronize
from kernelflow.verification.child.guards import LastOutputs
from kernelflow.verification.child.loading import clone, flatten
from kernelflow.verification.child.remote import RemoteCandidate

__all__ = ["timing_report"]

TIMING_WARMUP = 5
TIMING_REPS = 1000  # the most calls a batch makes
MIN_REPS = 3  # the fewest
BATCH_SECONDS = 0.1  # what a batch's calls add up to, when within those bounds
TIMING_ROUNDS = 6
# Checks a batch's outputs against the reference's (raises VerificationFailure).
Check = Callable[[Any], object]
PLAUSIBLE_SPEEDUP = 10.0
CANDIDATE = "candidate"  # the candidate's side among the timed ones
_ROUNDS = (
    "each call on the next of copies of the inputs that together outgrow {cache} (no "
    "call finds its inputs cached); baseline(s) and candidate interleaved in rounds "
    "(their order turning), after warm-up calls; medians, with 95 % intervals"
)
METHOD = {
    False: "the judge's clock around batches of calls on the CPU, candidate and baseline "
    "on the same threads; " + _ROUNDS.format(cache="twice the last-level cache"),
    True: "the judge's host clock around batches of calls, a device-wide sync after every "
    "call; " + _ROUNDS.format(cache="the L2 (256 MB)"),
}


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
    device: str,
    check: Check,
    output_bytes: int,
    *,
    max_reps: int = TIMING_REPS,
    batch_s: float = BATCH_SECONDS,
) -> dict[str, Any]:
    """The baselines (by kind: ``eager``, ``compile``) and the candidate timed in rounds,
    interleaved (the order turning each round), each round a batch of calls, each call on
    the next copy of the inputs (none finds them cached: :func:`.device.cold_copies`) and
    followed by a device-wide sync, by this process's clock: the candidate's process runs
    its batch on request and cannot move the judge's clock. A batch is as many calls as
    fill ``batch_s`` (from the baseline's warm-up; at least MIN_REPS, at most
    ``max_reps``). The outputs of each candidate batch are checked."""
    import torch

    copies = cold_copies(clone(inputs), device)
    candidate.stage(inputs)
    sides = [*baselines, CANDIDATE]
    samples: dict[str, list[float]] = {side: [] for side in sides}
    turn = 0

    def batch(side: str, reps: int) -> float:
        nonlocal turn
        started = time.perf_counter()
        if side == CANDIDATE:
            candidate.time(reps)
        else:
            call, kept = baselines[side], LastOutputs()
            for _ in range(reps):
                turn += 1
                # The candidate's process does this bookkeeping for each call (its
                # outputs must be new memory): here too, so neither side carries more.
                kept.take(call(*copies[turn % len(copies)]))
                synchronize(device)
        return (time.perf_counter() - started) * 1000 / reps

    with torch.no_grad():
        for baseline in baselines.values():
            for _ in range(TIMING_WARMUP):  # torch.compile compiles here, not in a round
                baseline(*copies[0])
        candidate.time(TIMING_WARMUP)
        per_call_ms = batch(next(iter(baselines)), TIMING_WARMUP)
        reps = max(MIN_REPS, min(max_reps, round(batch_s * 1000 / max(per_call_ms, 1e-3))))
        for round_ in range(TIMING_ROUNDS):
            shift = round_ % len(sides)
            for side in sides[shift:] + sides[:shift]:
                samples[side].append(batch(side, reps))
                if side == CANDIDATE:
                    check(candidate.timed_outputs(device, output_bytes).outputs)
    stats: dict[str, Any] = {
        side: {"ms": quantiles(values), "ci95": median_ci95(values)}
        for side, values in samples.items()
    }
    stats["reps"] = reps
    stats["copies"] = len(copies)
    return stats


def copy_bandwidth_gbs(device: str) -> float:
    """Achievable memory bandwidth of ``device`` (GB/s), measured with a large copy."""
    import torch

    n = 128 * 1024 * 1024 // 4
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    synchronize(device)
    started = time.perf_counter()
    for _ in range(5):
        b.copy_(a)
    synchronize(device)
    seconds = (time.perf_counter() - started) / 5
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
    notes: list[str],
) -> tuple[float | None, dict[str, Any]]:
    """Speedup over eager (or torch.compile) PyTorch, with plausibility flags: a speedup
    above 10x, or a candidate moving its bytes faster than the device's copy bandwidth,
    is re-timed with batches four times as long and flagged. ``notes``: where what was
    asked could not be timed, for the report."""
    import torch

    device = str(job.get("device") or "cpu")
    max_reps = int(job.get("timing_reps", TIMING_REPS))
    baseline_kind = str(job.get("baseline", "eager"))
    kinds = [baseline_kind]
    if job.get("compare_compile") and baseline_kind != "compile":
        kinds.append("compile")  # a second baseline: the speedup over torch.compile too
    baselines = {kind: _baseline(ref, kind) for kind in kinds}
    if "compile" in baselines and baseline_kind != "compile":
        # The second baseline is a comparison only: where torch.compile fails here (no
        # compiler for its CPU code, say), the speedup over eager is still measured.
        try:
            with torch.no_grad():
                baselines["compile"](*clone(inputs))
        except Exception as exc:
            del baselines["compile"]
            kinds.remove("compile")
            failed = f"timing: torch.compile of the reference failed, not timed: {exc}"
            notes.append(failed[:400])
    output_bytes = tensor_bytes(expected)
    stats = time_both(baselines, cand, inputs, device, check, output_bytes, max_reps=max_reps)
    flags: list[str] = []
    speedup = _speedup(stats, baseline_kind)
    moved = tensor_bytes(inputs) + tensor_bytes(expected)
    bandwidth = copy_bandwidth_gbs(device)
    implied = moved / (stats[CANDIDATE]["ms"]["median"] / 1000) / 1e9
    if speedup > PLAUSIBLE_SPEEDUP or implied > 1.5 * bandwidth:
        stats = time_both(
            baselines,
            cand,
            inputs,
            device,
            check,
            output_bytes,
            max_reps=4 * max_reps,
            batch_s=4 * BATCH_SECONDS,
        )
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
        "speedup_ci95": _speedup_interval(stats, baseline_kind),
        "reps": stats["reps"],
        "rounds": TIMING_ROUNDS,
        "warmup": TIMING_WARMUP,
        "input_copies": stats["copies"],
        "threads": int(job.get("threads") or 0),
        "flags": flags,
        "method": METHOD[device == "cuda"],
    }


def _baseline(ref: Any, kind: str) -> Any:
    if kind == "compile":
        import torch

        return torch.compile(ref)
    return ref


def _speedup(stats: dict[str, Any], kind: str) -> float:
    return float(stats[kind]["ms"]["median"] / max(stats[CANDIDATE]["ms"]["median"], 1e-9))


def _speedup_interval(stats: dict[str, Any], kind: str) -> list[float]:
    """The speedup's range as the intervals of both medians allow it: the slowest baseline
    over the fastest candidate at most, the fastest over the slowest at least."""
    low_base, high_base = stats[kind]["ci95"]
    low_cand, high_cand = stats[CANDIDATE]["ci95"]
    return [low_base / max(high_cand, 1e-9), high_base / max(low_cand, 1e-9)]
