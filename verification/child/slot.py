"""The node's timing slots: verifiers of a node time one at a time (``timing_slots`` of
them at once: ``KF_TIMING_SLOTS``, ``VerifierConfig.timing_slots``; default 1), each
waiting for a slot around its timing phase only. Building, loading and the correctness
trials run side by side as before; two timings on the same cores would each measure the
other's load.

A slot is an ``flock`` on a file in the node's dir for them (``job["timing_lock_dir"]``:
the data dir's ``timing/``), one set of slots per device timed on (the CPU; each GPU:
timings on two GPUs do not share their device). The judge opens the files before it is
confined (its view of the file system may hide that dir) and after the candidate's
process was forked, which so never holds them; the descriptors close on exec. The lock
ends with the judge's process, however that ends. A judge that waited as long as its
job's time limit allows (it keeps what its timing may take) times without a slot, and
says so in the report's notes: the interval rule then judges what that measured.

Child side: stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["SLOT_FILE", "TimingSlot"]

SLOT_FILE = "timing-{group}-{index}.lock"
POLL_S = 0.05


class TimingSlot:
    """One of the node's timing slots, to be held around a timing phase. ``fds``: the
    slot files, open (none: no queue, as with ``timing_slots`` 0); ``deadline``: the
    ``clock`` time after which the judge stops waiting (None: waits as long as it takes)."""

    def __init__(
        self,
        fds: list[int],
        deadline: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.fds = fds
        self.deadline = deadline
        self.clock = clock
        self.sleep = sleep
        self.waited_s = 0.0
        self.holding: int | None = None

    @classmethod
    def open(cls, job: dict[str, Any], started: float) -> TimingSlot:
        """The slots of ``job`` (a timed job's or an analysis's; none for others), its
        files opened now: call before the judge is confined. ``started``: when the job started (the
        ``time.monotonic`` clock); the judge waits until its time limit less what its
        timing may take (twice the extra rounds' budget, and 30 s)."""
        slots = int(job.get("timing_slots", 1))
        directory = str(job.get("timing_lock_dir") or "")
        group = "".join(c for c in str(job.get("timing_slot_group") or "cpu") if c.isalnum())
        timed = bool(job.get("timing")) and not job.get("reference_only")
        if not (timed or job.get("analysis")) or slots < 1 or not directory:
            return cls([])
        fds: list[int] = []
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            for index in range(slots):
                path = os.path.join(directory, SLOT_FILE.format(group=group, index=index))
                fds.append(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        except OSError:
            for fd in fds:
                os.close(fd)
            return cls([])
        timeout = float(job.get("timeout_s") or 0.0)
        reserve = 2 * float(job.get("timing_extra_s") or 0.0) + 30.0
        return cls(fds, started + timeout - reserve if timeout > 0 else None)

    def acquire(self) -> bool:
        """Take a free slot, waiting for one until the deadline; whether one was taken
        (``waited_s``: how long it took)."""
        started = self.clock()
        try:
            while True:
                for fd in self.fds:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue
                    except OSError:
                        return False  # locks do not work there: time without one
                    self.holding = fd
                    return True
                if self.deadline is not None and self.clock() + POLL_S > self.deadline:
                    return False
                self.sleep(POLL_S)
        finally:
            self.waited_s = self.clock() - started

    def release(self) -> None:
        if self.holding is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self.holding, fcntl.LOCK_UN)
            self.holding = None

    @contextlib.contextmanager
    def held(self, notes: list[str]) -> Iterator[None]:
        """A slot held for the block (no slots: nothing to hold); a wait that ran out is
        noted in ``notes``."""
        if not self.fds:
            yield
            return
        if not self.acquire():
            notes.append(
                f"timing: no timing slot of this node came free in {self.waited_s:.0f} s "
                f"({len(self.fds)} slot(s), KF_TIMING_SLOTS): timed beside other timings"
            )
        try:
            yield
        finally:
            self.release()

    def close(self) -> None:
        self.release()
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
