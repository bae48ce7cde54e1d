"""Messages of the log that are not events of the task their subject names: quarantined.

Anyone allowed to publish on ``kf.ev.>`` can put anything into the append-only log: bytes
that are not JSON, an event of another task, an event out of its task's sequence. A read
that meets one must neither fail (a task whose history cannot be read could be neither
advanced, nor cancelled, nor given up on; a whole-log tool would stop there) nor take it
for an event: it becomes a ``QuarantinedEvent`` placeholder, which projections skip and
readers count and report.

A message is an event of its task only if

- it decodes (``decode_event``: an event of a kind only a newer kernelflow knows does, as
  an ``UnknownEvent``);
- it is on its event's subject (``subjects.event_subject``: its task, its kind, the agent
  of a dispatch), where the EventLog publishes every event (an unknown kind: on
  ``kf.ev.<task>.<kind>`` or below);
- in a read of whole histories, its ``seq`` is the next of its task: 1 for the first
  (where the read starts at the log's beginning, or continues a fold that does), one more
  than the last event read for the others. A repeated seq, a step back or a gap is
  quarantined: each place in a task's sequence belongs to the first message that takes
  it. (A read of some kinds of events only quarantines repeats and steps back.)

A placeholder takes no place in its task's sequence (``seq`` 0: appends number events as
if it were not there), but it is the task's newest message for JetStream's concurrency
check of the next append, like any message on the task's subjects: a task's history
(``TaskHistory.last_stream_seq``) therefore counts every message read on its subjects,
quarantined or not, and the append after garbage names the garbage's stream sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernelflow.events import subjects
from kernelflow.events.codec import decode_event
from kernelflow.events.model import Event, QuarantinedEvent, UnknownEvent

# Bytes of a quarantined message kept as evidence, characters of the reason; placeholders
# are remembered with the histories of unfinished tasks, and written to exports.
EVIDENCE_BYTES = 256
_REASON_CHARS = 300
# Placeholders a tally keeps (it counts the rest): a flood must not fill the memory.
KEPT = 16
# A task's last seq before a read: None where the read may start within its history.
LastSeq = Callable[[str], int | None]


def quarantined(subject: str, data: bytes, stream_seq: int, reason: str) -> QuarantinedEvent:
    """The placeholder of a message that is not an event of its task, and why."""
    return QuarantinedEvent(
        task_id=subjects.task_of(subject),
        subject=subject,
        stream_seq=stream_seq,
        reason=reason[:_REASON_CHARS],
        size=len(data),
        evidence=bytes(data[:EVIDENCE_BYTES]),
    )


def placed(subject: str, data: bytes, stream_seq: int) -> Event:
    """The event a message of the log is, or its placeholder where it is not an event
    recorded on its own subject (its place in the sequence is ``HistoryCheck``'s to
    judge)."""
    try:
        event = decode_event(data)
    except Exception as exc:  # an upcaster's failure too: nothing a read should die of
        return quarantined(subject, data, stream_seq, str(exc) or type(exc).__name__)
    if not _on_its_subject(event, subject):
        return quarantined(
            subject,
            data,
            stream_seq,
            f"{event.kind} event {event.event_id} on another subject than its own",
        )
    return event


def _on_its_subject(event: Event, subject: str) -> bool:
    if type(event) is UnknownEvent:
        own = f"{subjects.EVENTS_ROOT}.{event.task_id}.{event.kind}"
        return subject == own or subject.startswith(own + ".")
    return subject == subjects.event_subject(event)


class HistoryCheck:
    """Places the messages of one read, in stream order, in their tasks' histories
    (``placed``, then the sequence rule of the module's doc).

    ``last_seq``: a fold the read continues, which holds every event before the read and
    applies each one this check passes: a task's last seq there (0: none yet). Without it
    the check counts itself, from 0 for every task where the read starts at the log's
    beginning (``from_first``), else from the first event it reads of each. ``whole``:
    the read holds whole histories (the whole log, or one task's), not only some kinds
    of events."""

    def __init__(
        self, last_seq: LastSeq | None = None, *, whole: bool = True, from_first: bool = True
    ) -> None:
        self._seen: dict[str, int] = {}
        self._counting = last_seq is None
        self._last_seq: LastSeq = last_seq or self._counted
        self._whole = whole
        self._from_first = from_first

    def _counted(self, task_id: str) -> int | None:
        return self._seen.get(task_id, 0 if self._from_first else None)

    def place(self, subject: str, data: bytes, stream_seq: int) -> Event:
        event = placed(subject, data, stream_seq)
        if type(event) is QuarantinedEvent:
            return event
        problem = self._out_of_sequence(event.seq, self._last_seq(event.task_id))
        if problem is not None:
            return quarantined(subject, data, stream_seq, f"event {event.event_id}: {problem}")
        if self._counting:
            self._seen[event.task_id] = event.seq
        return event

    def _out_of_sequence(self, seq: int, last: int | None) -> str | None:
        if last is None:
            return None
        if seq <= last:
            return f"seq {seq} after {last} (a repeat, or out of order)"
        if self._whole and seq != last + 1:
            return f"seq {seq} after {last} (a gap)"
        return None


def describe(q: QuarantinedEvent) -> str:
    """One line about a quarantined message."""
    return f"stream seq {q.stream_seq} on {q.subject} ({q.size} bytes): {q.reason}"


@dataclass(frozen=True)
class Quarantine:
    """What reads quarantined: how many messages, and the first ``KEPT`` of them."""

    count: int = 0
    first: tuple[QuarantinedEvent, ...] = ()

    def add(self, q: QuarantinedEvent) -> Quarantine:
        kept = self.first if len(self.first) >= KEPT else (*self.first, q)
        return Quarantine(self.count + 1, kept)

    def note(self, shown: int = 3) -> str | None:
        """A line for stderr (None when nothing was quarantined)."""
        if not self.count:
            return None
        listed = "; ".join(describe(q) for q in self.first[:shown])
        more = f"; and {self.count - shown} more" if self.count > shown else ""
        return (
            f"note: {self.count} message(s) on the log's task subjects are not events of "
            f"their task and were quarantined ({listed}{more})"
        )
