"""How a command stops when asked (README.md, "CLI"): the first SIGINT or SIGTERM
(Ctrl-C, a ``timeout`` wrapper, a cancelled CI run) cancels what it started and ends it
within ``STOP_DEADLINE_S``; past that, or at a second signal, it exits at once (130),
whatever NATS or its actors do.

A second signal is counted as the operating system delivers it, not as Python runs the
handlers: two signals that arrive together can have the second's handler run inside the
first's, before the first's handler ran a line of its own (a loaded machine delays the
thread that takes the second), and a count kept by the handlers misses one. So
:func:`interruptible` has the interpreter write each delivered signal to a pipe
(``signal.set_wakeup_fd``), and a watcher thread reads it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import NoReturn

from kernelflow.host.exits import EXIT_INTERRUPTED

__all__ = ["STOP_DEADLINE_S", "StopDeadline", "exit_now", "interruptible"]

# How long a command asked to stop (Ctrl-C, SIGTERM) may take to cancel what it started
# and close its daemon, NATS connection and embedded server (a few seconds, as a rule)
# before it exits at once, as it does at a second signal (README.md, "CLI").
STOP_DEADLINE_S = 15.0

_STOPS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def interruptible(deadline_s: float = STOP_DEADLINE_S) -> Iterator[StopDeadline]:
    """Within the block (in the main thread), the first SIGINT or SIGTERM raises
    KeyboardInterrupt, so that the command cancels what it started and stops, and starts
    its stop's deadline (``StopDeadline``): past it, or at a second signal, the process
    exits at once. Left without a signal, the block restores the handlers it found."""
    read, write = os.pipe()
    os.set_blocking(write, False)  # the interpreter's signal handler never waits on it
    stop = StopDeadline(deadline_s, delivered=read)

    def interrupt(*_: object) -> None:
        stop.asked()
        raise KeyboardInterrupt

    wakeup_before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    before = {sig: signal.signal(sig, interrupt) for sig in _STOPS}
    try:
        yield stop
    finally:
        if not stop.started:
            for sig, handler in before.items():
                signal.signal(sig, handler)
            signal.set_wakeup_fd(wakeup_before)
            os.close(read)
            os.close(write)
        # Asked to stop: the handlers and the pipe stay, so that a signal during the rest
        # of the exit (the interpreter waiting for threads) exits at once too.


class StopDeadline:
    """How long a command's stop may take once it began (``asked``): past
    ``deadline_s``, or asked again, the process exits at once with status 130, saying
    so on stderr (an embedded NATS server this process started stops with it).

    ``delivered``: the read end of the pipe the interpreter writes each delivered signal
    to (:func:`interruptible`); a second SIGINT or SIGTERM read there is a second ask,
    whichever handler Python ran."""

    def __init__(self, deadline_s: float = STOP_DEADLINE_S, delivered: int | None = None) -> None:
        self.deadline_s = deadline_s
        self._delivered = delivered
        self._watcher: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._watcher is not None

    def asked(self) -> None:
        if self._watcher is not None:
            exit_now("asked again to stop: stopping at once")
        self._watcher = threading.Thread(target=self._watch, name="kf-stop", daemon=True)
        self._watcher.start()

    def _watch(self) -> NoReturn:
        ends = time.monotonic() + self.deadline_s
        watched = [] if self._delivered is None else [self._delivered]
        stops = 0
        while (left := ends - time.monotonic()) > 0:
            for fd in select.select(watched, [], [], left)[0]:
                stops += sum(1 for number in os.read(fd, 64) if number in _STOPS)
            if stops > 1:
                exit_now("asked again to stop: stopping at once")
        exit_now(f"the stop took over {self.deadline_s:g}s: stopping at once")


# Held by the thread that ends the process: the second signal's handler (main thread) and
# the stop's watcher can both see the second ask; the one that comes late waits here for
# the other's exit instead of saying it again. Reentrant, for a handler that runs in the
# main thread while that thread is itself exiting.
_EXITING = threading.RLock()
_said = False


def exit_now(why: str) -> NoReturn:
    """End the process now (130), with one line on stderr: written straight to the file
    descriptor, since the thread holding stderr's lock may be the one that is stuck.
    Said once, whichever threads call it."""
    global _said
    with _EXITING:
        if not _said:
            _said = True
            with contextlib.suppress(Exception):
                os.write(sys.stderr.fileno(), f"kernelflow: {why}\n".encode())
        os._exit(EXIT_INTERRUPTED)
