"""The command queue as a port: commands from publishers (``kf.cmd.submit``,
``kf.cmd.cancel``) wait in a work queue until a conductor has handled them.

A port of its own beside the event log (``kernelflow.events.port``), as the
``eventsourcing`` library keeps its application recorder apart from the event recorder:
the log is the truth and only grows; the queue holds requests, and a settled one leaves
it. Two adapters: ``kernelflow.events.nats_queue`` on the JetStream stream ``KF_CMD``
(work-queue retention: a submit waits there even while no daemon runs), and
``kernelflow.events.memory``'s ``MemoryCommandQueue``. ``tests/unit/test_eventlog_contract.py``
runs one contract against both.

What a queue promises:
- each command takes the next sequence of the queue; a command whose ``Nats-Msg-Id``
  header was seen within the duplicate window is not queued again (its first sequence
  is answered);
- a command waits until the conductor that took it settles it (the daemon's consumer of
  the queue, ``kernelflow.actors.daemon``);
- the answer to a command goes to the inbox its publisher named in the ``KF-Reply``
  header (``answer``; ``request`` publishes one and waits for it).

Nothing here imports NATS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from kernelflow.events.model import Command


class CommandQueuePort(ABC):
    """What publishers and conductors ask of the command queue. Use one from one event
    loop (a bridge's)."""

    # ------------------------------------------------------------------ publishers

    @abstractmethod
    async def publish(
        self, command: Command, subject: str, headers: dict[str, str] | None = None
    ) -> int:
        """Queue a command on ``subject``; its sequence in the queue."""

    @abstractmethod
    async def request(
        self, command: Command, subject: str, timeout_s: float
    ) -> dict[str, Any] | None:
        """Queue a command with a private inbox for its answer, and wait for that answer
        (a JSON object); None when none came within ``timeout_s`` (or the connection
        closed while waiting)."""

    @abstractmethod
    async def waiting(self, subject: str) -> int:
        """How many commands on ``subject`` wait in the queue (queued or being handled,
        not settled yet). Anyone may count them; reading them is the daemon's."""

    # ------------------------------------------------------------------ conductors

    @abstractmethod
    async def oldest(self, subject: str) -> int | None:
        """The queue sequence of the oldest command on ``subject`` not settled yet; None
        for none."""

    @abstractmethod
    async def answer(self, reply_to: str, body: bytes) -> None:
        """Publish an answer on ``reply_to`` (a command's inbox, or ``kf.errors``). The
        caller checks that it may answer there (``subjects.reply_refusal``)."""
