"""The EventLog: kernelflow's only source of truth, on NATS JetStream.

Invariants (what every caller may rely on):
- one gap-free sequence per task: event ``seq`` n+1 is only recorded on top of event n;
- an append names the task history it was decided on (``TaskHistory``); if anything was
  appended to the task since, the append is refused with ``AppendConflict`` and the caller
  reloads and decides again (optimistic concurrency on the task's subjects);
- each event has the deterministic ``Nats-Msg-Id`` ``<task_id>:<seq>``, so a re-sent
  publish is recognised by the server and never recorded twice;
- nothing is appended after a task's terminal event but the rewards that score it and
  later checks of its kernel (``KernelReverified``); callers check the fold (see
  ``kernelflow.projections.task_state`` and ``kernelflow.projections.rewards``);
- the events of one append are recorded one after the other, each with the checks above
  (the next one's check needs the stream sequence of the one before), so a crash in the
  middle leaves a history that is merely shorter: its writer's trigger is redelivered and
  the rest is decided again;
- a read never fails on what someone else published on the task's subjects: a message
  that is not one of its events is quarantined (``kernelflow.events.quarantine``): left
  out of the history's events, counted in ``TaskHistory.quarantine``, logged once per
  process, and covered by ``last_stream_seq``, so the next append still goes in.

Cost: each event is one publish and its ack, answered on one reply subscription shared by
every request of the log; reading a task is one batched direct get (nats-server 2.11+)
instead of an ephemeral consumer created and deleted per read. Atomic batch publishes
(nats-server 2.12+) would save the acks between the events of one append, but nats-server
2.15 commits each batch in ~2 ms, one batch at a time: far slower than sequential
publishes under load.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import Command, Event, QuarantinedEvent, ends_task
from kernelflow.events.pull import wait_until_set
from kernelflow.events.quarantine import HistoryCheck, Quarantine, describe
from kernelflow.events.replies import STATUS, Replies
from kernelflow.events.scan import Scanner, Stored

# JetStream error code for "wrong last sequence" (the optimistic-concurrency check).
_WRONG_LAST_SEQUENCE = 10071
_FETCH_BATCH = 256  # events a direct get for one task asks for at a time
_READ_BATCH = 512  # events a read of many tasks asks for at a time
# How long an append waits for its stream to have a leader again, and how often it asks.
_NO_LEADER_S, _NO_LEADER_RETRY_S = 10.0, 0.25
# Quarantined messages this process said it met (by stream sequence), to say it once.
_REPORTED_QUARANTINED = 10_000
_logger = logging.getLogger("kernelflow.eventlog")
T = TypeVar("T")
K = TypeVar("K")


class AppendConflict(Exception):
    """The task's history moved on since it was read: reload it and decide again."""


class StreamMismatch(RuntimeError):
    """An existing stream has a configuration kernelflow cannot work with."""


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
class StreamSettings:
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


