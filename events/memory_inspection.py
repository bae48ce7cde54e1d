"""``kernelflow.events.inspection``'s port in memory: what ``kernelflow health`` reads of
a memory server (its streams, their consumers, the requests among its bridges), so that
its checks run without a nats-server. Its streams say they are kept in memory: they are.

Nothing here imports NATS.
"""

from __future__ import annotations

from typing import Any

from kernelflow.events import subjects
from kernelflow.events.inspection import (
    AccountUsage,
    Inspection,
    StreamDescription,
    StreamNotFound,
)
from kernelflow.events.memory import MemoryStreams
from kernelflow.events.memory_consumers import MemoryConsumers
from kernelflow.events.requests import RequestsPort

# Each stream's subjects and retention, as ``EventLog.ensure_streams`` makes them.
_STREAMS = {
    subjects.EVENTS_STREAM: ([subjects.ALL_EVENTS], "limits"),
    subjects.COMMANDS_STREAM: ([subjects.ALL_COMMANDS], "workqueue"),
}


class MemoryInspection(Inspection):
    def __init__(
        self,
        streams: MemoryStreams,
        consumers: MemoryConsumers,
        requests: RequestsPort,
        server_info: dict[str, Any] | None = None,
    ) -> None:
        self._streams = streams
        self.consumers = consumers
        self.requests = requests
        self.server_info = server_info or {"version": "memory"}

    async def account(self) -> AccountUsage:
        held = [self._streams.held(name) for name in _STREAMS]
        return AccountUsage(streams=len(held), storage_bytes=sum(h[1] for h in held))

    async def stream(self, name: str) -> StreamDescription:
        if name not in _STREAMS:
            raise StreamNotFound(name)
        stream_subjects, retention = _STREAMS[name]
        messages, size, first, last = self._streams.held(name)
        return StreamDescription(
            name=name,
            subjects=list(stream_subjects),
            retention=retention,
            storage="memory",
            replicas=1,
            messages=messages,
            bytes=size,
            first_seq=first,
            last_seq=last,
            consumers=len(await self.consumers.states(name)),
        )

    async def close(self) -> None:
        """Nothing to close."""
