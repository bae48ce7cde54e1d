"""One contract for requests among processes (``kernelflow.events.requests``: health
pings and status queries), run against both adapters: core NATS on a nats-server of the
test's own, and the memory bus the memory bridge gives its bridges. Each clause is a plain
coroutine function of two processes' ports (a server's and an asker's) on one loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from kernelflow.events import subjects
from kernelflow.events.memory_requests import MemoryRequests, RequestBus
from kernelflow.events.nats_requests import NatsRequests
from kernelflow.events.requests import NoResponders, Request, RequestsPort
from tests.conftest import connect

Clause = Callable[[Callable[[], RequestsPort]], Coroutine[Any, Any, None]]
CONTRACT: list[Clause] = []


def clause(check: Clause) -> Clause:
    CONTRACT.append(check)
    return check


def echo(tag: bytes) -> Callable[[Request], Coroutine[Any, Any, None]]:
    async def handle(request: Request) -> None:
        assert subjects.reply_refusal(request.reply_to) is None  # an inbox
        await request.respond(tag + b":" + request.data)

    return handle


@clause
async def a_request_gets_its_server_s_answer(process: Callable[[], RequestsPort]) -> None:
    serving = await process().serve(subjects.HEALTH_PING, echo(b"a"))
    try:
        assert await process().ask(subjects.HEALTH_PING, b"hi", 5.0) == b"a:hi"
    finally:
        await serving.stop()


@clause
async def nobody_serving_is_said_at_once(process: Callable[[], RequestsPort]) -> None:
    with pytest.raises(NoResponders):
        await process().ask(subjects.STATUS_QUERY, b"{}", 5.0)


@clause
async def a_server_that_does_not_answer_times_out(process: Callable[[], RequestsPort]) -> None:
    async def silent(request: Request) -> None:
        pass

    serving = await process().serve(subjects.STATUS_QUERY, silent)
    try:
        with pytest.raises(TimeoutError):
            await process().ask(subjects.STATUS_QUERY, b"{}", 0.3)
    finally:
        await serving.stop()


@clause
async def one_of_a_group_answers_each_request(process: Callable[[], RequestsPort]) -> None:
    group = subjects.READMODEL_GROUP
    servers = [
        await process().serve(subjects.STATUS_QUERY, echo(tag), group=group) for tag in (b"a", b"b")
    ]
    try:
        answers = await process().gather(subjects.STATUS_QUERY, b"q", 0.5)
        assert answers in ([b"a:q"], [b"b:q"])
    finally:
        for serving in servers:
            await serving.stop()


@clause
async def every_server_s_answer_is_gathered(process: Callable[[], RequestsPort]) -> None:
    servers = [await process().serve(subjects.HEALTH_PING, echo(tag)) for tag in (b"a", b"b")]
    try:
        answers = await process().gather(subjects.HEALTH_PING, b"p", 0.5)
        assert sorted(answers) == [b"a:p", b"b:p"]
        await servers[0].stop()
        assert await process().gather(subjects.HEALTH_PING, b"p", 0.5) == [b"b:p"]
    finally:
        for serving in servers[1:]:
            await serving.stop()


@pytest.fixture(params=["nats", "memory"])
def processes(request: pytest.FixtureRequest) -> Iterator[tuple[asyncio.AbstractEventLoop, Any]]:
    """The test's loop, and a way to make one more process's port on one server."""
    loop = asyncio.new_event_loop()
    try:
        if request.param == "memory":
            bus = RequestBus()
            yield loop, lambda: MemoryRequests(bus)
            return
        url = request.getfixturevalue("private_nats")
        nc = loop.run_until_complete(connect(url, "daemon"))
        try:
            yield loop, lambda: NatsRequests(nc)
        finally:
            loop.run_until_complete(nc.close())
    finally:
        loop.close()


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
def test_the_contract(processes: tuple[asyncio.AbstractEventLoop, Any], check: Clause) -> None:
    loop, process = processes
    loop.run_until_complete(check(process))
