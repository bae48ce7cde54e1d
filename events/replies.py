"""Requests to NATS answered on one wildcard inbox subscription: what the EventLog sends
(publish acks, direct gets, message gets) costs one publish, a dictionary entry and a timer
handle each (nats-py's ``request`` adds a task, random bytes and JSON dataclasses)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

# How long a request waits for the server's answer (nats-py's default).
TIMEOUT_S = 5.0
# The header of a JetStream status message (a direct get's end of batch, no responders).
STATUS = "Status"
T = TypeVar("T")


def _give_up(answer: asyncio.Future[Any]) -> None:
    if not answer.done():
        answer.set_exception(nats.errors.TimeoutError())


class Replies:
    """The answers to one EventLog's requests, on a single wildcard inbox subscription."""

    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._prefix = ""
        self._subscribing: asyncio.Lock | None = None
        self._waiting: dict[str, Callable[[Msg], None]] = {}
        self._tokens = itertools.count()

    async def _inbox(self) -> str:
        if not self._prefix:
            self._subscribing = self._subscribing or asyncio.Lock()
            async with self._subscribing:
                if not self._prefix:
                    prefix = f"{self._nc.new_inbox()}."
                    await self._nc.subscribe(prefix + "*", cb=self._on_reply)
                    self._prefix = prefix
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        handler = self._waiting.get(msg.subject[len(self._prefix) :])
        if handler is not None:
            handler(msg)

    async def request(
        self, subject: str, payload: bytes, headers: dict[str, str], read: Callable[[Msg], T]
    ) -> T:
        """Publish a request answered by one message; what ``read`` makes of it, run as
        soon as it arrives (what ``read`` raises is raised here)."""
        return await (await self.send(subject, payload, headers, read))

    async def send(
        self, subject: str, payload: bytes, headers: dict[str, str], read: Callable[[Msg], T]
    ) -> asyncio.Future[T]:
        """``request`` without the wait: publish now (in call order) and return the future
        of what ``read`` makes of the answer."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()

        def on_reply(msg: Msg) -> None:
            if answer.done():
                return
            try:
                answer.set_result(read(msg))
            except Exception as exc:
                answer.set_exception(exc)

        await self._send(subject, payload, headers, on_reply, answer)
        return answer

    async def collect(self, subject: str, payload: bytes) -> list[Msg]:
        """Publish a request answered by several messages, the last of them carrying a
        status header (a direct get's end of batch, or its error); all of them."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[Msg]] = loop.create_future()
        got: list[Msg] = []

        def on_reply(msg: Msg) -> None:
            got.append(msg)
            if msg.headers and STATUS in msg.headers and not answer.done():
                answer.set_result(got)

        await self._send(subject, payload, None, on_reply, answer)
        return await answer

    async def _send(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None,
        on_reply: Callable[[Msg], None],
        answer: asyncio.Future[Any],
    ) -> None:
        """Publish with a reply subject routed to ``on_reply`` until ``answer`` is done
        (answered, timed out, or cancelled with its waiter)."""
        prefix = await self._inbox()
        token = str(next(self._tokens))
        self._waiting[token] = on_reply
        timer = asyncio.get_running_loop().call_later(TIMEOUT_S, _give_up, answer)

        def forget(_: asyncio.Future[Any]) -> None:
            timer.cancel()
            del self._waiting[token]

        answer.add_done_callback(forget)
        try:
            await self._nc.publish(subject, payload, reply=prefix + token, headers=headers or None)
        except BaseException:
            answer.cancel()
            raise