class EventLog:
    def __init__(
        self,
        nc: NATS,
        settings: StreamSettings | None = None,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
    ) -> None:
        # Not thread-safe: use one EventLog from one event loop (the bridge's); only
        # ``remembered`` may be called from any thread.
        self._nc = nc
        self._js = nc.jetstream()
        self._settings = settings or StreamSettings()
        self._known: OrderedDict[str, TaskHistory] = OrderedDict()
        self._ended: RecentIds[str] = RecentIds(self._settings.ended_tasks)
        # Called on the loop with each event once it is recorded, and its task's history
        # through it (fault injection in tests, a daemon's metrics and traces): keep it cheap.
        self._after_append = after_append
        self._replies = Replies(nc)
        self.scanner = Scanner(nc, self._replies)
        self._reported: RecentIds[int] = RecentIds(_REPORTED_QUARANTINED)

    @property
    def jetstream(self) -> nats.js.JetStreamContext:
        return self._js

    # ------------------------------------------------------------------ streams

    async def ensure_streams(self) -> None:
        """Create the event and command streams, or check that existing ones fit."""
        s = self._settings
        await self._ensure(
            api.StreamConfig(
                name=subjects.EVENTS_STREAM,
                subjects=[subjects.ALL_EVENTS],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                num_replicas=s.replicas,
                max_age=s.max_age_s,
                duplicate_window=s.duplicate_window_s,
                allow_direct=True,
            )
        )
        await self._ensure(
            api.StreamConfig(
                name=subjects.COMMANDS_STREAM,
                subjects=[subjects.ALL_COMMANDS],
                # A submit waits in the stream until a conductor takes it, even if no
                # daemon is running when it is published.
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
                num_replicas=s.replicas,
                duplicate_window=s.duplicate_window_s,
            )
        )

    async def _ensure(self, wanted: api.StreamConfig) -> None:
        assert wanted.name is not None
        try:
            info = await self._js.stream_info(wanted.name)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(wanted)
            return
        have = info.config
        if have.subjects != wanted.subjects or have.retention != wanted.retention:
            raise StreamMismatch(
                f"stream {wanted.name} exists with subjects={have.subjects} "
                f"retention={have.retention}; kernelflow needs subjects={wanted.subjects} "
                f"retention={wanted.retention}. Delete or rename the existing stream."
            )

    # ------------------------------------------------------------------ writing

    async def append(self, history: TaskHistory, new_events: Sequence[Event]) -> TaskHistory:
        """Record ``new_events`` after ``history``; return the history that includes them.

        Events are stamped here with their task sequence and the time each is published
        (the one before it acknowledged). Raises AppendConflict when the task gained events
        since ``history`` was read (or when these very events were recorded already, by an
        earlier attempt whose answer was lost).
        """
        task_id = history.task_id
        # A remembered history is known not to have ended: only new events can end it.
        ended = self._known.get(task_id) is not history and _ended(history.events)
        for event in new_events:
            if event.task_id != task_id:
                raise ValueError(f"event for task {event.task_id} appended to {task_id}")
            stamped = msgspec.structs.replace(event, seq=history.next_seq, at=time.time())
            ended = ended or ends_task(stamped)
            history = await self._publish_event(
                subjects.event_subject(stamped),
                encode(stamped),
                _append_headers(stamped, history.last_stream_seq),
                functools.partial(self._recorded, history, stamped, ended),
            )
        return history

    async def _publish_event(
        self, subject: str, data: bytes, headers: dict[str, str], read: Callable[[Msg], T]
    ) -> T:
        """Publish an event, again while the stream has no leader (a cluster electing one
        answers "no responders" for a second or two): the event's message id and expected
        sequence make sure it is stored once whatever is retried."""
        deadline = time.monotonic() + _NO_LEADER_S
        while True:
            try:
                return await self._replies.request(subject, data, headers, read)
            except nats.js.errors.NoStreamResponseError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(_NO_LEADER_RETRY_S)

    def _recorded(self, before: TaskHistory, event: Event, ended: bool, ack: Msg) -> TaskHistory:
        """The history once the server acknowledged ``event`` on top of ``before``. Run as
        soon as the answer arrives: a delivery of the event that came with it then finds
        the history remembered."""
        seq = _stored_at(event, before.last_stream_seq, ack)
        after = self._remember(
            TaskHistory(before.task_id, (*before.events, event), seq, before.quarantine), ended
        )
        if self._after_append is not None:
            self._after_append(event, after)
        return after

    async def send_recorded(self, event: Event, after_stream_seq: int) -> asyncio.Future[int]:
        """Publish an event recorded elsewhere (an imported log) as it is, its ``seq`` and
        ``at`` kept, on top of its task's stream sequence ``after_stream_seq`` (0: a new
        task). Sent at once, in call order; the future gives its stream sequence, or raises
        AppendConflict if the task moved on or the event is in the log already. Many may be
        in flight, but a task's next event needs its previous one's sequence."""
        return await self._replies.send(
            subjects.event_subject(event),
            encode(event),
            _append_headers(event, after_stream_seq),
            functools.partial(_stored_at, event, after_stream_seq),
        )

    async def publish_command(
        self, command: Command, subject: str, headers: dict[str, str] | None = None
    ) -> int:
        """Publish a command to its stream; its stream sequence."""
        return await self._replies.request(subject, encode(command), headers or {}, _command_seq)

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
        subject = subjects.task_events(task_id)
        fetched = await self.scanner.all(last + 1, subject, size=_FETCH_BATCH, leader=leader)
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
        """Yield ``(stream_seq, event)`` in log order from ``start_seq``; a message that is
        not an event of its task comes as its ``QuarantinedEvent`` placeholder.

        Without ``follow`` it stops at the end of the log as it was when reading began;
        with ``follow`` it waits for new events (looking again at least every
        ``idle_timeout`` seconds) until the caller stops iterating.
        """
        # Whole histories: the whole log's, or one task's (not some kinds of events only).
        whole = subject in (subjects.ALL_EVENTS, subjects.task_events(subjects.task_of(subject)))
        check = HistoryCheck(whole=whole, from_first=start_seq <= 1)
        if follow:
            reading = self._following(start_seq, subject, idle_timeout)
        else:
            end = (await self._js.stream_info(subjects.EVENTS_STREAM)).state.last_seq
            reading = self.scanner.batches(start_seq, subject, size=_READ_BATCH, through=end)
        async with contextlib.aclosing(reading):
            async for batch in reading:
                for stream_seq, msg_subject, data in batch:
                    yield stream_seq, check.place(msg_subject, data, stream_seq)

    async def _following(
        self, seq: int, subject: str, idle_timeout: float
    ) -> AsyncGenerator[list[Stored], None]:
        """``read``'s batches with ``follow``: those from ``seq`` on, then those recorded
        later, looked for when one is published (a subscription to ``subject``, which only
        wakes the read: the messages are fetched by sequence) or every ``idle_timeout``
        (one published while reconnecting is not seen)."""
        woken = asyncio.Event()

        async def wake(_: Msg) -> None:
            woken.set()

        sub = await self._nc.subscribe(subject, cb=wake)
        try:
            while True:
                woken.clear()
                reading = self.scanner.batches(seq, subject, size=_READ_BATCH)
                async with contextlib.aclosing(reading):
                    async for batch in reading:
                        seq = batch[-1][0] + 1
                        yield batch
                await wait_until_set(woken, idle_timeout)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


