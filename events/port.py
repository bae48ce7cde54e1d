"""The event log as a port: what the actors and tools ask of the log, whatever holds it.

Two adapters implement it (as the ``eventsourcing`` library has one recorder interface
and several recorders):

- ``kernelflow.events.log.EventLog`` on NATS JetStream: production, every daemon and tool;
- ``kernelflow.events.memory.MemoryEventLog`` in memory: the same promises in one process,
  for tests of logic that is not about NATS (``kernelflow.actors.memory_bridge`` runs
  actors on it).

Both keep the log's invariants (``kernelflow.events.log`` states them) the same way,
because both hold what JetStream holds: messages (a subject and bytes) numbered by one
stream sequence, appended only where the task's last stream sequence is the one the
append names, and not again under a message id seen within the duplicate window. What is
built on those messages (stamping and appending events one at a time, the histories
remembered, reading a task through ``HistoryCheck``'s quarantine, whole-log and following
reads) is ``StoredEventLog``'s, shared by both adapters; each adapter provides only its
few primitives. ``tests/integration/test_eventlog_contract.py`` runs one contract against both.

The log is one of the ports a bridge holds (``kernelflow.actors.bridge``): beside it are
the command queue (``kernelflow.events.queue``), the durable consumers
(``kernelflow.events.consumers``), the object stores (``kernelflow.events.objects``) and
requests among processes (``kernelflow.events.requests``). Nothing outside ``events/``
(and the bridge, and the host's connection code) reaches NATS but through them.

Nothing here imports NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

from kernelflow.events import subjects
from kernelflow.events.model import Event, QuarantinedEvent, ends_task
from kernelflow.events.quarantine import HistoryCheck, Quarantine, describe

# A message as stored: (stream sequence, subject, data).
Stored = tuple[int, str, bytes]
# What stops a ``watch``: awaited on the log's loop.
StopWatching = Callable[[], Coroutine[Any, Any, None]]
# Quarantined messages this process said it met (by stream sequence), to say it once.
_REPORTED_QUARANTINED = 10_000
_logger = logging.getLogger("kernelflow.eventlog")
T = TypeVar("T")
K = TypeVar("K")


class AppendConflict(Exception):
    """The task's history moved on since it was read: reload it and decide again."""


@dataclass(frozen=True)
class TaskHistory:
    """A task's events as read from the log, and where the next append must go."""

    task_id: str
    events: tuple[Event, ...] = ()
    # Stream sequence of the newest message on the task's subjects (its newest event, or
    # a quarantined message after it), 0 for none: where the next append goes on top of.
    last_stream_seq: int = 0
    # The messages on the task's subjects that are not its events, left out of ``events``.
    quarantine: Quarantine = field(default_factory=Quarantine)

    @property
    def next_seq(self) -> int:
        return len(self.events) + 1


def numbered_after(prior: Sequence[Event], events: Sequence[Event]) -> list[Event]:
    """``events`` numbered and timed as an append after a task's ``prior`` events would
    record them (the append stamps them again, with their publish times): for deciding on
    top of events not recorded yet."""
    first, now = len(prior) + 1, time.time()
    return [msgspec.structs.replace(e, seq=first + i, at=now) for i, e in enumerate(events)]


class RecentIds(Generic[K]):
    """The last ``size`` keys added, for membership tests (the oldest are forgotten).
    Safe from any thread."""

    def __init__(self, size: int) -> None:
        self._lock = threading.Lock()
        self._keys: OrderedDict[K, None] = OrderedDict()
        self._size = size

    def add(self, key: K) -> None:
        with self._lock:
            self._keys[key] = None
            if len(self._keys) > self._size:
                self._keys.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


@dataclass(frozen=True)
class LogInfo:
    """Where the log stands."""

    # The stream sequence of the newest message (0: none yet).
    end_seq: int
    # When the log's stream was made: a log deleted and made again tells itself apart by
    # it (what was folded from the old one does not hold for the new one).
    created: str


