"""Durable consumers as a port: a stream's messages handed to whoever pulls them, each
kept until it is settled (the daemons' pools: ``kernelflow.actors.daemon``), or a cursor
that only remembers how far it delivered (the read model: ``kernelflow.actors.readmodel``).
The interface; on JetStream it is ``kernelflow.events.nats_consumers``'s, in memory
``kernelflow.events.memory_consumers``'s. ``tests/unit/test_consumers_contract.py`` runs
one contract against both.

What a durable consumer promises:
- it delivers the messages of its stream on any of its ``filters``, in stream order, from
  ``start_seq`` (None: the stream's first), each numbered by its own delivery sequence
  (``Delivered.consumer_seq``: 1, 2, ...; a jump means a delivery was lost in transit);
- with acks, a delivered message is delivered again ``ack_wait_s`` after its last
  delivery or ``in_progress``, until it is acked, and at once (or after the delay named)
  once it is nakked; never more than ``max_deliveries`` times (-1: no limit). On a
  work-queue stream (the command queue) an ack removes the message from the stream;
- a pull asks for no more than its ``credit()`` says, and hands each message over as it
  arrives (``kernelflow.events.pull``);
- several processes pulling one durable consumer share its messages: each goes to one.

Nothing here imports NATS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class ConsumerNotFound(LookupError):
    """No such durable consumer on the stream (never made, deleted, or expired)."""


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    durable: str
    filters: tuple[str, ...]
    # The stream sequence of the first message to deliver (None: the stream's first).
    start_seq: int | None = None
    # Whether each delivery waits to be settled (False: a cursor; nothing is redelivered).
    acked: bool = True
    ack_wait_s: float = 30.0
    max_deliveries: int = -1
    # Removed by the server after this long without a pull (None: kept until deleted).
    idle_expiry_s: float | None = None
    # The server keeps its state in memory only (lost if the server restarts).
    in_memory: bool = False


@dataclass(frozen=True)
class ConsumerState:
    """A durable consumer as the server holds it now."""

    stream: str
    name: str
    # Messages not delivered yet.
    pending: int
    # Delivered, not settled yet.
    ack_pending: int
    # Delivered more than once, not settled yet.
    redelivered: int


class Delivered(ABC):
    """A message a consumer delivered. Settling one whose connection has closed does
    nothing: it is delivered again to whoever pulls next."""

    __slots__ = ()

    subject: str
    data: bytes
    headers: Mapping[str, str]
    stream_seq: int
    consumer_seq: int
    # Times the consumer delivered this message (1: the first time).
    delivered: int

    @abstractmethod
    async def ack(self) -> None:
        """Done with: never delivered again."""

    @abstractmethod
    async def nak(self, delay: float | None = None) -> None:
        """Not done: deliver it again after ``delay`` seconds (None: at once)."""

    @abstractmethod
    async def in_progress(self) -> None:
        """Still being worked on: its ``ack_wait_s`` starts again."""


class Pull(ABC):
    """A pull from one durable consumer, run on the loop that made it."""

    @abstractmethod
    def credit_changed(self) -> None:
        """The taker may have room for more (on the loop): ask ``credit()`` again."""

    @abstractmethod
    async def run(self) -> None:
        """Hand messages over until cancelled."""


class ConsumersPort(ABC):
    """The durable consumers of one NATS. Use it from one event loop (a bridge's)."""

    @abstractmethod
    async def create(self, spec: ConsumerSpec) -> None:
        """Make the durable consumer, or keep it as it is when it is there with ``spec``'s
        settings."""

    @abstractmethod
    async def delete(self, stream: str, durable: str) -> None:
        """Remove it (its pulls get nothing more); ConsumerNotFound when there is none."""

    @abstractmethod
    async def state(self, stream: str, durable: str) -> ConsumerState:
        """Where it stands; ConsumerNotFound when there is none."""

    @abstractmethod
    async def states(self, stream: str) -> list[ConsumerState]:
        """Every durable consumer of ``stream``."""

    @abstractmethod
    def pull(
        self,
        stream: str,
        durable: str,
        credit: Callable[[], int],
        deliver: Callable[[Delivered], None],
    ) -> Pull:
        """A pull (not running yet: ``run`` it) that hands ``deliver`` (on the loop) each
        message as it arrives, never asking for more than ``credit()``."""
