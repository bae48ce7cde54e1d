"""What bounds an agent's calls (docs/agents.md, "Tool limits, retries and the cache"):
a tool's limits as the AgenticRollout document declares them (``ToolLimits``), the
retries of a failing tool or LLM call (``RetryPolicy``), and the optional cache of tool
results (``ToolResultCache``).

Each is applied where the call is made (``kernelflow.agentic_rollout.session``): a call
the log already holds is read back, never made again, so nothing here runs for it.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ToolLimits:
    """A tool's limits (docs/agents.md). ``max_execution_time``: seconds a call may take;
    ``max_output_size``: bytes (UTF-8) of its result the model is shown, the rest cut with
    a marker; ``rate_limit``: calls a minute (None: unlimited), a call beyond it refused as
    its observation; ``max_memory_usage``: bytes, for tools that run code in their own
    sandbox (an in-process tool's memory is not bounded here)."""

    max_execution_time: float = 30.0
    max_memory_usage: int = 100 * 1024**2
    max_output_size: int = 10 * 1024
    rate_limit: int | None = 10


@dataclass(frozen=True)
class RetryPolicy:
    """How a failing call is tried again: up to ``max_attempts`` in all, after
    ``backoff_s`` seconds, doubled after each failure up to ``max_backoff_s``, when what
    it raised is one of ``retry_on`` (transient failures: a lost connection, a timeout).
    ``RetryPolicy(max_attempts=1)`` never retries."""

    max_attempts: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    retry_on: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"RetryPolicy.max_attempts: at least 1, got {self.max_attempts}")

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> tuple[T, int]:
        """``attempt()`` until it succeeds or fails for good; what it gave and the
        failures before it (raises the last failure)."""
        delay = self.backoff_s
        for failures in range(self.max_attempts - 1):
            try:
                return await attempt(), failures
            except self.retry_on:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff_s)
        return await attempt(), self.max_attempts - 1


class ToolResultCache:
    """Results of successful tool calls by tool and arguments, the ``max_entries`` last
    used kept: a call asked again is answered from here (and recorded as any call)."""

    def __init__(self, max_entries: int = 256) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[str, Any] = OrderedDict()
        self.hits = 0

    @staticmethod
    def key(name: str, args: dict[str, Any]) -> str:
        return json.dumps([name, args], sort_keys=True, default=repr)

    def get(self, key: str) -> tuple[bool, Any]:
        if key not in self.entries:
            return False, None
        self.entries.move_to_end(key)
        self.hits += 1
        return True, self.entries[key]

    def put(self, key: str, result: Any) -> None:
        self.entries[key] = result
        self.entries.move_to_end(key)
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)


def cut_output(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` within ``max_bytes`` of UTF-8 (cut at a character), with a marker that
    says how much was cut; and whether it was."""
    data = text.encode()
    if len(data) <= max_bytes:
        return text, False
    kept = data[:max_bytes].decode(errors="ignore")
    return f"{kept}\n[... output cut: {len(data) - len(kept.encode())} more bytes]", True
