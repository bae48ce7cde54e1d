"""Timing a candidate against its baseline, by the judge: eager PyTorch (or
``torch.compile`` of the reference) in the judge's process and the candidate in its own,
on the same threads and cores, in interleaved rounds, warm-up, inputs no call finds
cached, and flags for speedups too good to be true. The parent asks
for timing where the backend's kernels have timing meaning (``Backend.timed_on``: Triton
and CUDA on GPUs, C++ on the CPU; interpreted Triton on the CPU never).

A speedup is **conclusive** when the range both medians' intervals allow lies on one side
of 1 and spans at most a factor of 2 (:func:`.speedup.speedup_conclusive`).
After :data:`TIMING_ROUNDS` rounds an inconclusive one is measured for more rounds, in
doubling blocks within the job's ``timing_extra_s`` (:func:`run_rounds`); one that stays
inconclusive is reported as such: on a machine others load, a figure whose interval spans
0.03x to 10x is noise.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from kernelflow.verification.child.device import cold_copies, pin_cores, synchronize
from kernelflow.verification.child.guards import LastOutputs
from kernelflow.verification.child.loading import clone, flatten
from kernelflow.verification.child.remote import RemoteCandidate
from kernelflow.verification.child.roofline import (
    Peaks,
    count_flops,
    float_dtype,
    moved_bytes,
    roofline,
)
from kernelflow.verification.child.slot import TimingSlot
from kernelflow.verification.child.speedup import speedup_conclusive

__all__ = ["run_rounds", "speedup_interval", "timing_report"]

TIMING_WARMUP = 5
TIMING_REPS = 1000  # the most calls a batch makes
MIN_REPS = 3  # the fewest
BATCH_SECONDS = 0.1  # what a batch's calls add up to, when within those bounds
TIMING_ROUNDS = 6  # rounds every timing takes
SETTLE_S = 0.01  # the pause before each batch (not timed)
# More rounds, while the speedup is inconclusive: within the job's ``timing_extra_s``
# (VerifierConfig.timing_extra_s) and at most this many rounds in all.
EXTRA_SECONDS = 10.0
MAX_ROUNDS = 60
# An interval that holds 1 and spans at most this factor says "as fast as the baseline":
# more rounds would only narrow it around 1, so none are taken.
EQUAL_SPREAD = 1.1
# Checks a batch's outputs against the reference's (raises VerificationFailure).
Check = Callable[[Any], object]
PLAUSIBLE_SPEEDUP = 10.0
CANDIDATE = "candidate"  # the candidate's side among the timed ones
_ROUNDS = (
    "each call on the next of copies of the inputs that together outgrow {cache} (no "
    "call finds its inputs cached); each batch, the baseline's too, holds one round trip "
    "to the candidate's process; baseline(s) and candidate interleaved in rounds (their "
    "order turning), after warm-up calls, more rounds while the speedup is inconclusive; "
    "medians, with 95 % intervals"
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


def speedup_interval(samples: dict[str, list[float]], kind: str) -> list[float]:
    """The speedup's range as the intervals of both medians allow it: the slowest baseline
    over the fastest candidate at most, the fastest over the slowest at least."""
    low_base, high_base = median_ci95(samples[kind])
    low_cand, high_cand = median_ci95(samples[CANDIDATE])
    return [low_base / max(high_cand, 1e-9), high_base / max(low_cand, 1e-9)]


def _worth_more_rounds(interval: list[float]) -> bool:
    """An inconclusive speedup more rounds may settle: not one that holds 1 within a
    narrow range (the candidate is as fast as the baseline; more rounds narrow it around 1)."""
    if speedup_conclusive(interval):
        return False
    low, high = interval
    return not (low <= 1.0 <= high and high <= EQUAL_SPREAD * low)


def run_rounds(
    sides: list[str],
    batch: Callable[[str], float],
    baseline: str,
    *,
    extra_s: float = EXTRA_SECONDS,
    max_rounds: int = MAX_ROUNDS,
    clock: Callable[[], float] = time.monotonic,
) -> dict[str, list[float]]:
    """Each side's per-call times (``batch(side)``: one batch's, ms) over the rounds:
    TIMING_ROUNDS rounds, interleaved, the order turning each round; then, while the
    speedup over ``baseline`` is inconclusive and more rounds may settle it, as many
    rounds again as were taken (12, 24, 48...: the interval is looked at after each such
    block only, as each look that may stop the timing is one more chance for noise to
    pass for a result), as many of them as fit in what is left of ``extra_s`` (at the
    rounds' pace so far) and within ``max_rounds``. Pure but for ``batch`` and
    ``clock``: tests drive it with given samples."""
    samples: dict[str, list[float]] = {side: [] for side in sides}

    def one_round(index: int) -> None:
        shift = index % len(sides)
        for side in sides[shift:] + sides[:shift]:
            samples[side].append(batch(side))

    started = clock()
    rounds = 0
    while rounds < TIMING_ROUNDS:
        one_round(rounds)
        rounds += 1
    extra_from = clock()
    while rounds < max_rounds and _worth_more_rounds(speedup_interval(samples, baseline)):
        pace = max(clock() - started, 1e-9) / rounds
        fit = int((extra_s - (clock() - extra_from)) / pace)
        block = min(rounds, max_rounds - rounds, fit)
        if block < 1:
            break
        for _ in range(block):
            one_round(rounds)
            rounds += 1
    return samples


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
    extra_s: float = EXTRA_SECONDS,
    max_rounds: int = MAX_ROUNDS,
) -> dict[str, Any]:
    """The baselines (by kind: ``eager``, ``compile``) and the candidate timed in rounds,
    interleaved (the order turning each round), each round a batch of calls, each call on
    the next copy of the inputs (none finds them cached: :func:`.device.cold_copies`) and
    followed by a device-wide sync, by this process's clock: the candidate's process runs
    its batch on request and cannot move the judge's clock. A batch is as many calls as
    fill ``batch_s`` (from the baseline's warm-up; at least MIN_REPS, at most
    ``max_reps``). The outputs of each candidate batch are checked. More rounds while
    the speedup over the first baseline is inconclusive (:func:`run_rounds`)."""
    import torch

    copies = cold_copies(clone(inputs), device)
    candidate.stage(inputs)
    sides = [*baselines, CANDIDATE]
    turn = 0

    def batch(side: str, reps: int) -> float:
        nonlocal turn
        # The side before may leave threads spinning (OpenMP waits actively a while after
        # a parallel region): they settle before this side's clock starts.
        time.sleep(SETTLE_S)
        started = time.perf_counter()
        if side == CANDIDATE:
            candidate.time(reps)
        else:
            # The candidate's batch holds a request's round trip (its process woken, this
            # one woken by the answer: milliseconds where the machine is busy); the
            # baseline's holds one too, so that those waits weigh on neither side.
            candidate.ping()
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

        def checked(side: str) -> float:
            took = batch(side, reps)
            if side == CANDIDATE:
                check(candidate.timed_outputs(device, output_bytes).outputs)
            return took

        first = next(iter(baselines))
        samples = run_rounds(sides, checked, first, extra_s=extra_s, max_rounds=max_rounds)
    stats: dict[str, Any] = {
        side: {"ms": quantiles(values), "ci95": median_ci95(values)}
        for side, values in samples.items()
    }
    stats["intervals"] = {kind: speedup_interval(samples, kind) for kind in baselines}
    stats["reps"] = reps
    stats["rounds"] = len(samples[CANDIDATE])
    stats["copies"] = len(copies)
    return stats


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
    slot: TimingSlot | None = None,
    peaks: Peaks | None = None,
) -> tuple[float | None, dict[str, Any]]:
    """Speedup over eager (or torch.compile) PyTorch, with plausibility flags: a speedup
    above 10x, or a candidate moving its bytes faster than the device's copy bandwidth,
    is re-timed with batches four times as long and flagged. ``notes``: where what was
    asked could not be timed, for the report. ``slot``: the node's timing slot, held
    while the rounds run (verifiers of a node time one at a time: :mod:`.slot`).
    ``peaks``: the machine's peaks (the node's cached ones; what they lack is measured
    here, in the slot)."""
    import torch

    device = str(job.get("device") or "cpu")
    max_reps = int(job.get("timing_reps", TIMING_REPS))
    extra_s = max(0.0, float(job.get("timing_extra_s", EXTRA_SECONDS)))
    max_rounds = max(TIMING_ROUNDS, int(job.get("timing_max_rounds", MAX_ROUNDS)))
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
    flops = count_flops(ref, inputs)
    # Threads the judge started since it pinned itself (torch.compile's) join its cores.
    pin_cores([int(c) for c in job.get("cores") or []])
    slot = slot if slot is not None else TimingSlot([])
    peaks = peaks if peaks is not None else Peaks(job.get("peaks"))
    timed = functools.partial(
        time_both,
        baselines,
        cand,
        inputs,
        device,
        check,
        output_bytes,
        extra_s=extra_s,
        max_rounds=max_rounds,
    )
    with slot.held(notes):
        stats = timed(max_reps=max_reps)
        flags: list[str] = []
        speedup = _speedup(stats, baseline_kind)
        moved = moved_bytes(ref, inputs, expected)
        bandwidth = peaks.bandwidth(device)
        implied = moved / (stats[CANDIDATE]["ms"]["median"] / 1000) / 1e9
        if speedup > PLAUSIBLE_SPEEDUP or implied > 1.5 * bandwidth:
            stats = timed(max_reps=4 * max_reps, batch_s=4 * BATCH_SECONDS)
            speedup = _speedup(stats, baseline_kind)
            implied = moved / (stats[CANDIDATE]["ms"]["median"] / 1000) / 1e9
            if speedup > PLAUSIBLE_SPEEDUP:
                flags.append(
                    f"implausible speedup {speedup:.1f}x (> {PLAUSIBLE_SPEEDUP:g}x): re-timed"
                )
            if implied > 1.5 * bandwidth:
                flags.append(
                    f"candidate moves its inputs and outputs at {implied:.0f} GB/s, above the "
                    f"device's measured copy bandwidth ({bandwidth:.0f} GB/s)"
                )
        # The machine's limit, on the cores the candidate ran on (docs/verifier.md).
        limit = None
        if flops is not None:
            peak = peaks.gflops(device, float_dtype(inputs))
            median_ms = stats[CANDIDATE]["ms"]["median"]
            limit = roofline(flops, moved, bandwidth, peak, median_ms)
    return speedup, {
        "candidate_ms": stats[CANDIDATE]["ms"],
        "candidate_ci_ms": stats[CANDIDATE]["ci95"],
        "baseline_ms": stats[baseline_kind]["ms"],
        "baseline_ci_ms": stats[baseline_kind]["ci95"],
        "baseline": baseline_kind,
        "speedups": {kind: _speedup(stats, kind) for kind in kinds},
        "speedup_ci95": stats["intervals"][baseline_kind],
        "speedup_intervals": stats["intervals"],
        "reps": stats["reps"],
        "rounds": stats["rounds"],
        "warmup": TIMING_WARMUP,
        "input_copies": stats["copies"],
        "threads": int(job.get("threads") or 0),
        "flags": flags,
        "method": METHOD[device == "cuda"],
        "queued_s": round(slot.waited_s, 3),
        "roofline": limit,
    }


def _baseline(ref: Any, kind: str) -> Any:
    if kind == "compile":
        import torch

        return torch.compile(ref)
    return ref


def _speedup(stats: dict[str, Any], kind: str) -> float:
    return float(stats[kind]["ms"]["median"] / max(stats[CANDIDATE]["ms"]["median"], 1e-9))
