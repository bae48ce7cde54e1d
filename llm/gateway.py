"""What every HTTP provider shares: a concurrency limit, requests/min and tokens/min
limits, a per-attempt timeout, and retries with exponential backoff and jitter that
honour ``retry-after``. All of it runs on the bridge's event loop, so one gateway is a
process-wide limit for its endpoint, however many actors call through it.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from kernelflow.common.redact import scrub, secret_values
from kernelflow.llm.base import LLMError, LLMRequest
from kernelflow.llm.config import Limits

T = TypeVar("T")
log = logging.getLogger("kernelflow.llm")


class Transient(Exception):
    """An attempt failed in a way worth retrying (429, overloaded, 5xx, timeout, garbage)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (of a plausible length) replaced by ``***``, and
    whatever else looks like a credential (``kernelflow.common.redact.scrub``: a URL's
    user-info, a bearer token, this process's secret settings)."""
    return scrub(text, [s for s in (*secrets, *secret_values()) if len(s) >= 4])


class TokenBucket:
    """``per_minute`` units a minute, refilled continuously, holding at most
    ``window_s`` seconds' worth. Takers queue in order; usage reported after the fact
    may push the level below zero, which delays the next takers."""

    def __init__(self, per_minute: float, window_s: float = 60.0) -> None:
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, per_minute * window_s / 60.0)
        self.level = self.capacity
        self.stamp = time.monotonic()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = time.monotonic()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now

    async def take(self, amount: float) -> None:
        amount = min(amount, self.capacity)
        async with self._lock:
            while True:
                self._refill()
                if self.level >= amount:
                    self.level -= amount
                    return
                await asyncio.sleep((amount - self.level) / self.rate)

    def adjust(self, delta: float) -> None:
        """Charge ``delta`` more units (negative: give some back)."""
        self._refill()
        self.level = min(self.capacity, self.level - delta)


@dataclass(frozen=True)
class CallTiming:
    queued_s: float  # waiting for limits (slot, rate, cool-down) and between retries
    service_s: float  # the successful attempt, from holding a slot to the parsed answer
    retries: int


class Gateway:
    def __init__(self, name: str, limits: Limits, secrets: Iterable[str] = ()) -> None:
        self.name = name
        self.limits = limits
        self.secrets = [s for s in secrets if s]
        self._slots: asyncio.Semaphore | None = None
        self._requests = (
            TokenBucket(limits.requests_per_minute, limits.rate_window_s)
            if limits.requests_per_minute
            else None
        )
        self._tokens = (
            TokenBucket(limits.tokens_per_minute, limits.rate_window_s)
            if limits.tokens_per_minute
            else None
        )
        self._cool_until = 0.0
        self.in_flight = 0
        self.peak_in_flight = 0
        self.timings: deque[CallTiming] = deque(maxlen=100_000)

    @property
    def slots(self) -> asyncio.Semaphore:
        # Created on first use, on the loop that runs the calls.
        if self._slots is None:
            self._slots = asyncio.Semaphore(max(1, self.limits.max_concurrency))
        return self._slots

    def backoff(self, retry: int, retry_after: float | None) -> float:
        """Full-jitter exponential backoff; a server's retry-after is a floor."""
        ceiling = min(self.limits.backoff_max_s, self.limits.backoff_base_s * 2**retry)
        delay = random.uniform(0, ceiling)
        if retry_after is not None:
            delay = retry_after + random.uniform(0, min(1.0, 0.1 * retry_after + 0.05))
        return delay

    async def call(
        self, attempt: Callable[[], Awaitable[T]], *, estimated_tokens: int = 0
    ) -> tuple[T, int]:
        """Run ``attempt`` within the limits, retrying transient failures; returns its
        result and the number of retries. ``attempt`` raises ``Transient`` to be retried
        and ``LLMError`` to give up at once."""
        started = time.monotonic()
        retries = 0
        while True:
            wait = self._cool_until - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._requests is not None:
                await self._requests.take(1)
            if self._tokens is not None:
                await self._tokens.take(estimated_tokens)
            async with self.slots:
                self.in_flight += 1
                self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
                began = time.monotonic()
                try:
                    result = await asyncio.wait_for(attempt(), self.limits.timeout_s)
                except Transient as exc:
                    error: Transient = exc
                except TimeoutError:
                    error = Transient(f"no answer within {self.limits.timeout_s:g}s")
                else:
                    done = time.monotonic()
                    self.timings.append(CallTiming(began - started, done - began, retries))
                    return result, retries
                finally:
                    self.in_flight -= 1
            message = redact(str(error), self.secrets)
            if retries >= self.limits.max_retries:
                raise LLMError(f"{self.name}: gave up after {retries + 1} attempts: {message}")
            delay = self.backoff(retries, error.retry_after)
            if error.retry_after is not None:
                # The server told everyone to wait: hold back every call to it, not just this.
                self._cool_until = max(self._cool_until, time.monotonic() + error.retry_after)
            retries += 1
            log.warning("%s: %s; retry %d in %.2fs", self.name, message, retries, delay)
            await asyncio.sleep(delay)

    def used_tokens(self, estimated: int, actual: int) -> None:
        """Correct the tokens/min bucket once a call's real usage is known."""
        if self._tokens is not None:
            self._tokens.adjust(actual - estimated)


def estimate_tokens(texts: Iterable[str], max_tokens: int) -> int:
    """A cheap upper-ish estimate for the tokens/min limit: ~4 characters a token plus
    the room the answer may take."""
    return sum(len(t) for t in texts) // 4 + max_tokens


def shown_texts(request: LLMRequest) -> Iterator[str]:
    """Everything a request shows the model, for ``estimate_tokens``: the messages, the
    tool calls they carry and the tools offered (their schemas cost tokens too)."""
    for message in request.messages:
        yield message.content
        for call in message.tool_calls or ():
            yield json.dumps(call.args)
    if request.tools:
        yield json.dumps(request.tools)
