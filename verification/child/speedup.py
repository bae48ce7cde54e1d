"""Whether a measured speedup says anything, and how it reads: the rule the judge applies
to the range both medians' 95 % intervals allow (:mod:`.timing`), and the words a
summary gives it.

Child side: stdlib only.
"""

from __future__ import annotations

import math

__all__ = ["BUSY_SPREAD", "MAX_SPREAD", "speedup_conclusive", "speedup_words"]

# A speedup is conclusive when its interval excludes 1 and high / low is at most this.
MAX_SPREAD = 2.0
# An inconclusive interval wider than this reads as the machine's noise; a narrower one
# that holds 1, as no difference the timing can tell.
BUSY_SPREAD = 1.5


def speedup_conclusive(interval: list[float] | tuple[float, ...] | None) -> bool | None:
    """Whether a speedup whose 95 % range is ``interval`` ([low, high]) says which side of
    the baseline the candidate is on, and roughly by how much: the range excludes 1 and
    spans at most a factor of MAX_SPREAD (high / low). None: no interval (not timed).

    (``kernelflow.projections.speedups.interval_conclusive`` is the same rule on the
    parent's side, for reports recorded before the flag was: tests hold them equal.)"""
    if not interval or len(interval) != 2:
        return None
    low, high = float(interval[0]), float(interval[1])
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 or high < low:
        return False
    return (low > 1.0 or high < 1.0) and high <= MAX_SPREAD * low


def speedup_words(speedup: float, interval: list[float] | None, conclusive: bool | None) -> str:
    """How a speedup reads in a summary: ``1.70x``, or, inconclusive, ``inconclusive
    (between 0.03x and 10.57x): the machine was busy`` (a narrow interval around 1:
    ``...: no measurable difference from the baseline``)."""
    if conclusive is not False or not interval:
        return f"{speedup:.2f}x"
    low, high = interval
    why = (
        "the machine was busy"
        if low <= 0 or high > BUSY_SPREAD * low
        else "no measurable difference from the baseline"
    )
    return f"inconclusive (between {low:.2f}x and {high:.2f}x): {why}"
