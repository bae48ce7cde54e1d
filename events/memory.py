"""The event log in memory: the second adapter of the log's port (``kernelflow.events.port``),
for tests and tools that need the log's promises but not NATS.

``MemoryStreams`` stands for what a NATS server holds for kernelflow: the events stream
and the command stream. As daemons share one NATS, any number of ``MemoryEventLog``s (each
with the histories its process remembers) may share one ``MemoryStreams``, from any
threads and event loops. It keeps the log's promises the way JetStream keeps them, on the
same messages (a subject and the bytes ``encode`` makes), so that everything built on
them is the port's shared code, the same as on JetStream:

- every message on ``kf.ev.>`` takes the next stream sequence (1, 2, ..., no gaps);
- an append names the last stream sequence on its task's subjects (0: none; JetStream's
  ``Nats-Expected-Last-Subject-Sequence``) and is refused with ``AppendConflict`` if
  anything else is there now, a message that is not an event included;
- a message id (an event's ``event_id``; a command's ``Nats-Msg-Id`` header) stored within
  the last ``StreamConfig.duplicate_window_s`` is not stored again: the publish is
  answered as a duplicate with the first one's sequence, before any expected sequence is
  looked at, as the server does; after the window the id is forgotten;
- anyone may store anything on an event subject (``publish_raw``, or ``MemoryStreams.publish``
  itself): reads quarantine what is not an event of its task exactly as on JetStream (the
  same ``HistoryCheck`` over the same bytes);
- reads go by stream sequence; a following read is woken by each new message on its
  subject (and looks again every ``idle_timeout`` anyway); each message keeps the time
  it was stored (``first_seq_at``) and the headers it was published with (``headers_of``:
  ``subjects.HISTORY_ONLY_HEADER``, for the consumers);
- commands wait in their work queue until settled (``settle_command``); answers to them
  (``MemoryCommandQueue.answer``) reach whoever listens on their inbox
  (``listen_answers``): the command queue's port (``kernelflow.events.queue``) on these
  streams is ``MemoryCommandQueue``.

Not modelled: ``max_age_s`` (nothing expires), replicas (one copy: a read from the leader
is the same read), and payload limits (``max_payload`` is said, not enforced). The durable consumers
of these streams are ``kernelflow.events.memory_consumers``'.

Nothing here imports NATS.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

import msgspec

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import Command, Event
from kernelflow.events.port import (
    AppendConflict,
    LogInfo,
    StopWatching,
    Stored,
    StoredEventLog,
    StreamConfig,
    TaskHistory,
)
from kernelflow.events.queue import CommandQueuePort

_READ_BATCH = 512  # messages a read takes at a time (it lets the loop run in between)
# The window JetStream applies when a stream's is 0.
_DEFAULT_WINDOW_S = 120.0
# nats-server's default largest message.
MAX_PAYLOAD = 1024 * 1024
MSG_ID = "Nats-Msg-Id"
T = TypeVar("T")


class Published(NamedTuple):
    """A publish's answer: where the message is, and whether it was there already."""

    seq: int
    duplicate: bool = False


@dataclass(frozen=True)
class StoredMessage:
    """A message as a stream holds it (a command here; an event as the consumers read it)."""

    seq: int
    subject: str
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


