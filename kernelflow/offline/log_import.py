"""``kernelflow log import``: a log file's events appended to a live log, refusing a
history that differs from the one already there."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelflow.events.codec import encode
from kernelflow.events.model import QuarantinedEvent
from kernelflow.events.port import AppendConflict, EventLogPort
from kernelflow.offline.files import open_lines
from kernelflow.progress import ProgressLine, phase_of
from kernelflow.projections import logfile


class ImportConflict(Exception):
    pass


# Imported events in flight at most (each is a publish awaiting its acknowledgement), and
# reads of the target's tasks at once.
_IMPORT_WINDOW = 1024
_IMPORT_READS = 64


@dataclass
class ImportResult:
    appended: int = 0
    skipped: int = 0  # already in the target log
    tasks: int = 0
    quarantined: int = 0  # the file's quarantine records, left out


async def import_file(
    log: EventLogPort,
    path: Path,
    summary: logfile.FileSummary,
    progress: ProgressLine | None = None,
) -> ImportResult:
    """Append the file's events to ``log`` in file order. A task already in the target is
    compared event by event with the file: a matching prefix is skipped (so importing
    twice adds nothing), a differing one refuses the whole import before anything is
    written. Each append names the task's last stream sequence, as the EventLog does, so
    a concurrent writer is detected rather than interleaved. Quarantine records (messages
    of the exported log that were not events) are not imported."""
    existing: dict[str, list[bytes]] = {}
    last: dict[str, int] = {}
    reads = asyncio.Semaphore(_IMPORT_READS)
    read_so_far = itertools.count(1)

    async def read(task_id: str, update: Callable[[int], None]) -> None:
        async with reads:
            history = await log.read_task(task_id)
        if history.events:
            existing[task_id] = [encode(e) for e in history.events]
            last[task_id] = history.last_stream_seq
        update(next(read_so_far))

    with phase_of(progress, "reading the target", len(summary.tasks), "task") as update:
        await asyncio.gather(*(read(task_id, update) for task_id in summary.tasks))
    name = str(path)
    with phase_of(progress, "checking", summary.records) as update:
        for pos, event in logfile.read_events(open_lines(path), name=name):
            update(pos)
            have = existing.get(event.task_id)
            if type(event) is QuarantinedEvent or have is None or event.seq > len(have):
                continue
            if have[event.seq - 1] != encode(event):
                raise ImportConflict(
                    f"{path}: task {event.task_id} already exists in the target log with a "
                    f"different history (event {event.event_id} differs); nothing was imported"
                )
    result = ImportResult(tasks=len(summary.tasks), quarantined=summary.quarantined)
    # Sent in file order, so the target stores the file's order. A task's next event names
    # its previous one's stream sequence, so it waits for that answer; other tasks' events
    # go on meanwhile, up to _IMPORT_WINDOW in flight (one at a time took ~0.6 ms each).
    sent: dict[str, asyncio.Future[int]] = {}
    window: deque[asyncio.Future[int]] = deque()
    try:
        with phase_of(progress, "importing", summary.records) as update:
            for pos, event in logfile.read_events(open_lines(path), name=name):
                update(pos)
                if type(event) is QuarantinedEvent:
                    continue
                task_id = event.task_id
                have = existing.get(task_id)
                if have is not None and event.seq <= len(have):
                    result.skipped += 1
                    continue
                if (previous := sent.get(task_id)) is not None:
                    last[task_id] = await previous
                sent[task_id] = await log.send_recorded(event, last.get(task_id, 0))
                window.append(sent[task_id])
                result.appended += 1
                if len(window) > _IMPORT_WINDOW:
                    await window.popleft()
            while window:
                await window.popleft()
    except AppendConflict as exc:
        raise ImportConflict(
            f"a task was written to by someone else during the import ({exc}); import again "
            "to continue"
        ) from exc
    finally:
        for answer in window:  # after a failure: the answers nobody will wait for
            answer.add_done_callback(_retrieved)
    return result


def _retrieved(answer: asyncio.Future[int]) -> None:
    """Mark an answer's outcome seen (asyncio reports exceptions never retrieved)."""
    if not answer.cancelled():
        answer.exception()
