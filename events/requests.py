"""Requests among the processes of one NATS, answered on the asker's inbox: the status
queries a daemon's read model answers (``subjects.STATUS_QUERY``), the health pings every
daemon answers (``subjects.HEALTH_PING``). No stream holds them: a request nobody serves
when it is made goes unanswered. The interface; on NATS it is
``kernelflow.events.nats_requests``'s, in memory ``kernelflow.events.memory_requests``'s.

Nothing here imports NATS.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any


class NoResponders(Exception):
    """Nobody serves the subject a request was made on."""


class Request(ABC):
    """A request as a server gets it."""

    __slots__ = ()

    data: bytes
    # Where its answer goes ("" for nowhere: a request that wants none). The server
    # checks it before answering (``subjects.reply_refusal``): an answer must never land
    # in the log, or be taken for a command or an API request.
    reply_to: str

    @abstractmethod
    async def respond(self, body: bytes) -> None:
        """Answer on ``reply_to``."""


class Serving(ABC):
    """A subject being served."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop serving (requests being handled go on)."""


Handler = Callable[[Request], Coroutine[Any, Any, None]]


class RequestsPort(ABC):
    """Serving and asking. Use it from one event loop (a bridge's)."""

    @abstractmethod
    async def serve(self, subject: str, handler: Handler, *, group: str | None = None) -> Serving:
        """Hand each request on ``subject`` to ``handler`` (on the loop; a handler that
        waits long starts a task of its own). With ``group``, each request goes to one of
        the group's servers only."""

    @abstractmethod
    async def ask(self, subject: str, body: bytes, timeout_s: float) -> bytes:
        """The first answer to a request; NoResponders when nobody serves ``subject``,
        TimeoutError when nobody answered within ``timeout_s``."""

    @abstractmethod
    async def gather(self, subject: str, body: bytes, window_s: float) -> list[bytes]:
        """Every answer to a request that arrives within ``window_s`` seconds, in the
        order they came (empty answers left out: a server's status, not an answer)."""
