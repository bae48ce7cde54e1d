"""Requests among processes on core NATS (``kernelflow.events.requests``' port): a
subscription per served subject (a queue group for ``group``), ``request`` for the first
answer, an inbox subscription for every answer within a window."""

from __future__ import annotations

import asyncio
import contextlib

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from kernelflow.events.requests import Handler, NoResponders, Request, RequestsPort, Serving


class _NatsRequest(Request):
    __slots__ = ("_msg", "data", "reply_to")

    def __init__(self, msg: Msg) -> None:
        self._msg = msg
        self.data = msg.data
        self.reply_to = msg.reply or ""

    async def respond(self, body: bytes) -> None:
        await self._msg.respond(body)


class _Subscribed(Serving):
    def __init__(self, sub: Subscription) -> None:
        self._sub = sub

    async def stop(self) -> None:
        await self._sub.unsubscribe()


class NatsRequests(RequestsPort):
    def __init__(self, nc: NATS) -> None:
        self._nc = nc

    async def serve(self, subject: str, handler: Handler, *, group: str | None = None) -> Serving:
        async def on_msg(msg: Msg) -> None:
            await handler(_NatsRequest(msg))

        return _Subscribed(await self._nc.subscribe(subject, queue=group or "", cb=on_msg))

    async def ask(self, subject: str, body: bytes, timeout_s: float) -> bytes:
        try:
            return (await self._nc.request(subject, body, timeout=timeout_s)).data
        except nats.errors.NoRespondersError:
            raise NoResponders(subject) from None
        except nats.errors.TimeoutError:
            raise TimeoutError(f"no answer on {subject} within {timeout_s:g}s") from None

    async def gather(self, subject: str, body: bytes, window_s: float) -> list[bytes]:
        answers: list[bytes] = []
        inbox = self._nc.new_inbox()

        async def collect(msg: Msg) -> None:
            if msg.data:  # not a status message (e.g. 503: nobody listens)
                answers.append(msg.data)

        sub = await self._nc.subscribe(inbox, cb=collect)
        try:
            await self._nc.publish(subject, body, reply=inbox)
            await self._nc.flush()
            await asyncio.sleep(window_s)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return answers
