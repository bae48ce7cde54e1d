"""The EventLog: kernelflow's only source of truth, on NATS JetStream.

Invariants (what every caller may rely on):
- one gap-free sequence per task: event ``seq`` n+1 is only recorded on top of event n;
- an append names the task history it was decided on (``TaskHistory``); if anything was
  appended to the task since, the append is refused with ``AppendConflict`` and the caller
  reloads and decides again (optimistic concurrency on the task's subjects);
- each event has the deterministic ``Nats-Msg-Id`` ``<task_id>:<seq>``, so a re-sent
  publish is recognised by the server and never recorded twice;
- nothing is appended after a task's terminal event but the rewards that score it
  (callers check the fold; see ``projections.task_state`` and ``projections.rewards``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

import msgspec
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from events import subjects
from events.codec import decode_event, encode
from events.model import TERMINAL_EVENTS, Command, Event

# JetStream error code for "wrong last sequence" (the optimistic-concurrency check).
_WRONG_LAST_SEQUENCE = 10071
_FETCH_BATCH = 256


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


@dataclass(frozen=True)
class StreamSettings:
    """What the streams promise. See deploy/README.md for what each setting buys.

    replicas: copies of each message in a JetStream cluster (1 on a single server, 3 to
      survive the loss of one node). max_age_s: 0 keeps events forever.
    duplicate_window_s: how long a re-sent publish is recognised by its message id.
    """

    replicas: int = 1
    max_age_s: float = 0.0
    duplicate_window_s: float = 120.0
    # Histories of unfinished tasks kept in memory to save re-reading them.
    remembered_tasks: int = 512


class EventLog:
    def __init__(
        self,
        nc: NATS,
        settings: StreamSettings | None = None,
        after_append: Callable[[Event], None] | None = None,
    ) -> None:
        # Not thread-safe: use one EventLog from one event loop (the bridge's).
        self._nc = nc
        self._js = nc.jetstream()
        self._settings = settings or StreamSettings()
        self._known: OrderedDict[str, TaskHistory] = OrderedDict()
        # Called with each event once it is recorded (fault injection in tests).
        self._after_append = after_append

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

        Events are stamped with their task sequence and time here. Raises AppendConflict
        when the task gained events since ``history`` was read.
        """
        events = list(history.events)
        last = history.last_stream_seq
        for event in new_events:
            if event.task_id != history.task_id:
                raise ValueError(f"event for task {event.task_id} appended to {history.task_id}")
            stamped = msgspec.structs.replace(event, seq=len(events) + 1, at=time.time())
            headers = {
                "Nats-Msg-Id": stamped.event_id,
                "Nats-Expected-Last-Subject-Sequence": str(last),
                "Nats-Expected-Last-Subject-Sequence-Subject": subjects.task_events(
                    history.task_id
                ),
            }
            try:
                ack = await self._js.publish(
                    subjects.event_subject(stamped), encode(stamped), headers=headers
                )
            except nats.js.errors.APIError as exc:
                if exc.err_code == _WRONG_LAST_SEQUENCE:
                    raise AppendConflict(
                        f"task {history.task_id} moved past stream seq {last}"
                    ) from exc
                raise
            if ack.duplicate:
                # Someone (maybe our own earlier attempt) already recorded this position.
                raise AppendConflict(f"event {stamped.event_id} was already recorded")
            events.append(stamped)
            last = ack.seq
            if self._after_append is not None:
                self._after_append(stamped)
        return self._remember(TaskHistory(history.task_id, tuple(events), last))

    async def publish_command(
        self, command: Command, subject: str, headers: dict[str, str] | None = None
    ) -> int:
        ack = await self._js.publish(subject, encode(command), headers=headers)
        return ack.seq

    # ------------------------------------------------------------------ reading

    async def read_task(self, task_id: str) -> TaskHistory:
        """The task's events, fetching only those after the history remembered for it."""
        known = self._known.get(task_id)
        events = list(known.events) if known is not None else []
        last = known.last_stream_seq if known is not None else 0
        async for stream_seq, event in self.read(
            start_seq=last + 1, subject=subjects.task_events(task_id)
        ):
            events.append(event)
            last = stream_seq
        return self._remember(TaskHistory(task_id, tuple(events), last))

    async def history_through(self, event: Event, stream_seq: int) -> TaskHistory:
        """The task's history up to at least ``event`` (just delivered from the stream at
        ``stream_seq``): free when every event before it is remembered."""
        known = self._known.get(event.task_id)
        if known is not None and known.next_seq > event.seq:
            return known  # this process recorded or read the event already
        if known is not None and known.next_seq == event.seq:
            return self._remember(TaskHistory(event.task_id, (*known.events, event), stream_seq))
        return await self.read_task(event.task_id)

    def _remember(self, history: TaskHistory) -> TaskHistory:
        # A remembered history is never wrong, only possibly behind (the log only grows):
        # reads fetch what came after it, and an append decided on a stale one is refused
        # by the concurrency check. Finished tasks are not worth the memory.
        self._known.pop(history.task_id, None)
        if history.events and not _ended(history.events):
            self._known[history.task_id] = history
            if len(self._known) > self._settings.remembered_tasks:
                self._known.popitem(last=False)
        return history

    async def read(
        self,
        start_seq: int = 1,
        subject: str = subjects.ALL_EVENTS,
        *,
        follow: bool = False,
        idle_timeout: float = 1.0,
    ) -> AsyncIterator[tuple[int, Event]]:
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
        sub = await self._js.pull_subscribe_bind(consumer=info.name, stream=subjects.EVENTS_STREAM)
        try:
            while follow or remaining > 0:
                try:
                    batch = min(_FETCH_BATCH, remaining) if not follow else _FETCH_BATCH
                    msgs = await sub.fetch(batch=max(1, batch), timeout=idle_timeout)
                except nats.errors.TimeoutError:
                    if not follow and (await sub.consumer_info()).num_pending == 0:
                        break  # events can expire under max_age while we read
                    continue
                for msg in msgs:
                    remaining -= 1
                    yield _stream_seq(msg), decode_event(msg.data)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            # Ephemeral consumers expire by themselves; deleting them now keeps the
            # server tidy when many reads happen in a row.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._js.delete_consumer(subjects.EVENTS_STREAM, info.name))


def _ended(events: Sequence[Event]) -> bool:
    # Rewards (and the judge's call) follow the end they score: look past them.
    return any(isinstance(event, TERMINAL_EVENTS) for event in reversed(events))


def _stream_seq(msg: Msg) -> int:
    return msg.metadata.sequence.stream
