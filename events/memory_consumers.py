"""Durable consumers in memory (``kernelflow.events.consumers``' port) on ``MemoryStreams``:
the consumers of one memory server, shared by its bridges, as a NATS server's are by the
processes on it. Safe from any thread; each pull runs on the loop that runs it.

Kept as JetStream keeps them: a consumer's own delivery sequence, redeliveries after
``ack_wait_s`` (or a nak's delay) up to ``max_deliveries``, an ack on the command stream
settling the command (a work queue). Not modelled: ``idle_expiry_s`` (a consumer stays
until deleted) and ``in_memory`` (nothing here outlives the process anyway).

Nothing here imports NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kernelflow.events import subjects
from kernelflow.events.consumers import (
    ConsumerNotFound,
    ConsumerSpec,
    ConsumersPort,
    ConsumerState,
    Delivered,
    Pull,
)
from kernelflow.events.memory import MemoryStreams, StoredMessage

_Key = tuple[str, str]  # (stream, durable)


@dataclass
class _Unsettled:
    message: StoredMessage
    deliveries: int
    due: float  # when it is delivered again (``time.monotonic``)


@dataclass
class _Consumer:
    spec: ConsumerSpec
    next_seq: int
    delivered: int = 0  # the last delivery sequence
    unsettled: dict[int, _Unsettled] = field(default_factory=dict)


class _MemoryDelivered(Delivered):
    __slots__ = (
        "_consumers",
        "_key",
        "consumer_seq",
        "data",
        "delivered",
        "headers",
        "stream_seq",
        "subject",
    )

    def __init__(
        self, consumers: MemoryConsumers, key: _Key, message: StoredMessage, at: int, times: int
    ) -> None:
        self._consumers, self._key = consumers, key
        self.subject, self.data, self.headers = message.subject, message.data, message.headers
        self.stream_seq, self.consumer_seq, self.delivered = message.seq, at, times

    async def ack(self) -> None:
        self._consumers.settle(self._key, self.stream_seq, None)

    async def nak(self, delay: float | None = None) -> None:
        self._consumers.settle(self._key, self.stream_seq, delay or 0.0)

    async def in_progress(self) -> None:
        self._consumers.settle(self._key, self.stream_seq, -1.0)


class _MemoryPull(Pull):
    def __init__(
        self,
        consumers: MemoryConsumers,
        key: _Key,
        credit: Callable[[], int],
        deliver: Callable[[Delivered], None],
    ) -> None:
        self._consumers, self._key = consumers, key
        self._credit, self._deliver = credit, deliver
        self._woken = asyncio.Event()

    def credit_changed(self) -> None:
        self._woken.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def wake() -> None:  # on any thread
            with contextlib.suppress(RuntimeError):  # this pull's loop is closed
                loop.call_soon_threadsafe(self._woken.set)

        stop = self._consumers.listen(wake)
        try:
            while True:
                self._woken.clear()
                due = None
                if (wanted := self._credit()) > 0:
                    taken, due = self._consumers.take(self._key, wanted)
                    for delivered in taken:
                        self._deliver(delivered)
                    if taken:
                        continue
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that
                # arrives as the wait ends.
                timer = None if due is None else loop.call_later(due, self._woken.set)
                try:
                    await self._woken.wait()
                finally:
                    if timer is not None:
                        timer.cancel()
        finally:
            stop()


class MemoryConsumers(ConsumersPort):
    """The durable consumers of one ``MemoryStreams``."""

    def __init__(self, streams: MemoryStreams) -> None:
        self.streams = streams
        self._lock = threading.Lock()
        self._consumers: dict[_Key, _Consumer] = {}
        self._wakes: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ the port

    async def create(self, spec: ConsumerSpec) -> None:
        if spec.stream not in (subjects.EVENTS_STREAM, subjects.COMMANDS_STREAM):
            raise ValueError(f"no stream {spec.stream!r}")
        with self._lock:
            key = (spec.stream, spec.durable)
            there = self._consumers.get(key)
            if there is None:
                self._consumers[key] = _Consumer(spec, spec.start_seq or 1)
            else:
                there.spec = spec
        self._wake()

    async def delete(self, stream: str, durable: str) -> None:
        with self._lock:
            if self._consumers.pop((stream, durable), None) is None:
                raise ConsumerNotFound(f"{stream}/{durable}")

    async def state(self, stream: str, durable: str) -> ConsumerState:
        with self._lock:
            consumer = self._consumers.get((stream, durable))
            if consumer is None:
                raise ConsumerNotFound(f"{stream}/{durable}")
            return self._state(consumer)

    async def states(self, stream: str) -> list[ConsumerState]:
        with self._lock:
            return [self._state(c) for (s, _), c in self._consumers.items() if s == stream]

    def pull(
        self,
        stream: str,
        durable: str,
        credit: Callable[[], int],
        deliver: Callable[[Delivered], None],
    ) -> Pull:
        return _MemoryPull(self, (stream, durable), credit, deliver)

    # ------------------------------------------------------------------ what pulls do

    def take(self, key: _Key, wanted: int) -> tuple[list[Delivered], float | None]:
        """Up to ``wanted`` deliveries (those due again first, then new messages), and in
        how many seconds the next redelivery falls due (None: none waits)."""
        now = time.monotonic()
        taken: list[Delivered] = []
        with self._lock:
            consumer = self._consumers.get(key)
            if consumer is None:
                return [], None
            spec = consumer.spec
            for seq, unsettled in sorted(consumer.unsettled.items()):
                if len(taken) == wanted:
                    break
                if unsettled.due > now:
                    continue
                if 0 < spec.max_deliveries <= unsettled.deliveries:
                    del consumer.unsettled[seq]  # given up on, as JetStream does
                    continue
                unsettled.deliveries += 1
                unsettled.due = now + spec.ack_wait_s
                taken.append(self._delivery(key, consumer, unsettled.message, unsettled.deliveries))
            for message in self._messages(spec, consumer.next_seq, wanted - len(taken)):
                consumer.next_seq = message.seq + 1
                if spec.acked:
                    consumer.unsettled[message.seq] = _Unsettled(message, 1, now + spec.ack_wait_s)
                taken.append(self._delivery(key, consumer, message, 1))
            dues = [u.due for u in consumer.unsettled.values()]
        return taken, (max(0.0, min(dues) - now) if dues else None)

    def settle(self, key: _Key, seq: int, again_in: float | None) -> None:
        """A delivery settled: acked (``again_in`` None), to be delivered again in
        ``again_in`` seconds (a nak), or kept another ``ack_wait_s`` (-1: in progress)."""
        acked_command = False
        with self._lock:
            consumer = self._consumers.get(key)
            unsettled = consumer.unsettled.get(seq) if consumer is not None else None
            if consumer is None or unsettled is None:
                return
            if again_in is None:
                del consumer.unsettled[seq]
                acked_command = key[0] == subjects.COMMANDS_STREAM
            elif again_in < 0:
                unsettled.due = time.monotonic() + consumer.spec.ack_wait_s
            else:
                unsettled.due = time.monotonic() + again_in
        if acked_command:
            self.streams.settle_command(seq)  # a work queue: done with, gone
        self._wake()

    def listen(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (on any thread) whenever a consumer may have something new to
        deliver; what is returned stops that."""
        stop_streams = self.streams.listen(lambda _: wake())
        with self._lock:
            self._wakes.append(wake)

        def stop() -> None:
            stop_streams()
            with self._lock, contextlib.suppress(ValueError):
                self._wakes.remove(wake)

        return stop

    # ------------------------------------------------------------------ inside

    def _wake(self) -> None:
        with self._lock:
            wakes = list(self._wakes)
        for wake in wakes:
            wake()

    def _delivery(
        self, key: _Key, consumer: _Consumer, message: StoredMessage, times: int
    ) -> Delivered:
        consumer.delivered += 1
        return _MemoryDelivered(self, key, message, consumer.delivered, times)

    def _messages(self, spec: ConsumerSpec, seq: int, limit: int | None) -> list[StoredMessage]:
        """The stream's messages on ``spec``'s filters from ``seq`` on (at most ``limit``)."""
        if limit is not None and limit <= 0:
            return []
        if spec.stream == subjects.COMMANDS_STREAM:
            found = [c for c in self.streams.commands() if c.seq >= seq and _on(spec, c.subject)]
        else:
            on_any = {
                stored
                for pattern in spec.filters
                for stored in self.streams.messages(seq, pattern, limit=limit)
            }
            found = [
                StoredMessage(s, subject, data, self.streams.headers_of(s))
                for s, subject, data in sorted(on_any)
            ]
        return found[:limit]

    def _state(self, consumer: _Consumer) -> ConsumerState:
        spec = consumer.spec
        return ConsumerState(
            stream=spec.stream,
            name=spec.durable,
            pending=len(self._messages(spec, consumer.next_seq, None)),
            ack_pending=len(consumer.unsettled),
            redelivered=sum(u.deliveries > 1 for u in consumer.unsettled.values()),
        )


def _on(spec: ConsumerSpec, subject: str) -> bool:
    return any(subjects.matches(pattern, subject) for pattern in spec.filters)
