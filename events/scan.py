"""Reading the log without a consumer.

Messages are read by batched direct gets (nats-server 2.11+: one request returns up to a
batch of the messages on a subject from a stream sequence on), which any replica of the
stream answers; where a replica may be behind (``leader``), or a server does not answer
them, by the stream leader's message get (one message a request).

Why not a consumer: creating one is a request whose body may name an existing consumer,
and the server then updates that consumer (its filter, its redeliveries). So only the
daemon role may create consumers (docs/security.md), and every read goes through here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncGenerator
from datetime import UTC, datetime

import msgspec
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kernelflow.events import subjects
from kernelflow.events.replies import STATUS, Replies

# A message as stored: (stream sequence, subject, data).
Stored = tuple[int, str, bytes]
# The server version that answers batched direct gets.
_DIRECT_BATCH_SINCE = (2, 11)
_DIRECT_GET = f"$JS.API.DIRECT.GET.{subjects.EVENTS_STREAM}"
_MSG_GET = f"$JS.API.STREAM.MSG.GET.{subjects.EVENTS_STREAM}"
_NO_MESSAGE = 10037  # JetStream's "no message found"


class _StoredMessage(msgspec.Struct):
    subject: str
    seq: int
    data: str = ""  # base64


class _MsgGetAnswer(msgspec.Struct):
    message: _StoredMessage | None = None
    error: dict[str, object] | None = None


_MSG_GET_ANSWERS = msgspec.json.Decoder(_MsgGetAnswer)


class Scanner:
    """Reads the events stream's messages by sequence, for one EventLog (its replies)."""

    def __init__(self, nc: NATS, replies: Replies) -> None:
        self._replies = replies
        # Whether the stream answers batched direct gets (False once it did not).
        server = nc.connected_server_version
        self._direct = (server.major, server.minor) >= _DIRECT_BATCH_SINCE

    async def batch(
        self, seq: int, subject: str, *, size: int, leader: bool = False
    ) -> tuple[list[Stored], bool]:
        """The messages on ``subject`` from stream sequence ``seq`` on, as many as one
        request returns (at most ``size``), and whether more may follow them."""
        if self._direct and not leader:
            found = await self._direct_batch(seq, subject, size)
            if found is not None:
                return found
            self._direct = False  # a stream without allow_direct: the leader answers
        return await self._leader_get(seq, subject)

    async def batches(
        self,
        seq: int,
        subject: str,
        *,
        size: int,
        through: int | None = None,
        leader: bool = False,
    ) -> AsyncGenerator[list[Stored], None]:
        """Every message on ``subject`` from ``seq`` to the end of the log (or through
        stream sequence ``through``), a batch at a time: the next batch is asked for while
        the caller takes this one."""
        pending = asyncio.ensure_future(self.batch(seq, subject, size=size, leader=leader))
        try:
            while True:
                found, more = await pending
                if through is not None and found and found[-1][0] >= through:
                    found, more = [m for m in found if m[0] <= through], False
                if more:
                    after = found[-1][0] + 1
                    pending = asyncio.ensure_future(
                        self.batch(after, subject, size=size, leader=leader)
                    )
                if found:
                    yield found
                if not more:
                    return
        finally:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending

    async def all(self, seq: int, subject: str, *, size: int, leader: bool = False) -> list[Stored]:
        """``batches``, in one list."""
        found: list[Stored] = []
        reading = self.batches(seq, subject, size=size, leader=leader)
        async with contextlib.aclosing(reading):
            async for batch in reading:
                found += batch
        return found

    async def first_seq_at(self, at: float, subject: str) -> int | None:
        """The stream sequence of the first message on ``subject`` stored at or after the
        time ``at`` (seconds since the epoch); None when there is none."""
        when = datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
        request = {"start_time": when, "next_by_subj": subject, "batch": 1}
        msgs = await self._replies.collect(_DIRECT_GET, json.dumps(request).encode())
        found, _ = _direct_answer(msgs)
        return found[0][0] if found else None

    async def _direct_batch(
        self, seq: int, subject: str, size: int
    ) -> tuple[list[Stored], bool] | None:
        request = json.dumps({"seq": seq, "next_by_subj": subject, "batch": size})
        msgs = await self._replies.collect(_DIRECT_GET, request.encode())
        if (msgs[-1].headers or {}).get(STATUS) == "503":
            return None  # no responders: a stream without allow_direct, or none
        return _direct_answer(msgs)

    async def _leader_get(self, seq: int, subject: str) -> tuple[list[Stored], bool]:
        request = json.dumps({"seq": seq, "next_by_subj": subject}).encode()
        stored = await self._replies.request(_MSG_GET, request, {}, _leader_answer)
        return ([stored], True) if stored is not None else ([], False)


def _direct_answer(msgs: list[Msg]) -> tuple[list[Stored], bool]:
    """A batched direct get's messages, and whether the server holds more after them (the
    last message is the end of the batch, or says why there is nothing)."""
    end = msgs[-1].headers or {}
    status = end.get(STATUS)
    if status not in ("204", "404"):
        raise nats.js.errors.APIError(
            code=int(status or 0), description=str(end.get("Description", ""))
        )
    found = []
    for msg in msgs[:-1]:
        headers = msg.headers or {}
        found.append((int(headers["Nats-Sequence"]), headers["Nats-Subject"], msg.data))
    more = status == "204" and bool(found) and int(end.get("Nats-Num-Pending", 0)) > 0
    return found, more


def _leader_answer(reply: Msg) -> Stored | None:
    if (reply.headers or {}).get(STATUS) == "503":
        raise nats.js.errors.NoStreamResponseError
    answer = _MSG_GET_ANSWERS.decode(reply.data)
    if answer.error is not None:
        if answer.error.get("err_code") == _NO_MESSAGE:
            return None
        nats.js.errors.APIError.from_error(answer.error)  # raises the error it describes
    assert answer.message is not None
    message = answer.message
    return message.seq, message.subject, base64.b64decode(message.data)
