"""The EventLog: kernelflow's only source of truth, on NATS JetStream.

Invariants (what every caller may rely on):
- one gap-free sequence per task: event ``seq`` n+1 is only recorded on top of event n;
- an append names the task history it was decided on (``TaskHistory``); if anything was
  appended to the task since, the append is refused with ``AppendConflict`` and the caller
  reloads and decides again (optimistic concurrency on the task's subjects);
- each event has the deterministic ``Nats-Msg-Id`` ``<task_id>:<seq>``, so a re-sent
  publish is recognised by the server and never recorded twice;
- nothing is appended after a task's terminal event but the rewards that score it
  (callers check the fold; see ``kernelflow.projections.task_state`` and
  ``kernelflow.projections.rewards``);
- the events of one append are recorded one after the other, each with the checks above
  (the next one's check needs the stream sequence of the one before), so a crash in the
  middle leaves a history that is merely shorter: its writer's trigger is redelivered and
  the rest is decided again.

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
import itertools
import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from kernelflow.events import subjects
from kernelflow.events.codec import decode_event, encode
from kernelflow.events.model import Command, Event, ends_task
from kernelflow.events.pull import CreditPuller, wait_until_set

# JetStream error code for "wrong last sequence" (the optimistic-concurrency check).
_WRONG_LAST_SEQUENCE = 10071
_FETCH_BATCH = 256  # events a direct get asks for at a time
_READ_BATCH = 512  # events a read asks for at a time (and at most holds)
# How long an append or a read waits for the server's answer (nats-py's default).
_TIMEOUT_S = 5.0
# The server version that answers batched direct gets.
_DIRECT_BATCH_SINCE = (2, 11)
_STATUS = "Status"
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
    last_stream_seq: int = 0  # stream sequence of the task's newest event, 0 for none

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
        after_append: Callable[[Event], None] | None = None,
    ) -> None:
        # Not thread-safe: use one EventLog from one event loop (the bridge's); only
        # ``remembered`` may be called from any thread.
        self._nc = nc
        self._js = nc.jetstream()
        self._settings = settings or StreamSettings()
        self._known: OrderedDict[str, TaskHistory] = OrderedDict()
        self._ended: RecentIds[str] = RecentIds(self._settings.ended_tasks)
        # Called with each event once it is recorded (fault injection in tests).
        self._after_append = after_append
        self._replies = _Replies(nc)
        # Whether the events stream answers batched direct gets (False once it did not).
        self._direct = _server_at_least(nc, _DIRECT_BATCH_SINCE)

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
            history = await self._replies.request(
                subjects.event_subject(stamped),
                encode(stamped),
                _append_headers(stamped, history.last_stream_seq),
                functools.partial(self._recorded, history, stamped, ended),
            )
        return history

    def _recorded(self, before: TaskHistory, event: Event, ended: bool, ack: Msg) -> TaskHistory:
        """The history once the server acknowledged ``event`` on top of ``before``. Run as
        soon as the answer arrives: a delivery of the event that came with it then finds
        the history remembered."""
        seq = _stored_at(event, before.last_stream_seq, ack)
        after = self._remember(TaskHistory(before.task_id, (*before.events, event), seq), ended)
        if self._after_append is not None:
            self._after_append(event)
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

    async def read_task(self, task_id: str, *, direct: bool = True) -> TaskHistory:
        """The task's events, fetching only those after the history remembered for it.

        Read by direct gets where the stream answers them (``direct``), else through an
        ephemeral consumer.
        """
        known = self._known.get(task_id)
        events = list(known.events) if known is not None else []
        last = known.last_stream_seq if known is not None else 0
        new: list[Event] = []
        fetched = await self._read_direct(task_id, last + 1) if direct and self._direct else None
        if fetched is None:
            fetched = [
                item
                async for item in self.read(
                    start_seq=last + 1, subject=subjects.task_events(task_id)
                )
            ]
            if direct:  # the stream is there but did not answer the direct get
                self._direct = False
        for stream_seq, event in fetched:
            new.append(event)
            last = stream_seq
        events.extend(new)
        # A remembered history is known not to have ended: only new events can end it.
        ended = _ended(new) if known is not None else _ended(events)
        return self._remember(TaskHistory(task_id, tuple(events), last), ended)

    async def _read_direct(self, task_id: str, start_seq: int) -> list[tuple[int, Event]] | None:
        """The task's events from ``start_seq`` to the end of the log, by batched direct
        gets (one request per 256 events); None when the stream does not answer them."""
        found: list[tuple[int, Event]] = []
        subject = subjects.task_events(task_id)
        seq = start_seq
        while True:
            request = json.dumps({"seq": seq, "next_by_subj": subject, "batch": _FETCH_BATCH})
            msgs = await self._replies.collect(
                f"$JS.API.DIRECT.GET.{subjects.EVENTS_STREAM}", request.encode()
            )
            end = msgs[-1].headers or {}
            status = end.get(_STATUS)
            if status == "503":  # no responders: a stream without allow_direct, or none
                return None
            if status not in ("204", "404"):
                raise nats.js.errors.APIError(
                    code=int(status or 0), description=str(end.get("Description", ""))
                )
            for msg in msgs[:-1]:
                found.append((int((msg.headers or {})["Nats-Sequence"]), decode_event(msg.data)))
            # End of batch: read on if the server holds more than one batch returns.
            if status == "404" or len(msgs) == 1 or int(end.get("Nats-Num-Pending", 0)) == 0:
                return found
            seq = found[-1][0] + 1

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
                # the stream: read again through a consumer.
                known = await self.read_task(event.task_id, direct=False)
        if known.next_seq == event.seq:
            return self._remember(
                TaskHistory(event.task_id, (*known.events, event), stream_seq), _ended([event])
            )
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
        """Yield ``(stream_seq, event)`` in log order from ``start_seq``.

        Without ``follow`` it stops at the end of the log as it was when reading began;
        with ``follow`` it waits for new events until the caller stops iterating.
        """
        info = await self._js.add_consumer(
            subjects.EVENTS_STREAM,
            api.ConsumerConfig(
                filter_subject=subject,
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=max(1, start_seq),
                ack_policy=api.AckPolicy.NONE,
                mem_storage=True,
                inactive_threshold=30.0,
            ),
        )
        remaining = info.num_pending or 0
        buffered: deque[Msg] = deque()
        arrived = asyncio.Event()

        def deliver(msg: Msg) -> None:
            buffered.append(msg)
            arrived.set()

        def credit() -> int:
            # Ask for the next batch once half of the last one has been taken: the server
            # sends it while the caller works through the rest.
            if len(buffered) >= _READ_BATCH // 2:
                return 0
            wanted = _READ_BATCH - len(buffered)
            return wanted if follow else min(wanted, remaining - len(buffered))

        puller = CreditPuller(
            self._nc, subjects.EVENTS_STREAM, info.name, credit, deliver, expires_s=idle_timeout
        )
        pulling = asyncio.create_task(puller.run())
        try:
            while follow or remaining > 0:
                if not buffered:
                    arrived.clear()
                    await wait_until_set(arrived, idle_timeout)
                    if buffered:
                        continue
                    if pulling.done():
                        pulling.result()  # raises why the pull stopped
                    if follow:
                        continue
                    info = await self._js.consumer_info(subjects.EVENTS_STREAM, info.name)
                    if info.num_pending == 0:
                        break  # events can expire under max_age while we read
                    continue
                msg = buffered.popleft()
                remaining -= 1
                puller.credit_changed()
                yield delivery_of(msg).stream_seq, decode_event(msg.data)
        finally:
            pulling.cancel()
            await asyncio.gather(pulling, return_exceptions=True)
            # Ephemeral consumers expire by themselves; deleting them now keeps the
            # server tidy when many reads happen in a row.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._js.delete_consumer(subjects.EVENTS_STREAM, info.name))


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


def _server_at_least(nc: NATS, version: tuple[int, int]) -> bool:
    server = nc.connected_server_version
    return (server.major, server.minor) >= version


class _PubAck(msgspec.Struct):
    seq: int = 0
    duplicate: bool = False
    error: dict[str, Any] | None = None


_PUB_ACKS = msgspec.json.Decoder(_PubAck)


def _pub_ack(reply: Msg, task_id: str, last: int) -> _PubAck:
    """The server's answer to a publish, or the error it stands for (a conflict when an
    append to ``task_id`` expected its last stream sequence to be ``last``)."""
    if reply.headers and reply.headers.get(_STATUS) == "503":
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


def _give_up(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.set_exception(nats.errors.TimeoutError())


class _Replies:
    """The answers to one EventLog's requests (publish acks, direct gets) on a single
    wildcard inbox subscription: a request costs one publish, a dictionary entry and a
    timer handle (nats-py's ``request`` adds a task, random bytes and JSON dataclasses)."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._subscribing: asyncio.Lock | None = None
        self._waiting: dict[str, Callable[[Msg], None]] = {}
        self._tokens = itertools.count()

    async def _inbox(self) -> str:
        if not self._prefix:
            self._subscribing = self._subscribing or asyncio.Lock()
            async with self._subscribing:
                if not self._prefix:
                    prefix = f"{self._nc.new_inbox()}."
                    await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                    self._prefix = prefix
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        handler = self._waiting.get(msg.subject[len(self._prefix) :])
        if handler is not None:
            handler(msg)

    async def request(
        self, subject: str, payload: bytes, headers: dict[str, str], read: Callable[[Msg], T]
    ) -> T:
        """Publish a request answered by one message; what ``read`` makes of it, run as
        soon as it arrives (what ``read`` raises is raised here)."""
        return await (await self.send(subject, payload, headers, read))

    async def send(
        self, subject: str, payload: bytes, headers: dict[str, str], read: Callable[[Msg], T]
    ) -> asyncio.Future[T]:
        """``request`` without the wait: publish now (in call order) and return the future
        of what ``read`` makes of the answer."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()

        def on_reply(msg: Msg) -> None:
            if answer.done():
                return
            try:
                answer.set_result(read(msg))
            except Exception as exc:
                answer.set_exception(exc)

        await self._send(subject, payload, headers, on_reply, answer)
        return answer

    async def collect(self, subject: str, payload: bytes) -> list[Msg]:
        """Publish a request answered by several messages, the last of them carrying a
        status header (a direct get's end of batch, or its error); all of them."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[Msg]] = loop.create_future()
        got: list[Msg] = []

        def on_reply(msg: Msg) -> None:
            got.append(msg)
            if msg.headers and _STATUS in msg.headers and not answer.done():
                answer.set_result(got)

        await self._send(subject, payload, None, on_reply, answer)
        return await answer

    async def _send(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None,
        on_reply: Callable[[Msg], None],
        answer: asyncio.Future[Any],
    ) -> None:
        """Publish with a reply subject routed to ``on_reply`` until ``answer`` is done
        (answered, timed out, or cancelled with its waiter)."""
        prefix = await self._inbox()
        token = str(next(self._tokens))
        self._waiting[token] = on_reply
        timer = asyncio.get_running_loop().call_later(_TIMEOUT_S, _give_up, answer)

        def forget(_: asyncio.Future[Any]) -> None:
            timer.cancel()
            del self._waiting[token]

        answer.add_done_callback(forget)
        try:
            await self._nc.publish(subject, payload, reply=prefix + token, headers=headers or None)
        except BaseException:
            answer.cancel()
            raise
