"""Actors on the in-memory ports: a ``Bridge`` for running actors' logic without a
nats-server.

``MemoryServer`` stands for one NATS server: the log's and the command queue's streams
(``MemoryStreams``), their durable consumers, who serves which requests (``RequestBus``)
and the object stores.
``MemoryServer.bridge()`` is a ``Bridge`` on it: the same loop thread, ``call``, ``post``
and ``spawn`` as the NATS bridge (inherited), with the ports' memory adapters as its
``log`` (``MemoryEventLog``), ``commands`` (``MemoryCommandQueue``), ``consumers``
(``MemoryConsumers``), ``requests`` (``MemoryRequests``) and ``buckets``
(``MemoryBuckets``). Several bridges on one server are several processes on one NATS:
they share the log, the queue, the consumers, the requests and the buckets, and each
remembers its own histories.

There is no NATS connection here (``nc`` says so): everything of kernelflow's that is
not about NATS asks the ports (docs/architecture.md, "The event log and its ports";
``tests/unit/test_architecture.py``), and so runs on this bridge too: the read model, the
daemon's pools; or logic is handed its jobs directly (``Worker.handle`` or ``receive``,
``advance_on_loop``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

from kernelflow.actors.bridge import Bridge
from kernelflow.events.memory import MemoryCommandQueue, MemoryEventLog, MemoryStreams
from kernelflow.events.memory_consumers import MemoryConsumers
from kernelflow.events.memory_inspection import MemoryInspection
from kernelflow.events.memory_objects import MemoryBuckets
from kernelflow.events.memory_requests import MemoryRequests, RequestBus
from kernelflow.events.model import Event
from kernelflow.events.port import StreamConfig, TaskHistory


class NoNats(RuntimeError):
    """Asked a memory bridge for NATS itself."""


class MemoryServer:
    """What stands in for one NATS server: the streams, their consumers, the requests'
    servers and the object stores.
    ``clock``: what the duplicate window is measured on (tests pass one they can move)."""

    def __init__(
        self, settings: StreamConfig | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.streams = MemoryStreams(settings, clock=clock)
        self.consumers = MemoryConsumers(self.streams)
        self.requests = RequestBus()
        self.buckets = MemoryBuckets()

    def inspection(self) -> MemoryInspection:
        """What ``kernelflow health`` reads of this server (``check_streams``...)."""
        return MemoryInspection(self.streams, self.consumers, MemoryRequests(self.requests))

    def bridge(
        self, after_append: Callable[[Event, TaskHistory], None] | None = None
    ) -> MemoryBridge:
        """A new bridge on this server (not started: ``start()`` it)."""
        return MemoryBridge(self, after_append)


class MemoryBridge(Bridge):
    """A ``Bridge`` on the ports' memory adapters (see the module's doc)."""

    def __init__(
        self,
        server: MemoryServer,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
    ) -> None:
        super().__init__("memory:", server.streams.settings, after_append)
        self.server = server

    async def _connect(self, timeout_s: float | None) -> None:
        self._log = MemoryEventLog(self.server.streams, self.streams, self._after_append)
        self._commands = MemoryCommandQueue(self.server.streams)
        self._consumers = self.server.consumers
        self._requests = MemoryRequests(self.server.requests)
        self._buckets = self.server.buckets

    @property
    def nc(self) -> NoReturn:
        raise NoNats("a memory bridge has no NATS connection: ask its ports")

    @property
    def connected(self) -> bool:
        return self._log is not None and self._thread.is_alive()
