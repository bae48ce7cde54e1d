"""Failpoints for fault tests.

``KF_FAULT_CRASH_AFTER="TASK:SEQ[,TASK:SEQ...]"`` makes this process kill itself with
SIGKILL right after it appended event SEQ of TASK: a crash between two appends, at a
point chosen deterministically. Off unless the variable is set; never set it in production.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from kernelflow.events.model import Event
from kernelflow.host.settings import SettingsError

ENV = "KF_FAULT_CRASH_AFTER"


def crash_after(spec: str | None) -> Callable[[Event], None] | None:
    if not spec:
        return None
    points = set()
    for item in spec.split(","):
        task_id, _, seq = item.strip().rpartition(":")
        if not task_id or not seq.isdigit():
            raise SettingsError(f"{ENV}: {item!r} is not TASK:SEQ")
        points.add((task_id, int(seq)))

    def maybe_crash(event: Event) -> None:
        if (event.task_id, event.seq) in points:
            os.kill(os.getpid(), signal.SIGKILL)

    return maybe_crash
