"""Requests among the processes of one memory server (``kernelflow.events.requests``'
port, in memory): what ``kernelflow.actors.memory_bridge`` gives its bridges, so that the
status queries and health pings of actors' logic run without a nats-server. Safe from
any thread: a request is handed to its server on the server's loop, its answer to the
asker on the asker's.

Nothing here imports NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kernelflow.events import subjects
from kernelflow.events.requests import Handler, NoResponders, Request, RequestsPort, Serving

Answer = Callable[[bytes], None]


@dataclass(eq=False)
class _Server:
    subject: str
    group: str | None
    handler: Handler
    loop: asyncio.AbstractEventLoop
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def hand(self, request: Request) -> None:
        """From any thread: run the handler on this server's loop."""

        def start() -> None:
            task = self.loop.create_task(self.handler(request))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

        with contextlib.suppress(RuntimeError):  # the server's loop is closed
            self.loop.call_soon_threadsafe(start)


class _MemoryRequest(Request):
    __slots__ = ("_answer", "data", "reply_to")

    def __init__(self, data: bytes, answer: Answer) -> None:
        self.data = data
        self.reply_to = f"_INBOX.{uuid.uuid4().hex}"
        self._answer = answer

    async def respond(self, body: bytes) -> None:
        self._answer(body)


class RequestBus:
    """Who serves what, among the processes of one memory server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: list[_Server] = []
        self._turns = itertools.count()  # which of a group's servers takes a request

    def add(self, server: _Server) -> None:
        with self._lock:
            self._servers.append(server)

    def remove(self, server: _Server) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._servers.remove(server)

    def send(self, subject: str, data: bytes, answer: Answer) -> int:
        """Hand a request to every server of ``subject`` not in a group and to one of each
        group's; how many got it."""
        with self._lock:
            serving = [s for s in self._servers if subjects.matches(s.subject, subject)]
            turn = next(self._turns)
        groups: dict[str | None, list[_Server]] = {}
        for server in serving:
            groups.setdefault(server.group, []).append(server)
        chosen = [*groups.pop(None, [])]
        chosen += [members[turn % len(members)] for members in groups.values()]
        for server in chosen:
            server.hand(_MemoryRequest(data, answer))
        return len(chosen)


class _Served(Serving):
    def __init__(self, bus: RequestBus, server: _Server) -> None:
        self._bus, self._server = bus, server

    async def stop(self) -> None:
        self._bus.remove(self._server)


class MemoryRequests(RequestsPort):
    """One process's requests on a ``RequestBus``."""

    def __init__(self, bus: RequestBus) -> None:
        self.bus = bus

    async def serve(self, subject: str, handler: Handler, *, group: str | None = None) -> Serving:
        server = _Server(subject, group, handler, asyncio.get_running_loop())
        self.bus.add(server)
        return _Served(self.bus, server)

    async def ask(self, subject: str, body: bytes, timeout_s: float) -> bytes:
        loop = asyncio.get_running_loop()
        first: asyncio.Future[bytes] = loop.create_future()
        if not self.bus.send(subject, body, _on(loop, lambda data: _first(first, data))):
            raise NoResponders(subject)
        try:
            return await asyncio.wait_for(first, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"no answer on {subject} within {timeout_s:g}s") from None

    async def gather(self, subject: str, body: bytes, window_s: float) -> list[bytes]:
        loop = asyncio.get_running_loop()
        answers: list[bytes] = []
        closed = False

        def collect(data: bytes) -> None:
            if data and not closed:
                answers.append(data)

        self.bus.send(subject, body, _on(loop, collect))
        await asyncio.sleep(window_s)
        closed = True
        return answers


def _on(loop: asyncio.AbstractEventLoop, take: Answer) -> Answer:
    """``take``, called on ``loop`` whatever thread answers."""

    def answer(data: bytes) -> None:
        with contextlib.suppress(RuntimeError):  # the asker's loop is closed
            loop.call_soon_threadsafe(take, bytes(data))

    return answer


def _first(future: asyncio.Future[bytes], data: bytes) -> None:
    if not future.done():
        future.set_result(data)
