"""Actors on the in-memory log: a ``Bridge`` for running actors' logic without a nats-server.

``MemoryServer`` stands for one NATS server: the log's streams (``MemoryStreams``, the
port's memory adapter) and core publish/subscribe (``LocalBus``). ``MemoryServer.bridge()``
is a ``Bridge`` on it: the same loop thread, ``call``, ``post`` and ``spawn`` as the NATS
bridge (inherited), with a ``MemoryEventLog`` as its ``log``, a ``MemoryCommandQueue`` as
its ``commands``, a ``MemoryRequests`` as its ``requests`` (the ports' memory adapters) and
a ``LocalNats`` as its ``nc``. Several
bridges on one server are several processes on one NATS: they share the log and the
queue, and each remembers its own histories.

What is published through ``nc`` reaches the subscriptions of every bridge on the server,
and is kept in its ``LocalNats.published`` for a test to read; a publish on an event
subject is stored in the log and one on a command subject queued, as a NATS server's
streams take them. Events the log stores, and the answers to commands (a conductor's
``commands.answer``), reach the subscriptions on their subjects too. (``LocalNats`` goes
once nothing of kernelflow's asks a bridge's ``nc``: docs/architecture.md, "The event log
and its ports".)

Nothing consumes here: there are no durable consumers, acks, redeliveries or pools. The
daemon, the read model and whatever else needs JetStream itself run on a NATS server
(``Bridge``); on this bridge, logic is handed its jobs directly (``Worker.handle`` or
``receive``, ``advance_on_loop``). The daemon never uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

import nats.errors
from nats.aio.msg import Msg

from kernelflow.actors.bridge import Bridge
from kernelflow.events import subjects
from kernelflow.events.log import AppendConflict, StreamSettings, TaskHistory
from kernelflow.events.memory import MSG_ID, MemoryCommandQueue, MemoryEventLog, MemoryStreams
from kernelflow.events.memory_requests import MemoryRequests, RequestBus
from kernelflow.events.model import Event
from kernelflow.events.port import Stored

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

log = logging.getLogger("kernelflow.memory_bridge")
# nats-server's default largest message.
MAX_PAYLOAD = 1024 * 1024
_EXPECTED = "Nats-Expected-Last-Subject-Sequence"
_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"


class LocalSubscription:
    """A subscription of a ``LocalNats``: its messages are handed over on the event loop
    it was made on, to its callback one at a time (as nats-py does), or to ``next_msg``."""

    def __init__(
        self,
        nc: LocalNats,
        subject: str,
        cb: Callable[[Msg], Awaitable[None]] | None,
        max_msgs: int,
    ) -> None:
        self.subject = subject
        self.nc = nc
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Msg] = asyncio.Queue()
        self._left = max_msgs or -1
        self._closed = False
        self._worker = self._loop.create_task(self._run(cb)) if cb is not None else None

    def deliver(self, msg: Msg) -> None:
        """From any thread."""
        with contextlib.suppress(RuntimeError):  # the subscriber's loop is closed
            self._loop.call_soon_threadsafe(self._on_loop, msg)

    def _on_loop(self, msg: Msg) -> None:
        if self._closed:
            return
        self._left -= 1
        if self._left == 0:
            self._close()
        self._queue.put_nowait(msg)

    async def _run(self, cb: Callable[[Msg], Awaitable[None]]) -> None:
        while True:
            msg = await self._queue.get()
            try:
                await cb(msg)
            except Exception:
                log.exception("a subscription's callback on %s failed", self.subject)

    async def next_msg(self, timeout: float = 1.0) -> Msg:
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None

    async def unsubscribe(self) -> None:
        self._close()
        if self._worker is not None:
            self._worker.cancel()

    def _close(self) -> None:
        self._closed = True
        self.nc.server.bus.remove(self)


class LocalBus:
    """Core publish/subscribe among the ``LocalNats`` of one ``MemoryServer``."""

    def __init__(self, streams: MemoryStreams) -> None:
        self._lock = threading.Lock()
        self._subs: list[LocalSubscription] = []
        streams.listen(self._stored)
        streams.listen_answers(self._answered)

    def add(self, sub: LocalSubscription) -> None:
        with self._lock:
            self._subs.append(sub)

    def remove(self, sub: LocalSubscription) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._subs.remove(sub)

    def deliver(self, make: Callable[[LocalSubscription], Msg], subject: str) -> None:
        with self._lock:
            subs = [s for s in self._subs if subjects.matches(s.subject, subject)]
        for sub in subs:
            sub.deliver(make(sub))

    def _answered(self, reply_to: str, body: bytes) -> None:
        """An answer to a command reaches the subscriptions on its subject."""
        self.deliver(lambda sub: _msg(sub.nc, reply_to, body), reply_to)

    def _stored(self, stored: Stored) -> None:
        """A message the log stored reaches the subscriptions on its subject."""
        _, subject, data = stored
        self.deliver(lambda sub: _msg(sub.nc, subject, data), subject)


class LocalNats:
    """What a ``MemoryBridge`` has for a NATS connection: publish, subscribe and inboxes,
    in process. Everything published through it is kept in ``published``."""

    max_payload = MAX_PAYLOAD

    def __init__(self, server: MemoryServer) -> None:
        self.server = server
        self.published: list[Msg] = []
        self._closed = False

    @property
    def is_connected(self) -> bool:
        return not self._closed

    @property
    def is_closed(self) -> bool:
        return self._closed

    def new_inbox(self) -> str:
        return f"_INBOX.{uuid.uuid4().hex}"

    def published_on(self, subject: str) -> list[Msg]:
        """What was published through this connection on ``subject`` (a pattern)."""
        return [m for m in self.published if subjects.matches(subject, m.subject)]

    async def publish(
        self,
        subject: str,
        payload: bytes = b"",
        reply: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        if self._closed:
            raise nats.errors.ConnectionClosedError
        headers = headers or None
        self.published.append(_msg(self, subject, payload, reply, headers))
        streams = self.server.streams
        if subjects.matches(subjects.ALL_EVENTS, subject):
            given = headers or {}
            expected = given.get(_EXPECTED)
            # What a stream refuses from a plain publish is dropped: nobody is answered.
            with contextlib.suppress(AppendConflict, ValueError):
                streams.publish(
                    subject,
                    payload,
                    msg_id=given.get(MSG_ID),
                    expected_last=None if expected is None else int(expected),
                    expected_subject=given.get(_EXPECTED_SUBJECT),
                )
            return  # its subscribers hear of it from the log
        if subjects.matches(subjects.ALL_COMMANDS, subject):
            with contextlib.suppress(ValueError):
                streams.publish_command(subject, payload, headers)
            return
        self.server.bus.deliver(lambda sub: _msg(sub.nc, subject, payload, reply, headers), subject)

    async def subscribe(
        self,
        subject: str,
        queue: str = "",
        cb: Callable[[Msg], Awaitable[None]] | None = None,
        max_msgs: int = 0,
    ) -> LocalSubscription:
        if self._closed:
            raise nats.errors.ConnectionClosedError
        sub = LocalSubscription(self, subject, cb, max_msgs)
        self.server.bus.add(sub)
        return sub

    async def flush(self, timeout: float = 10.0) -> None:
        """Everything is delivered as it is published."""

    async def close(self) -> None:
        self._closed = True

    async def drain(self) -> None:
        self._closed = True


class MemoryServer:
    """What stands in for one NATS server: the log's streams and core publish/subscribe.
    ``clock``: what the duplicate window is measured on (tests pass one they can move)."""

    def __init__(
        self, settings: StreamSettings | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.streams = MemoryStreams(settings, clock=clock)
        self.requests = RequestBus()
        self.bus = LocalBus(self.streams)

    def bridge(
        self, after_append: Callable[[Event, TaskHistory], None] | None = None
    ) -> MemoryBridge:
        """A new bridge on this server (not started: ``start()`` it)."""
        return MemoryBridge(self, after_append)


class MemoryBridge(Bridge):
    """A ``Bridge`` whose log is in memory and whose NATS is in process (see the module's
    doc). Where a ``Bridge`` is expected it answers ``log`` with a ``MemoryEventLog`` and
    ``nc`` with a ``LocalNats``: what asks them for JetStream itself (consumers, the object
    store) is not for this bridge."""

    def __init__(
        self,
        server: MemoryServer,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
    ) -> None:
        super().__init__("memory:", server.streams.settings, after_append)
        self.server = server
        self._local: LocalNats | None = None

    async def _connect(self, timeout_s: float | None) -> None:
        self._local = LocalNats(self.server)
        self._log = MemoryEventLog(self.server.streams, self.streams, self._after_append)
        self._commands = MemoryCommandQueue(self.server.streams)
        self._requests = MemoryRequests(self.server.requests)

    @property
    def nc(self) -> LocalNats:  # type: ignore[override]
        assert self._local is not None, "bridge not started"
        return self._local

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._local is not None and not self._local.is_closed and self._thread.is_alive():
            try:
                self.call(self._local.close(), timeout=timeout_s)
            except Exception as exc:
                log.warning("closing the local connection failed: %r", exc)
        super().stop(timeout_s)


def _msg(
    nc: LocalNats, subject: str, data: bytes, reply: str = "", headers: dict[str, str] | None = None
) -> Msg:
    # A real nats-py message, so that callbacks get what they get from NATS (its
    # ``respond`` publishes through ``nc``).
    return Msg(cast("NATS", nc), subject=subject, reply=reply, data=data, headers=headers)
