"""Whether a recorded speedup counts, and how it reads (pure).

A speedup is **conclusive** when the range its 95 % interval allows
(``TimingStats.speedup_ci95``: both medians' intervals combined) lies on one side of 1
and spans at most a factor of 2 (high / low). The verifier decides it when it times
(``VerificationReport.speedup_conclusive``, after more rounds within its budget:
docs/verifier.md, "Backends and timing"); for reports recorded before the flag was, the same rule is
applied here to the recorded interval (:func:`interval_conclusive`; tests hold it equal
to the judge's ``kernelflow.verification.child.speedup.speedup_conclusive``), and a
report older still, with no interval, counts as it always did.

An inconclusive speedup is not a number: fast_p and geometric means leave it out (and
say how many they left out), the speedup reward credits parity (``speedup@2``), searches
rank it as parity, and every view prints ``inconclusive (between Ax and Bx): the machine
was busy`` instead of it (:func:`speedup_text`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kernelflow.events.model import VerificationReport

__all__ = [
    "BUSY_SPREAD",
    "MAX_SPREAD",
    "counted",
    "inconclusive_note",
    "interval_conclusive",
    "report_conclusive",
    "report_interval",
    "speedup_text",
]

MAX_SPREAD = 2.0  # the widest range (high / low) of a conclusive speedup
BUSY_SPREAD = 1.5  # an inconclusive range wider than this reads as the machine's noise


def interval_conclusive(interval: Sequence[float] | None) -> bool | None:
    """Whether a speedup whose 95 % range is ``interval`` ([low, high]) is conclusive: it
    excludes 1 and spans at most MAX_SPREAD. None: no interval."""
    if not interval or len(interval) != 2:
        return None
    low, high = float(interval[0]), float(interval[1])
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 or high < low:
        return False
    return (low > 1.0 or high < 1.0) and high <= MAX_SPREAD * low


def report_conclusive(report: VerificationReport, baseline: str | None = None) -> bool | None:
    """Whether ``report``'s speedup (over ``baseline``; None: its own baseline) counts:
    its flag, else the rule on its recorded interval, else (recorded before intervals
    were) True. None when it has no such speedup."""
    timing = report.timing
    if baseline is not None and timing is not None and baseline != timing.baseline:
        if baseline not in timing.speedups:
            return None
        recorded = timing.speedup_intervals.get(baseline)
        return True if not recorded else bool(interval_conclusive(recorded))
    if report.speedup is None:
        return None
    if report.speedup_conclusive is not None:
        return report.speedup_conclusive
    interval = timing.speedup_ci95 if timing is not None else []
    return True if not interval else bool(interval_conclusive(interval))


def report_interval(report: VerificationReport) -> tuple[float, ...]:
    """The speedup's recorded 95 % range (empty: none recorded)."""
    timing = report.timing
    return tuple(timing.speedup_ci95) if timing is not None and timing.speedup_ci95 else ()


def counted(speedup: float | None, conclusive: bool | None) -> float | None:
    """The speedup as a figure to count (fast_p, geomeans, rankings): None when there is
    none, or it is inconclusive."""
    return None if speedup is None or conclusive is False else speedup


def speedup_text(
    speedup: float | None,
    interval: Sequence[float] | None = None,
    conclusive: bool | None = None,
    *,
    untimed: str = "-",
) -> str:
    """How a speedup reads: ``1.70x``; inconclusive, ``inconclusive (between 0.03x and
    10.57x): the machine was busy`` (a narrow range around 1: ``...: no measurable
    difference from the baseline``); none, ``untimed``. The judge's summary words it
    the same (``kernelflow.verification.child.speedup.speedup_words``)."""
    if speedup is None:
        return untimed
    if conclusive is not False or not interval:
        return f"{speedup:.2f}x"
    low, high = interval
    why = (
        "the machine was busy"
        if low <= 0 or high > BUSY_SPREAD * low
        else "no measurable difference from the baseline"
    )
    return f"inconclusive (between {low:.2f}x and {high:.2f}x): {why}"


def inconclusive_note(count: int) -> str:
    """What a fast_p or geomean figure adds when it left speedups out: `` (3 inconclusive
    not counted)``, nothing for none."""
    return f" ({count} inconclusive not counted)" if count else ""