@dataclass(frozen=True)
class StreamConfig:
    """What the streams promise (the README's Configuration section says what each buys).

    replicas: copies of each message in a JetStream cluster (1 on a single server, 3 to
      survive the loss of one node). max_age_s: 0 keeps events forever.
    duplicate_window_s: how long a re-sent publish is recognised by its message id.
    """

    replicas: int = 1
    max_age_s: float = 0.0
    duplicate_window_s: float = 120.0
    # Histories of unfinished tasks kept in memory to save re-reading them.
    remembered_tasks: int = 512
    # Ids of tasks seen to end, kept so that work left over for them is dropped unread.
    ended_tasks: int = 100_000


class EventLogPort(ABC):
    """What callers may ask of the event log (``kernelflow.events.log`` states what it
    promises). Not thread-safe: use one log from one event loop (a bridge's); only
    ``remembered``, ``remembered_through``, ``has_ended`` and ``report_quarantined`` may
    be called from any thread."""

    # ------------------------------------------------------------------ writing

    @abstractmethod
    async def append(self, history: TaskHistory, new_events: Sequence[Event]) -> TaskHistory:
        """Record ``new_events`` after ``history``; return the history that includes them.

        Events are stamped here with their task sequence and the time each is recorded.
        Raises AppendConflict when the task gained messages since ``history`` was read (or
        when these very events were recorded already, by an earlier attempt whose answer
        was lost); ValueError for an event of another task."""

    @abstractmethod
    async def send_recorded(
        self, event: Event, after_stream_seq: int, *, history_only: bool = False
    ) -> asyncio.Future[int]:
        """Record an event recorded elsewhere (an imported log, a forked task's copy) as
        it is, its ``seq`` and ``at`` kept, on top of its task's stream sequence
        ``after_stream_seq`` (0: a new task). Sent at once, in call order; the future gives
        its stream sequence, or raises AppendConflict if the task moved on or the event is
        in the log already. ``history_only``: no daemon's consumer works on it
        (``subjects.HISTORY_ONLY_HEADER``)."""

    @abstractmethod
    async def publish_raw(self, subject: str, data: bytes) -> int:
        """Store ``data`` on ``subject`` of the events stream as any publisher allowed on
        ``kf.ev.>`` can, with no check at all; its stream sequence. For tests and tools
        that need a message that is not an event: reads quarantine it."""

    @property
    @abstractmethod
    def max_payload(self) -> int:
        """The largest message the log takes, in bytes (the server's limit): an event
        larger than this can never be recorded. Safe from any thread."""

    # ------------------------------------------------------------------ reading

    @abstractmethod
    def remembered(self, task_id: str) -> TaskHistory | None:
        """The history of an unfinished task this process last recorded or read, if it
        still remembers it (possibly behind the log, never wrong)."""

    @abstractmethod
    def has_ended(self, task_id: str) -> bool:
        """Whether this process has seen the task end (among the last ``ended_tasks``)."""

    @abstractmethod
    def remembered_through(self, event: Event) -> TaskHistory | None:
        """The remembered history of ``event``'s task if it already holds ``event``."""

    @abstractmethod
    async def read_task(self, task_id: str, *, leader: bool = False) -> TaskHistory:
        """The task's events (from the stream's leader with ``leader``: a replica may be a
        little behind); messages that are not its events are quarantined."""

    @abstractmethod
    async def history_through(self, event: Event, stream_seq: int) -> TaskHistory:
        """The task's history up to at least ``event`` (just delivered from the stream at
        ``stream_seq``)."""

    @abstractmethod
    def report_quarantined(self, q: QuarantinedEvent) -> None:
        """Log a quarantined message, once per process."""

    @abstractmethod
    async def end_seq(self) -> int:
        """The stream sequence of the newest message of the log (0: none yet)."""

    @abstractmethod
    async def info(self) -> LogInfo:
        """Where the log ends, and when its stream was made."""

    @abstractmethod
    async def first_seq_at(self, at: float, subject: str = subjects.ALL_EVENTS) -> int | None:
        """The stream sequence of the first message on ``subject`` stored at or after the
        time ``at`` (seconds since the epoch); None when there is none."""

    @abstractmethod
    def read_stored(
        self, start_seq: int = 1, subject: str = subjects.ALL_EVENTS, *, through: int | None = None
    ) -> AsyncGenerator[list[Stored], None]:
        """The messages on ``subject`` as stored (stream sequence, subject, bytes: nothing
        decoded or checked), from ``start_seq`` through stream sequence ``through`` (None:
        to the end of the log), a batch at a time: for folds that place them themselves."""

    @abstractmethod
    async def watch(self, subject: str, wake: Callable[[], None]) -> StopWatching:
        """Call ``wake`` (on this log's loop, with nothing: the messages are read by
        sequence) whenever a message is stored on ``subject`` from now on, until what is
        returned is awaited. A wake-up may be missed (NATS reconnecting): whoever waits
        on one looks again now and then anyway."""

    @abstractmethod
    def read(
        self,
        start_seq: int = 1,
        subject: str = subjects.ALL_EVENTS,
        *,
        follow: bool = False,
        idle_timeout: float = 1.0,
    ) -> AsyncGenerator[tuple[int, Event], None]:
        """Yield ``(stream_seq, event)`` in log order from ``start_seq``; a message that is
        not an event of its task comes as its ``QuarantinedEvent`` placeholder. Without
        ``follow`` it stops at the end of the log as it was when reading began; with
        ``follow`` it waits for new events (looking again at least every
        ``idle_timeout`` seconds) until the caller stops iterating."""


