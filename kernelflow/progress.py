"""How far a long read of the log got, on one terminal line: the position, the rate and
the time left. Reading a million events takes a minute or more; without this a user
cannot tell a slow export from a stuck one. And what a command waits on, with the time
it has waited, ticking every second (``Ticker``): `run` says so while it starts the
embedded NATS, checks the reference, and waits on each step.

Shown on stderr only when stderr is a terminal (see ``for_terminal``), so that output
that is piped or logged stays clean; the line is redrawn at most every ``every_s`` and
erased when the phase ends, leaving the command's own output as it would be without it.
"""

from __future__ import annotations

import contextlib
import threading
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
    return ProgressLine(stream) if _interactive(stream) else None


def _interactive(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


class Ticker:
    """A status line on a terminal saying what a command is waiting on and for how long,
    redrawn every ``every_s`` (the elapsed time ticks while nothing else happens), erased
    when the command ends; with no stream (not a terminal: ``ticker_for``), it shows
    nothing. ``say`` changes what is waited on; ``above`` writes a line of the
    command's own above it."""

    def __init__(
        self,
        stream: TextIO | None,
        *,
        every_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self._label: str | None = None
        self._since = clock()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Ticker:
        if self.stream is not None:
            self._thread = threading.Thread(target=self._tick, name="kf-ticker", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._erase()

    def say(self, label: str) -> None:
        """Wait on ``label`` from now."""
        with self._lock:
            self._label, self._since = label, self.clock()
            self._draw()

    def above(self, write: Callable[[], None]) -> None:
        """Run ``write`` (which prints a line of the command's) with the line erased."""
        with self._lock:
            self._erase()
            write()
            self._draw()

    def _tick(self) -> None:
        while not self._stopped.wait(self.every_s):
            with self._lock:
                self._draw()

    def _draw(self) -> None:
        if self.stream is None or self._label is None or self._stopped.is_set():
            return
        elapsed = _duration(self.clock() - self._since)
        with contextlib.suppress(OSError, ValueError):  # a terminal gone
            self.stream.write(f"{_REDRAW}{self._label}… {elapsed}")
            self.stream.flush()

    def _erase(self) -> None:
        if self.stream is not None and self._label is not None:
            with contextlib.suppress(OSError, ValueError):
                self.stream.write(_REDRAW)
                self.stream.flush()


def ticker_for(stream: TextIO, shown: bool = True) -> Ticker:
    """A ``Ticker`` on ``stream`` if it is a terminal (and ``shown``), else one that shows
    nothing: output that is piped or logged stays as it was."""
    return Ticker(stream if shown and _interactive(stream) else None)
