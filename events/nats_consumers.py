"""Durable consumers on JetStream (``kernelflow.events.consumers``' port): pull consumers
pulled with credit (``kernelflow.events.pull``), their messages read where a delivery
stands from the ack subject (``delivery_of``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from kernelflow.events.consumers import (
    ConsumerNotFound,
    ConsumerSpec,
    ConsumersPort,
    ConsumerState,
    Delivered,
    Pull,
)
from kernelflow.events.log import delivery_of
from kernelflow.events.pull import CreditPuller

_NO_HEADERS: Mapping[str, str] = {}


class _NatsDelivered(Delivered):
    __slots__ = ("_msg", "consumer_seq", "data", "delivered", "headers", "stream_seq", "subject")

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self.subject = msg.subject
        self.data = msg.data
        self.headers = msg.headers or _NO_HEADERS
        self.stream_seq, self.consumer_seq, self.delivered = delivery_of(msg)

    async def ack(self) -> None:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await self._msg.ack()

    async def nak(self, delay: float | None = None) -> None:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await self._msg.nak(delay=delay)

    async def in_progress(self) -> None:
        with contextlib.suppress(nats.errors.ConnectionClosedError):
            await self._msg.in_progress()


def _state(info: api.ConsumerInfo) -> ConsumerState:
    return ConsumerState(
        stream=info.stream_name,
        name=info.name,
        pending=info.num_pending or 0,
        ack_pending=info.num_ack_pending or 0,
        redelivered=info.num_redelivered or 0,
    )


class NatsConsumers(ConsumersPort):
    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._js = nc.jetstream()

    async def create(self, spec: ConsumerSpec) -> None:
        by_seq = spec.start_seq is not None
        await self._js.add_consumer(
            spec.stream,
            api.ConsumerConfig(
                durable_name=spec.durable,
                filter_subjects=list(spec.filters),
                ack_policy=api.AckPolicy.EXPLICIT if spec.acked else api.AckPolicy.NONE,
                ack_wait=spec.ack_wait_s if spec.acked else None,
                max_deliver=spec.max_deliveries if spec.acked else None,
                deliver_policy=(
                    api.DeliverPolicy.BY_START_SEQUENCE if by_seq else api.DeliverPolicy.ALL
                ),
                opt_start_seq=spec.start_seq,
                inactive_threshold=spec.idle_expiry_s,
                mem_storage=spec.in_memory or None,
            ),
        )

    async def delete(self, stream: str, durable: str) -> None:
        try:
            await self._js.delete_consumer(stream, durable)
        except nats.js.errors.NotFoundError:
            raise ConsumerNotFound(f"{stream}/{durable}") from None

    async def state(self, stream: str, durable: str) -> ConsumerState:
        try:
            return _state(await self._js.consumer_info(stream, durable))
        except nats.js.errors.NotFoundError:
            raise ConsumerNotFound(f"{stream}/{durable}") from None

    async def states(self, stream: str) -> list[ConsumerState]:
        return [_state(info) for info in await self._js.consumers_info(stream)]

    def pull(
        self,
        stream: str,
        durable: str,
        credit: Callable[[], int],
        deliver: Callable[[Delivered], None],
    ) -> Pull:
        def wrapped(msg: Msg) -> None:
            deliver(_NatsDelivered(msg))

        return CreditPuller(self._nc, stream, durable, credit, wrapped)
