"""What ``kernelflow health`` reads of the server that holds the log (``kernelflow.host.health``):
what the server says of itself, JetStream's use by the account, the streams' settings and
state, the durable consumers (``kernelflow.events.consumers``) and the daemons' answers to
pings (``kernelflow.events.requests``). Only reads: nothing is made. The interface; on NATS
it is ``kernelflow.events.nats_inspection``'s, in memory
``kernelflow.events.memory_inspection``'s.

Nothing here imports NATS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from kernelflow.events.consumers import ConsumersPort
from kernelflow.events.requests import RequestsPort


class StreamNotFound(LookupError):
    """No such stream (not made yet)."""


@dataclass(frozen=True)
class AccountUsage:
    streams: int
    storage_bytes: int


@dataclass(frozen=True)
class StreamDescription:
    name: str
    subjects: list[str]
    # "limits" (kept until they expire), "workqueue" (kept until consumed), "interest".
    retention: str
    # "file" or "memory".
    storage: str
    replicas: int
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    consumers: int


class Inspection(ABC):
    """One connection to the server, for reading; ``close`` it."""

    # What the server said of itself as the client connected (NATS's INFO: ``version``,
    # ``auth_required``, ``tls_required``...).
    server_info: dict[str, Any]
    consumers: ConsumersPort
    requests: RequestsPort

    @abstractmethod
    async def account(self) -> AccountUsage:
        """JetStream's use by this account; raises when JetStream is not available."""

    @abstractmethod
    async def stream(self, name: str) -> StreamDescription:
        """A stream's settings and state; StreamNotFound when there is none."""

    @abstractmethod
    async def close(self) -> None:
        """Close the connection."""
