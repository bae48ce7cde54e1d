"""The EventLog: kernelflow's only source of truth, on NATS JetStream.

This is the JetStream adapter of the log's port (``kernelflow.events.port``: the
interface, and what both adapters build on stored messages); the in-memory adapter is
``kernelflow.events.memory``. The names callers import from here (``TaskHistory``,
``AppendConflict``...) are the port's. The command stream beside it has a port of its
own (``kernelflow.events.queue``; on JetStream, ``kernelflow.events.nats_queue``).

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
import functools
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any, NamedTuple, TypeVar

import msgspec
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import Event
from kernelflow.events.port import AppendConflict as AppendConflict
from kernelflow.events.port import EventLogPort as EventLogPort
from kernelflow.events.port import LogInfo, StopWatching, StoredEventLog
from kernelflow.events.port import RecentIds as RecentIds
from kernelflow.events.port import StreamConfig as StreamConfig
from kernelflow.events.port import TaskHistory as TaskHistory
from kernelflow.events.port import numbered_after as numbered_after
from kernelflow.events.replies import STATUS, Replies
from kernelflow.events.scan import Scanner, Stored

# JetStream error code for "wrong last sequence" (the optimistic-concurrency check).
_WRONG_LAST_SEQUENCE = 10071
_FETCH_BATCH = 256  # events a direct get for one task asks for at a time
_READ_BATCH = 512  # events a read of many tasks asks for at a time
# How long an append waits for its stream to have a leader again, and how often it asks.
_NO_LEADER_S, _NO_LEADER_RETRY_S = 10.0, 0.25
T = TypeVar("T")


class StreamMismatch(RuntimeError):
    """An existing stream has a configuration kernelflow cannot work with."""


class EventLog(StoredEventLog):
    """The log on JetStream: the port's adapter for every daemon and tool."""

    def __init__(
        self,
        nc: NATS,
        settings: StreamConfig | None = None,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
    ) -> None:
        # Not thread-safe: use one EventLog from one event loop (the bridge's); only
        # ``remembered`` may be called from any thread.
        super().__init__(settings, after_append)
        self._nc = nc
        self._js = nc.jetstream()
        self._replies = Replies(nc)
        self.scanner = Scanner(nc, self._replies)

    @property
    def jetstream(self) -> nats.js.JetStreamContext:
        """JetStream itself: for this adapter, and for tests and benches about NATS (the
        package asks the port: ``tests/unit/test_architecture.py``)."""
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

    async def _record(self, event: Event, after_stream_seq: int, then: Callable[[int], T]) -> T:
        """Publish ``event`` with the headers that make JetStream store it only on top of
        ``after_stream_seq`` and only once; ``then`` runs as the answer arrives (events
        are published one after the other: the next one's check needs this one's
        sequence)."""

        def stored(ack: Msg) -> T:
            return then(_stored_at(event, after_stream_seq, ack))

        return await self._publish_event(
            subjects.event_subject(event),
            encode(event),
            _append_headers(event, after_stream_seq),
            stored,
        )

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

    async def send_recorded(
        self, event: Event, after_stream_seq: int, *, history_only: bool = False
    ) -> asyncio.Future[int]:
        """Publish an event recorded elsewhere (an imported log) as it is, its ``seq`` and
        ``at`` kept, on top of its task's stream sequence ``after_stream_seq`` (0: a new
        task). Sent at once, in call order; the future gives its stream sequence, or raises
        AppendConflict if the task moved on or the event is in the log already. Many may be
        in flight, but a task's next event needs its previous one's sequence."""
        headers = _append_headers(event, after_stream_seq)
        if history_only:
            headers[subjects.HISTORY_ONLY_HEADER] = "1"
        return await self._replies.send(
            subjects.event_subject(event),
            encode(event),
            headers,
            functools.partial(_stored_at, event, after_stream_seq),
        )

    async def publish_raw(self, subject: str, data: bytes) -> int:
        """Publish ``data`` on ``subject`` of the events stream with no headers, as any
        publisher allowed on ``kf.ev.>`` can; its stream sequence."""
        return (await self._js.publish(subject, data)).seq

    @property
    def max_payload(self) -> int:
        return int(self._nc.max_payload)

    # ------------------------------------------------------------------ reading

    async def end_seq(self) -> int:
        return int((await self._js.stream_info(subjects.EVENTS_STREAM)).state.last_seq)

    async def info(self) -> LogInfo:
        info = await self._js.stream_info(subjects.EVENTS_STREAM)
        return LogInfo(int(info.state.last_seq), str(info.created or ""))

    async def first_seq_at(self, at: float, subject: str = subjects.ALL_EVENTS) -> int | None:
        return await self.scanner.first_seq_at(at, subject)

    async def _fetch(self, seq: int, subject: str, *, leader: bool) -> list[Stored]:
        return await self.scanner.all(seq, subject, size=_FETCH_BATCH, leader=leader)

    def _batches(
        self, seq: int, subject: str, *, through: int | None
    ) -> AsyncGenerator[list[Stored], None]:
        return self.scanner.batches(seq, subject, size=_READ_BATCH, through=through)

    async def watch(self, subject: str, wake: Callable[[], None]) -> StopWatching:
        """A plain subscription to ``subject``: no consumer, and the messages it hears of
        are not read."""

        async def woken(_: Msg) -> None:
            wake()

        sub = await self._nc.subscribe(subject, cb=woken)
        return sub.unsubscribe


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


def published_seq(reply: Msg) -> int:
    """The stream sequence of a message published with no expected sequence (a command),
    from the server's answer; the error it stands for otherwise."""
    return _pub_ack(reply, "", 0).seq
