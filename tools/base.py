"""The tool interface: what an agent may call, with its limits.

A tool declares its parameters as JSON Schema (the OpenAI function format, which verl's
tool configs use too), runs asynchronously on the bridge loop and returns the text the
agent observes. ``run_tool`` wraps every call: it validates the arguments, enforces the
tool's time, output-size and rate limits, and turns every failure into an observation
(``ToolOutcome(ok=False, error=...)``) instead of an exception: a tool's failure is
information for the agent, never a crash of the task.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import jsonschema

from kernelflow.common.redact import scrub

if TYPE_CHECKING:
    from kernelflow.verification.engine import VerifierConfig


@dataclass(frozen=True)
class ToolLimits:
    timeout_s: float = 30.0
    max_output_chars: int = 8000
    calls_per_minute: int | None = None  # None: unlimited
    memory_mb: int | None = None  # for tools that run code (enforced by their sandbox)

    @property
    def work_timeout_s(self) -> float:
        """The limit for work a tool hands to a subprocess: a little under ``timeout_s``,
        so the tool still reports what the work printed before it was killed."""
        return self.timeout_s - min(1.0, 0.1 * self.timeout_s)


class CallWindow:
    """The calls made in the last minute (monotonic times), against a limit of calls per
    minute: kernelflow's tools' ``calls_per_minute`` and the AgenticRollout library's
    ``ToolLimits.rate_limit``."""

    def __init__(self) -> None:
        self.calls: deque[float] = deque()

    def take(self, now: float, per_minute: int | None) -> float | None:
        """Count a call made at ``now``: None, or, when ``per_minute`` calls were made in
        the last minute, the seconds until the next may be (the call is not counted)."""
        if per_minute is None:
            return None
        while self.calls and now - self.calls[0] >= 60.0:
            self.calls.popleft()
        if len(self.calls) >= per_minute:
            return 60.0 - (now - self.calls[0])
        self.calls.append(now)
        return None


class ToolError(Exception):
    """A failure the agent is shown as its observation (bad path, failing command...)."""


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the call it serves. ``files`` is the agent's workspace
    as the log records it (``kernelflow.tools.workspace``): file tools read it and declare
    their changes as pure effects, so the workspace is itself a projection of the log."""

    task_id: str
    agent: str
    files: Mapping[str, str] = field(default_factory=dict)
    task_source: str = ""
    backend: str = "triton"
    policy: str = "strict"  # the verifier's strictness policy of the task
    scratch_dir: Path | None = None  # where a tool may materialise files for a command
    # The configuration of the daemon's verifier (its extension cache, its node's timing
    # slots, its threads): what kernel tools check and time with. None: the defaults.
    verifier: VerifierConfig | None = None


@dataclass(frozen=True)
class ToolOutcome:
    ok: bool
    output: str
    error: str = ""
    truncated: bool = False
    duration_s: float = 0.0


class Tool(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]  # JSON Schema of the arguments object

    def __init__(self, limits: ToolLimits | None = None) -> None:
        self.limits = limits or self.default_limits()
        self._calls = CallWindow()

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return ToolLimits()

    def spec(self) -> dict[str, Any]:
        """The tool in the OpenAI function format (what providers offer the model)."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    @abstractmethod
    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        """Do the work; raise ToolError for a failure the agent should see."""

    def effect(self, files: Mapping[str, str], args: dict[str, Any]) -> dict[str, str] | None:
        """The workspace after a successful call with ``args``: a pure function of the
        workspace before it, or None for tools that change no files. The workspace
        projection replays it from the log."""
        return None

    def take_rate_slot(self, now: float) -> bool:
        """Count a call against ``calls_per_minute``; False when the limit is reached."""
        return self._calls.take(now, self.limits.calls_per_minute) is None


def arguments(
    required: dict[str, dict[str, Any]], optional: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments object: these properties, no others."""
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
    }


TEXT: dict[str, Any] = {"type": "string", "minLength": 1}  # a non-empty string argument


def argument_errors(tool: Tool, args: Any) -> str | None:
    """Why ``args`` do not match the tool's schema, or None."""
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(tool.parameters).iter_errors(args)
    )
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def truncate(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    note = f"\n[... output truncated: {len(text) - limit} more characters]"
    return text[:limit] + note, True


async def run_tool(tool: Tool, args: Any, ctx: ToolContext) -> ToolOutcome:
    """Call ``tool`` within its limits. Never raises (except cancellation). What it says is
    scrubbed of credentials: it goes into the log and the agent's next prompt."""
    started = time.monotonic()

    def failed(error: str) -> ToolOutcome:
        error = scrub(error)
        return ToolOutcome(
            ok=False, output=f"error: {error}", error=error, duration_s=time.monotonic() - started
        )

    problem = argument_errors(tool, args)
    if problem is not None:
        return failed(f"invalid arguments for {tool.name}: {problem}")
    if not tool.take_rate_slot(started):
        return failed(
            f"rate limit: {tool.name} allows {tool.limits.calls_per_minute} calls per minute"
        )
    try:
        output = await asyncio.wait_for(tool.run(args, ctx), tool.limits.timeout_s)
    except TimeoutError:
        return failed(f"{tool.name} timed out after {tool.limits.timeout_s:g}s")
    except ToolError as exc:
        return failed(str(exc))
    except Exception as exc:  # a bug in a tool is still only an observation for the agent
        return failed(f"{tool.name} failed: {type(exc).__name__}: {exc}")
    text, truncated = truncate(scrub(output), tool.limits.max_output_chars)
    return ToolOutcome(
        ok=True, output=text, truncated=truncated, duration_s=time.monotonic() - started
    )