class MemoryStreams:
    """The events stream and the command stream, in memory. Safe from any thread."""

    def __init__(
        self,
        settings: StreamConfig | None = None,
        *,
        clock: Callable[[], float] | None = None,
        max_payload: int = MAX_PAYLOAD,
    ) -> None:
        self.settings = settings or StreamConfig()
        self.max_payload = max_payload
        # When the stream was made (``LogInfo.created``).
        self.created = datetime.now(UTC).isoformat()
        self._window_s = self.settings.duplicate_window_s or _DEFAULT_WINDOW_S
        # What the dedup window is measured on (seconds); tests pass one they can move.
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._events: list[Stored] = []  # the message at stream sequence n is [n - 1]
        self._times: list[float] = []  # when each was stored (seconds since the epoch)
        self._by_task: dict[str, list[int]] = {}  # stream sequences on kf.ev.<task>.>
        self._event_ids: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._commands: OrderedDict[int, StoredMessage] = OrderedDict()
        self._command_ids: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._last_command = 0
        self._headers: dict[int, dict[str, str]] = {}  # of the events published with any
        self._listeners: list[Callable[[Stored], None]] = []
        self._answer_listeners: list[Callable[[str, bytes], None]] = []

    # ------------------------------------------------------------------ events

    def publish(
        self,
        subject: str,
        data: bytes,
        *,
        msg_id: str | None = None,
        expected_last: int | None = None,
        expected_subject: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Published:
        """Store ``data`` (with ``headers``) on ``subject`` (which must be under
        ``kf.ev.``), unless ``msg_id`` was stored within the duplicate window (answered as a
        duplicate), and only if the last message on ``expected_subject`` (default:
        ``subject``) is at stream sequence ``expected_last`` when one is given
        (AppendConflict otherwise)."""
        if not subjects.matches(subjects.ALL_EVENTS, subject) or _wildcard(subject):
            raise ValueError(f"no stream takes {subject!r}")
        with self._lock:
            ids = self._unexpired(self._event_ids)
            if msg_id is not None and msg_id in ids:
                return Published(ids[msg_id][0], duplicate=True)
            if expected_last is not None:
                on = expected_subject or subject
                last = self._last_on(on)
                if last != expected_last:
                    raise AppendConflict(
                        f"the last message on {on} is at stream seq {last}, not {expected_last}"
                    )
            stored = (len(self._events) + 1, subject, bytes(data))
            self._events.append(stored)
            self._times.append(max(time.time(), self._times[-1] if self._times else 0.0))
            if (task := _task_of_subject(subject)) is not None:
                self._by_task.setdefault(task, []).append(stored[0])
            if msg_id is not None:
                ids[msg_id] = (stored[0], self._clock())
            if headers:
                self._headers[stored[0]] = dict(headers)
            listeners = list(self._listeners)
        for listener in listeners:
            listener(stored)
        return Published(stored[0])

    def messages(
        self, seq: int, pattern: str, *, limit: int | None = None, through: int | None = None
    ) -> list[Stored]:
        """The messages on ``pattern`` from stream sequence ``seq`` on (through
        ``through``; at most ``limit`` of them)."""
        found: list[Stored] = []
        with self._lock:
            task = _task_of_pattern(pattern)
            if task is not None:
                seqs = self._by_task.get(task, [])
                candidates = (self._events[s - 1] for s in seqs[bisect.bisect_left(seqs, seq) :])
            else:
                everything = self._events[max(seq, 1) - 1 :]
                candidates = (m for m in everything if subjects.matches(pattern, m[1]))
            for message in candidates:
                if (through is not None and message[0] > through) or len(found) == limit:
                    break
                found.append(message)
        return found

    def held(self, stream: str) -> tuple[int, int, int, int]:
        """What ``stream`` (the events' or the commands') holds now: messages, bytes, the
        first and the last stream sequence (0, 0 when empty)."""
        with self._lock:
            if stream == subjects.EVENTS_STREAM:
                data = [stored[2] for stored in self._events]
                first = 1 if data else 0
                return len(data), sum(map(len, data)), first, len(self._events)
            if stream != subjects.COMMANDS_STREAM:
                raise ValueError(f"no stream {stream!r}")
            seqs = list(self._commands)
            size = sum(len(c.data) for c in self._commands.values())
            return len(seqs), size, seqs[0] if seqs else 0, self._last_command

    def headers_of(self, seq: int) -> dict[str, str]:
        """The headers the event at stream sequence ``seq`` was published with."""
        with self._lock:
            return dict(self._headers.get(seq, {}))

    @property
    def last_seq(self) -> int:
        """The stream sequence of the newest message (0: none yet)."""
        return len(self._events)

    def first_seq_at(self, at: float, pattern: str) -> int | None:
        """The stream sequence of the first message on ``pattern`` stored at or after the
        time ``at`` (seconds since the epoch); None for none."""
        with self._lock:
            start = bisect.bisect_left(self._times, at) + 1
        found = self.messages(start, pattern, limit=1)
        return found[0][0] if found else None

    def listen(self, listener: Callable[[Stored], None]) -> Callable[[], None]:
        """Call ``listener`` with each message stored on either stream from now on (on the
        thread that stores it, once it is stored); what is returned stops that."""
        with self._lock:
            self._listeners.append(listener)

        def stop() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return stop

    def _last_on(self, pattern: str) -> int:
        task = _task_of_pattern(pattern)
        if task is not None:
            return (self._by_task.get(task) or [0])[-1]
        for stored in reversed(self._events):
            if subjects.matches(pattern, stored[1]):
                return stored[0]
        return 0

    def _unexpired(
        self, ids: OrderedDict[str, tuple[int, float]]
    ) -> OrderedDict[str, tuple[int, float]]:
        """``ids`` less those stored longer ago than the duplicate window (oldest first)."""
        now = self._clock()
        while ids and now - next(iter(ids.values()))[1] >= self._window_s:
            ids.popitem(last=False)
        return ids

    # ------------------------------------------------------------------ commands

    def publish_command(
        self, subject: str, data: bytes, headers: dict[str, str] | None = None
    ) -> Published:
        """Queue a command on ``subject`` (under ``kf.cmd.``), once per ``Nats-Msg-Id``
        header within the duplicate window."""
        if not subjects.matches(subjects.ALL_COMMANDS, subject) or _wildcard(subject):
            raise ValueError(f"no stream takes {subject!r}")
        headers = dict(headers or {})
        with self._lock:
            ids = self._unexpired(self._command_ids)
            msg_id = headers.get(MSG_ID)
            if msg_id is not None and msg_id in ids:
                return Published(ids[msg_id][0], duplicate=True)
            self._last_command += 1
            stored = StoredMessage(self._last_command, subject, bytes(data), headers)
            self._commands[stored.seq] = stored
            if msg_id is not None:
                ids[msg_id] = (stored.seq, self._clock())
            listeners = list(self._listeners)
        for listener in listeners:
            listener((stored.seq, stored.subject, stored.data))
        return Published(stored.seq)

    def commands(self, pattern: str = subjects.ALL_COMMANDS) -> list[StoredMessage]:
        """The commands on ``pattern`` not settled yet, oldest first."""
        with self._lock:
            return [c for c in self._commands.values() if subjects.matches(pattern, c.subject)]

    def settle_command(self, seq: int) -> None:
        """The command at ``seq`` was handled: it leaves the work queue."""
        with self._lock:
            self._commands.pop(seq, None)

    def answer(self, reply_to: str, body: bytes) -> None:
        """An answer published on ``reply_to`` (a command's inbox, ``kf.errors``): it
        reaches the listeners of that moment (no stream keeps it)."""
        with self._lock:
            listeners = list(self._answer_listeners)
        for listener in listeners:
            listener(reply_to, body)

    def listen_answers(self, listener: Callable[[str, bytes], None]) -> Callable[[], None]:
        """Call ``listener`` with each answer from now on (on the thread that answers);
        what is returned stops that."""
        with self._lock:
            self._answer_listeners.append(listener)

        def stop() -> None:
            with self._lock, contextlib.suppress(ValueError):
                self._answer_listeners.remove(listener)

        return stop


class MemoryCommandQueue(CommandQueuePort):
    """The command queue on ``MemoryStreams`` (``kernelflow.events.queue``'s port)."""

    def __init__(self, streams: MemoryStreams) -> None:
        self.streams = streams

    async def publish(
        self, command: Command, subject: str, headers: dict[str, str] | None = None
    ) -> int:
        return self.streams.publish_command(subject, encode(command), headers).seq

    async def request(
        self, command: Command, subject: str, timeout_s: float
    ) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[bytes] = loop.create_future()
        inbox = f"_INBOX.{uuid.uuid4().hex}"

        def on_answer(reply_to: str, body: bytes) -> None:  # on the answering thread
            if reply_to == inbox:
                with contextlib.suppress(RuntimeError):  # the asker's loop is closed
                    loop.call_soon_threadsafe(_settle, answered, body)

        stop = self.streams.listen_answers(on_answer)
        try:
            await self.publish(command, subject, {subjects.REPLY_HEADER: inbox})
            try:
                body = await asyncio.wait_for(answered, timeout_s)
            except TimeoutError:
                return None
            answer: dict[str, Any] = msgspec.json.decode(body)
            return answer
        finally:
            stop()

    async def waiting(self, subject: str) -> int:
        return len(self.streams.commands(subject))

    async def oldest(self, subject: str) -> int | None:
        pending = self.streams.commands(subject)
        return pending[0].seq if pending else None

    async def answer(self, reply_to: str, body: bytes) -> None:
        self.streams.answer(reply_to, body)


def _settle(future: asyncio.Future[bytes], body: bytes) -> None:
    if not future.done():
        future.set_result(body)


class MemoryEventLog(StoredEventLog):
    """The log on ``MemoryStreams``: one process's view (the histories it remembers) of
    streams any number of logs may share."""

    def __init__(
        self,
        streams: MemoryStreams | None = None,
        settings: StreamConfig | None = None,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
    ) -> None:
        self.streams = streams or MemoryStreams(settings)
        super().__init__(settings or self.streams.settings, after_append)

    # ------------------------------------------------------------------ writing

    async def _record(self, event: Event, after_stream_seq: int, then: Callable[[int], T]) -> T:
        return then(self._store(event, after_stream_seq))

    def _store(
        self, event: Event, after_stream_seq: int, headers: dict[str, str] | None = None
    ) -> int:
        published = self.streams.publish(
            subjects.event_subject(event),
            encode(event),
            msg_id=event.event_id,
            expected_last=after_stream_seq,
            expected_subject=subjects.task_events(event.task_id),
            headers=headers,
        )
        if published.duplicate:
            raise AppendConflict(f"event {event.event_id} was already recorded")
        return published.seq

    async def send_recorded(
        self, event: Event, after_stream_seq: int, *, history_only: bool = False
    ) -> asyncio.Future[int]:
        answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        headers = {subjects.HISTORY_ONLY_HEADER: "1"} if history_only else None
        try:
            answer.set_result(self._store(event, after_stream_seq, headers))
        except AppendConflict as exc:
            answer.set_exception(exc)
        return answer

    async def publish_raw(self, subject: str, data: bytes) -> int:
        return self.streams.publish(subject, data).seq

    @property
    def max_payload(self) -> int:
        return self.streams.max_payload

    # ------------------------------------------------------------------ reading

    async def end_seq(self) -> int:
        return self.streams.last_seq

    async def info(self) -> LogInfo:
        return LogInfo(self.streams.last_seq, self.streams.created)

    async def first_seq_at(self, at: float, subject: str = subjects.ALL_EVENTS) -> int | None:
        return self.streams.first_seq_at(at, subject)

    async def _fetch(self, seq: int, subject: str, *, leader: bool) -> list[Stored]:
        return self.streams.messages(seq, subject)

    async def _batches(
        self, seq: int, subject: str, *, through: int | None
    ) -> AsyncGenerator[list[Stored], None]:
        while True:
            await asyncio.sleep(0)  # a long read lets the loop run, as one over NATS does
            batch = self.streams.messages(seq, subject, limit=_READ_BATCH, through=through)
            if not batch:
                return
            yield batch
            seq = batch[-1][0] + 1

    async def watch(self, subject: str, wake: Callable[[], None]) -> StopWatching:
        loop = asyncio.get_running_loop()

        def heard(stored: Stored) -> None:  # on the thread that stored it
            if subjects.matches(subject, stored[1]):
                with contextlib.suppress(RuntimeError):  # the watcher's loop is closed
                    loop.call_soon_threadsafe(wake)

        stop = self.streams.listen(heard)

        async def stopping() -> None:
            stop()

        return stopping


def _task_of_subject(subject: str) -> str | None:
    """The task whose ``kf.ev.<task>.>`` takes ``subject``, if one does."""
    if not subject.startswith(subjects.EVENTS_ROOT + "."):
        return None
    tokens = subject.split(".", 3)
    return tokens[2] if len(tokens) == 4 else None


def _task_of_pattern(pattern: str) -> str | None:
    """The task if ``pattern`` is ``kf.ev.<task>.>`` (all of one task's subjects)."""
    task = subjects.task_of(pattern)
    return task if pattern == subjects.task_events(task) and task not in ("*", ">") else None


def _wildcard(subject: str) -> bool:
    """Whether ``subject`` is a pattern (or has an empty token): nothing is published there."""
    return any(token in ("", "*", ">") for token in subject.split("."))
