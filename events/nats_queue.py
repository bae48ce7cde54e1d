"""The command queue on JetStream: the stream ``KF_CMD`` (work-queue retention; made by
``EventLog.ensure_streams`` with the events stream), the adapter of
``kernelflow.events.queue``'s port for every daemon and tool."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import published_seq
from kernelflow.events.model import Command
from kernelflow.events.queue import CommandQueuePort
from kernelflow.events.replies import Replies


class JetStreamCommandQueue(CommandQueuePort):
    def __init__(self, nc: NATS) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self._replies = Replies(nc)

    async def publish(
        self, command: Command, subject: str, headers: dict[str, str] | None = None
    ) -> int:
        return await self._replies.request(subject, encode(command), headers or {}, published_seq)

    async def request(
        self, command: Command, subject: str, timeout_s: float
    ) -> dict[str, Any] | None:
        inbox = self._nc.new_inbox()
        replies = await self._nc.subscribe(inbox, max_msgs=1)
        try:
            await self.publish(command, subject, {subjects.REPLY_HEADER: inbox})
            try:
                message = await replies.next_msg(timeout=timeout_s)
            except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError):
                # Closed: the caller stopped waiting (nats-py turns the cancellation into this).
                return None
            answer: dict[str, Any] = json.loads(message.data)
            return answer
        finally:
            with contextlib.suppress(Exception):
                await replies.unsubscribe()

    async def waiting(self, subject: str) -> int:
        info = await self._js.stream_info(subjects.COMMANDS_STREAM, subject)
        return int((info.state.subjects or {}).get(subject, 0))

    async def oldest(self, subject: str) -> int | None:
        first = self._js.get_msg(subjects.COMMANDS_STREAM, 1, subject, next=True)
        try:
            return (await first).seq
        except nats.js.errors.NotFoundError:
            return None

    async def answer(self, reply_to: str, body: bytes) -> None:
        await self._nc.publish(reply_to, body)
