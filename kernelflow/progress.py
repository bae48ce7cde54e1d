"""How far a long read of the log got, on one terminal line: the position, the rate and
the time left. Reading a million events takes a minute or more; without this a user
cannot tell a slow export from a stuck one.

Shown on stderr only when stderr is a terminal (see ``for_terminal``), so that output
that is piped or logged stays clean; the line is redrawn at most every ``every_s`` and
erased when the phase ends, leaving the command's own output as it would be without it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TextIO

# Carriage return + "erase to the end of the line": redraw in place.
_REDRAW = "\r\x1b[K"


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class ProgressLine:
    def __init__(
        self,
        stream: TextIO,
        *,
        every_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream, self.every_s, self.clock = stream, every_s, clock

    @contextlib.contextmanager
    def phase(self, label: str, last: int, unit: str = "event") -> Iterator[Callable[[int], None]]:
        """A read of positions up to ``last`` (of ``unit``s); yields ``update(position)``,
        which is cheap enough to call for every event and redraws the line when it is due."""
        started = self.clock()
        first: int | None = None
        next_draw = started  # the first update draws, so that a phase is always shown

        def update(position: int) -> None:
            nonlocal first, next_draw
            now = self.clock()
            if first is None:
                first = position
            if now < next_draw:
                return
            next_draw = now + self.every_s
            rate = (position - first) / max(now - started, 1e-9)
            self._draw(label, unit, position, last, rate)

        try:
            yield update
        finally:
            self.stream.write(_REDRAW)
            self.stream.flush()

    def _draw(self, label: str, unit: str, position: int, last: int, rate: float) -> None:
        text = f"{label}: {unit} {position:,} of {last:,}"
        if last > 0:
            text += f" ({min(position, last) / last:.0%})"
        if rate > 0:
            text += f", {rate:,.0f} {unit}s/s"
            if position < last:
                text += f", about {_duration((last - position) / rate)} left"
        self.stream.write(_REDRAW + text)
        self.stream.flush()


@contextlib.contextmanager
def phase_of(
    progress: ProgressLine | None, label: str, last: int, unit: str = "event"
) -> Iterator[Callable[[int], None]]:
    """``progress.phase(label, last, unit)``, or an ``update`` that shows nothing."""
    if progress is None:
        yield lambda _position: None
        return
    with progress.phase(label, last, unit) as update:
        yield update


def for_terminal(stream: TextIO) -> ProgressLine | None:
    """A progress line on ``stream`` if it is a terminal, else None (nothing shown)."""
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        interactive = False
    return ProgressLine(stream) if interactive else None
