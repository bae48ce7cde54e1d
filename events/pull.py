"""Pull from a JetStream consumer with credit: messages are handed over the moment they
arrive, and never more are asked for than the taker has room for (idle actors in a
daemon's pool, space in a read's buffer).

(nats-py's ``fetch(batch=n)`` returns only once n messages arrived or the timeout passed,
which adds up to a whole timeout of latency to every hand-over when work trickles in.)

One pull request is outstanding at a time, for as many messages as ``credit()`` says;
it ends when that many were delivered or the server says it expired (status 408), ran
dry (404) or refused it (409). A request lost to a reconnect is given up after its
expiry and asked again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Collection
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from kernelflow.events.consumers import Pull

log = logging.getLogger("kernelflow.pull")

_HEARTBEAT = "100"


class CreditPuller(Pull):
    def __init__(
        self,
        nc: NATS,
        stream: str,
        durable: str,
        credit: Callable[[], int],
        deliver: Callable[[Msg], None],
        expires_s: float = 5.0,
    ) -> None:
        self._nc = nc
        self._next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self._credit = credit
        self._deliver = deliver
        self._expires_s = expires_s
        self._wanted = asyncio.Event()  # set when credit may have grown
        self._request_over = asyncio.Event()
        self._left = 0

    def credit_changed(self) -> None:
        """Call (on the loop) whenever an actor becomes idle."""
        self._wanted.set()

    async def run(self) -> None:
        inbox = self._nc.new_inbox()
        sub = await self._nc.subscribe(inbox, cb=self._on_message)
        try:
            while True:
                n = self._credit()
                if n <= 0:
                    self._wanted.clear()
                    await self._wanted.wait()
                    continue
                self._left = n
                self._request_over.clear()
                request = {"batch": n, "expires": int(self._expires_s * 1e9)}
                try:
                    await self._nc.publish(
                        self._next_subject, json.dumps(request).encode(), reply=inbox
                    )
                except Exception as exc:  # NATS restarting: keep asking
                    log.warning("pull request on %s failed: %r", self._next_subject, exc)
                    await asyncio.sleep(0.5)
                    continue
                # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that
                # arrives as the request ends, and the puller then never stops.
                await wait_until_set(self._request_over, self._expires_s + 1.0)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _on_message(self, msg: Msg) -> None:
        status = (msg.headers or {}).get("Status")
        if status is None:
            self._left -= 1
            if self._left <= 0:
                self._request_over.set()
            self._deliver(msg)
        elif status != _HEARTBEAT:
            self._request_over.set()  # expired, no messages, or refused: ask anew


async def wait_until_set(event: asyncio.Event, timeout: float) -> None:
    """Wait until ``event`` is set, setting it after ``timeout`` seconds if nothing else
    has: callers that must tell a timeout apart look at what they were waiting for."""
    timer = asyncio.get_running_loop().call_later(timeout, event.set)
    try:
        await event.wait()
    finally:
        timer.cancel()


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]], every_s: float = 0.1) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again, every
    ``every_s``, those still running. On Python 3.11, ``asyncio.wait_for`` (which every
    nats-py request awaits) swallows a cancellation that arrives together with its answer,
    and the task goes on to wait for something else; cancelled once, a read model stopped
    just after it started waited out its whole stop timeout. A task that ignores every
    cancellation still holds this up: callers bound it."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=every_s)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # retrieved: nothing to report about a task stopped on purpose
