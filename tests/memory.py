"""Helpers for tests of logic that is not about NATS: the event log's memory adapter
(``kernelflow.events.memory``) and bridges on it (``kernelflow.actors.memory_bridge``), no
nats-server needed. A module's fixtures build on them::

    @pytest.fixture
    def memory_server() -> MemoryServer:
        return MemoryServer()  # a server of the test's own: an empty log


    @pytest.fixture
    def bridge(memory_server: MemoryServer) -> Iterator[Bridge]:
        with running_bridge(memory_server) as b:
            yield b

``memory_server.bridge().start()`` is one more process on the same server."""

from __future__ import annotations

import contextlib
import json
import queue
from collections.abc import Iterator
from typing import Any

from kernelflow.actors.memory_bridge import MemoryBridge, MemoryServer


class FakeClock:
    """A clock that moves only when told: what a duplicate window is measured on."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def answers_to(server: MemoryServer, inbox: str) -> queue.Queue[Any]:
    """The answers published on ``inbox`` (a command's reply subject) from now on, decoded
    from JSON: what a publisher waiting there would get."""
    got: queue.Queue[Any] = queue.Queue()

    def on_answer(reply_to: str, body: bytes) -> None:
        if reply_to == inbox:
            got.put(json.loads(body))

    server.streams.listen_answers(on_answer)
    return got


@contextlib.contextmanager
def running_bridge(server: MemoryServer | None = None) -> Iterator[MemoryBridge]:
    """A started bridge on ``server`` (a new one by default), stopped afterwards."""
    bridge = (server or MemoryServer()).bridge().start()
    try:
        yield bridge
    finally:
        bridge.stop()