class StoredEventLog(EventLogPort):
    """The port over a stream of stored messages: what both adapters share. An adapter
    provides ``_record`` (store one event only on top of a stream sequence, and only
    once), ``_fetch`` (a subject's messages from a sequence on), ``_batches`` (the same,
    a batch at a time), ``watch`` (a wake-up when one is stored), and what the log says
    of itself (``end_seq``, ``info``, ``first_seq_at``, ``max_payload``)."""

    def __init__(
        self,
        settings: StreamConfig | None = None,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
    ) -> None:
        self._settings = settings or StreamConfig()
        self._known: OrderedDict[str, TaskHistory] = OrderedDict()
        self._ended: RecentIds[str] = RecentIds(self._settings.ended_tasks)
        # Called on the loop with each event once it is recorded, and its task's history
        # through it (fault injection in tests, a daemon's metrics and traces): keep it cheap.
        self._after_append = after_append
        self._reported: RecentIds[int] = RecentIds(_REPORTED_QUARANTINED)

    # ------------------------------------------------------------------ primitives

    @abstractmethod
    async def _record(self, event: Event, after_stream_seq: int, then: Callable[[int], T]) -> T:
        """Store ``event`` on its subject only right after stream sequence
        ``after_stream_seq`` of its task's subjects (0: none yet), and only once (its
        message id is its ``event_id``); what ``then`` makes of its stream sequence, run as
        soon as that is known. AppendConflict when the task moved on, or when the event is
        recorded already."""

    @abstractmethod
    async def _fetch(self, seq: int, subject: str, *, leader: bool) -> list[Stored]:
        """Every message on ``subject`` from stream sequence ``seq`` on."""

    @abstractmethod
    def _batches(
        self, seq: int, subject: str, *, through: int | None
    ) -> AsyncGenerator[list[Stored], None]:
        """The messages on ``subject`` from ``seq`` through stream sequence ``through``
        (None: to the end of the log), a batch at a time."""

    # ------------------------------------------------------------------ writing

    async def append(self, history: TaskHistory, new_events: Sequence[Event]) -> TaskHistory:
        task_id = history.task_id
        # A remembered history is known not to have ended: only new events can end it.
        ended = self._known.get(task_id) is not history and _ended(history.events)
        for event in new_events:
            if event.task_id != task_id:
                raise ValueError(f"event for task {event.task_id} appended to {task_id}")
            stamped = msgspec.structs.replace(event, seq=history.next_seq, at=time.time())
            ended = ended or ends_task(stamped)
            history = await self._record(
                stamped,
                history.last_stream_seq,
                functools.partial(self._recorded, history, stamped, ended),
            )
        return history

    def _recorded(self, before: TaskHistory, event: Event, ended: bool, seq: int) -> TaskHistory:
        """The history once ``event`` is stored at stream sequence ``seq`` on top of
        ``before``. Run as soon as that is known: a delivery of the event that came with
        it then finds the history remembered."""
        after = self._remember(
            TaskHistory(before.task_id, (*before.events, event), seq, before.quarantine), ended
        )
        if self._after_append is not None:
            self._after_append(event, after)
        return after

    # ------------------------------------------------------------------ reading

    def remembered(self, task_id: str) -> TaskHistory | None:
        """The history of an unfinished task this process last recorded or read, if it
        still remembers it (possibly behind the log, never wrong). Safe from any thread:
        it looks up one immutable value."""
        return self._known.get(task_id)

    def has_ended(self, task_id: str) -> bool:
        """Whether this process has seen the task end (read or recorded its terminal
        event, among the last ``ended_tasks`` to end). Nothing is ever dispatched for a
        task after its end, so work still queued for it (a log replayed to a new consumer,
        an imported one) can be dropped without reading it. Safe from any thread."""
        return task_id in self._ended

    def remembered_through(self, event: Event) -> TaskHistory | None:
        """The remembered history of ``event``'s task if it already holds ``event`` (this
        process recorded or read it): no read needed. Safe from any thread."""
        known = self._known.get(event.task_id)
        return known if known is not None and known.next_seq > event.seq else None

    async def read_task(self, task_id: str, *, leader: bool = False) -> TaskHistory:
        """The task's events, fetching only those after the history remembered for it.

        Read from any replica, or from the stream's leader (``leader``: a replica may be a
        little behind). Messages that are not the task's events are quarantined.
        """
        known = self._known.get(task_id)
        before = known or TaskHistory(task_id)
        events = list(before.events)
        last, quarantine = before.last_stream_seq, before.quarantine
        fetched = await self._fetch(last + 1, subjects.task_events(task_id), leader=leader)
        check = HistoryCheck(lambda _: len(events))
        for stream_seq, subject, data in fetched:
            event = check.place(subject, data, stream_seq)
            if type(event) is QuarantinedEvent:
                quarantine = quarantine.add(event)
                self.report_quarantined(event)
            else:
                events.append(event)
            last = stream_seq
        # A remembered history is known not to have ended: only new events can end it.
        ended = _ended(events[len(before.events) :] if known is not None else events)
        return self._remember(TaskHistory(task_id, tuple(events), last, quarantine), ended)

    def report_quarantined(self, q: QuarantinedEvent) -> None:
        """Log a quarantined message, once per process (many reads may meet it)."""
        if q.stream_seq not in self._reported:
            self._reported.add(q.stream_seq)
            _logger.info("quarantined %s", describe(q))

    async def history_through(self, event: Event, stream_seq: int) -> TaskHistory:
        """The task's history up to at least ``event`` (just delivered from the stream at
        ``stream_seq``): free when every event before it is remembered."""
        if (through := self.remembered_through(event)) is not None:
            return through
        known = self._known.get(event.task_id)
        if known is None or known.next_seq < event.seq:
            known = await self.read_task(event.task_id)
            if known.next_seq < event.seq:
                # In a cluster any replica may answer a direct get, one a little behind
                # the stream: ask the leader.
                known = await self.read_task(event.task_id, leader=True)
        if known.next_seq == event.seq:
            history = TaskHistory(
                event.task_id, (*known.events, event), stream_seq, known.quarantine
            )
            return self._remember(history, _ended([event]))
        return known

    def _remember(self, history: TaskHistory, ended: bool) -> TaskHistory:
        # A remembered history is never wrong, only possibly behind (the log only grows):
        # reads fetch what came after it, and an append decided on a stale one is refused
        # by the concurrency check. Finished tasks (``ended``) are not worth the memory.
        self._known.pop(history.task_id, None)
        if history.events and not ended:
            self._known[history.task_id] = history
            if len(self._known) > self._settings.remembered_tasks:
                self._known.popitem(last=False)
        elif ended:
            self._ended.add(history.task_id)
        return history

    async def read(
        self,
        start_seq: int = 1,
        subject: str = subjects.ALL_EVENTS,
        *,
        follow: bool = False,
        idle_timeout: float = 1.0,
    ) -> AsyncGenerator[tuple[int, Event], None]:
        # Whole histories: the whole log's, or one task's (not some kinds of events only).
        whole = subject in (subjects.ALL_EVENTS, subjects.task_events(subjects.task_of(subject)))
        check = HistoryCheck(whole=whole, from_first=start_seq <= 1)
        if follow:
            reading = self._following(start_seq, subject, idle_timeout)
        else:
            reading = self._batches(start_seq, subject, through=await self.end_seq())
        async with contextlib.aclosing(reading):
            async for batch in reading:
                for stream_seq, msg_subject, data in batch:
                    yield stream_seq, check.place(msg_subject, data, stream_seq)

    def read_stored(
        self, start_seq: int = 1, subject: str = subjects.ALL_EVENTS, *, through: int | None = None
    ) -> AsyncGenerator[list[Stored], None]:
        return self._batches(start_seq, subject, through=through)

    async def _following(
        self, seq: int, subject: str, idle_timeout: float
    ) -> AsyncGenerator[list[Stored], None]:
        """``read``'s batches with ``follow``: those from ``seq`` on, then those stored
        later, looked for when one is stored on ``subject`` (``watch``: it only wakes the
        read, the messages are fetched by sequence) or every ``idle_timeout`` (one stored
        while NATS reconnects is not heard of).

        A message can be heard of before it is stored (NATS hands a subscriber its copy as
        the stream queues its own): while fewer messages were found than were heard of,
        the read looks again soon, at doubling intervals up to ``_RECHECK_MAX_S`` (a heard
        append that the log refused is never found: then it waits at the idle pace)."""
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        heard = 0  # messages heard of since the last look began

        def wake() -> None:
            nonlocal heard
            heard += 1
            woken.set()

        stop = await self.watch(subject, wake)
        owed = 0  # heard of, not found yet
        recheck = 0.0
        try:
            while True:
                woken.clear()
                owed, heard = owed + heard, 0
                reading = self._batches(seq, subject, through=None)
                async with contextlib.aclosing(reading):
                    async for batch in reading:
                        seq = batch[-1][0] + 1
                        owed -= len(batch)
                        yield batch
                if owed > 0 and recheck * 2 < _RECHECK_MAX_S:
                    recheck = max(recheck * 2, _RECHECK_FIRST_S)
                else:  # all found, or looked for long enough: the idle pace
                    owed, recheck = 0, 0.0
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that
                # arrives as the wait ends.
                timer = loop.call_later(min(recheck or idle_timeout, idle_timeout), woken.set)
                try:
                    await woken.wait()
                finally:
                    timer.cancel()
        finally:
            with contextlib.suppress(Exception):
                await stop()


# How soon a following read looks again for a message it heard of but did not find, the
# interval doubling up to the last (``EventLogPort._following``).
_RECHECK_FIRST_S = 0.01
_RECHECK_MAX_S = 2.56


def _ended(events: Sequence[Event]) -> bool:
    # Rewards (and the judge's call) follow the end they score: look past them.
    return any(ends_task(event) for event in reversed(events))