def _ended(events: Sequence[Event]) -> bool:
    # Rewards (and the judge's call) follow the end they score: look past them.
    return any(ends_task(event) for event in reversed(events))


class DeliveryInfo(NamedTuple):
    stream_seq: int
    consumer_seq: int
    delivered: int  # times the consumer delivered this message


def delivery_of(msg: Msg) -> DeliveryInfo:
    """Where a message a consumer delivered stands, read from its ack subject
    (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>...``, with
    ``<domain>.<account hash>`` after ``$JS.ACK`` on newer servers). nats-py's
    ``Msg.metadata`` parses every field and builds a datetime: a fifth of a read's time."""
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:
        return DeliveryInfo(int(tokens[5]), int(tokens[6]), int(tokens[4]))
    if len(tokens) >= 11:
        return DeliveryInfo(int(tokens[7]), int(tokens[8]), int(tokens[6]))
    raise ValueError(f"not a JetStream delivery: reply subject {msg.reply!r}")


class _PubAck(msgspec.Struct):
    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_PUB_ACKS = msgspec.json.Decoder(_PubAck)


def _pub_ack(reply: Msg, task_id: str, last: int) -> _PubAck:
    """The server's answer to a publish, or the error it stands for (a conflict when an
    append to ``task_id`` expected its last stream sequence to be ``last``)."""
    if reply.headers and reply.headers.get(STATUS) == "503":
        raise nats.js.errors.NoStreamResponseError
    ack = _PUB_ACKS.decode(reply.data)
    if ack.error is not None:
        try:
            nats.js.errors.APIError.from_error(ack.error)  # raises the error it describes
        except nats.js.errors.APIError as exc:
            if exc.err_code == _WRONG_LAST_SEQUENCE:
                raise AppendConflict(f"task {task_id} moved past stream seq {last}") from exc
            raise
    return ack


def _append_headers(event: Event, after_stream_seq: int) -> dict[str, str]:
    """What makes JetStream store ``event`` only right after stream sequence
    ``after_stream_seq`` of its task (0: the task's first event), and only once."""
    return {
        "Nats-Msg-Id": event.event_id,
        "Nats-Expected-Last-Subject-Sequence": str(after_stream_seq),
        "Nats-Expected-Last-Subject-Sequence-Subject": subjects.task_events(event.task_id),
    }


def _stored_at(event: Event, after_stream_seq: int, ack: Msg) -> int:
    """The stream sequence ``event`` was stored at, from the server's answer to its
    publish with ``_append_headers``; AppendConflict if the task had moved on, or if
    someone (maybe an earlier attempt of ours) already recorded the event."""
    answer = _pub_ack(ack, event.task_id, after_stream_seq)
    if answer.duplicate:
        raise AppendConflict(f"event {event.event_id} was already recorded")
    return answer.seq


def _command_seq(reply: Msg) -> int:
    return _pub_ack(reply, "", 0).seq
