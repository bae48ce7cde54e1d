"""``kernelflow.events.inspection``'s port on NATS: a connection of its own, one try per
server and no reconnecting (a health check must not hang)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

import nats
import nats.js.errors
from nats.aio.client import Client as NATS

from kernelflow.events.inspection import (
    AccountUsage,
    Inspection,
    StreamDescription,
    StreamNotFound,
)
from kernelflow.events.nats_consumers import NatsConsumers
from kernelflow.events.nats_requests import NatsRequests


class NatsInspection(Inspection):
    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self.server_info = dict(nc._server_info or {})
        self.consumers = NatsConsumers(nc)
        self.requests = NatsRequests(nc)

    async def account(self) -> AccountUsage:
        info = await self._js.account_info()
        return AccountUsage(streams=info.streams, storage_bytes=info.storage)

    async def stream(self, name: str) -> StreamDescription:
        try:
            info = await self._js.stream_info(name)
        except nats.js.errors.NotFoundError:
            raise StreamNotFound(name) from None
        c, s = info.config, info.state
        return StreamDescription(
            name=name,
            subjects=list(c.subjects or []),
            retention=str(getattr(c.retention, "value", c.retention)),
            storage=str(getattr(c.storage, "value", c.storage)),
            replicas=c.num_replicas or 1,
            messages=s.messages,
            bytes=s.bytes,
            first_seq=s.first_seq,
            last_seq=s.last_seq,
            consumers=s.consumer_count,
        )

    async def close(self) -> None:
        await self._nc.close()


async def inspect_nats(
    servers: list[str],
    options: dict[str, Any],
    on_error: Callable[[Exception], Coroutine[Any, Any, None]],
) -> NatsInspection:
    """Connect to one of ``servers`` (``options``: the client's credentials and TLS,
    ``ClientAuth.options``), one try each; ``on_error`` hears why each failed."""
    nc = await nats.connect(
        servers,
        name="kernelflow-health",
        connect_timeout=3,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.2,
        error_cb=on_error,
        **options,
    )
    return NatsInspection(nc)
