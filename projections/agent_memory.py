"""A task's memory: what its agents did so far, one structured record per finished
dispatch, folded from the task's events (docs/workflows.md, "agentflow").

This is AgentFlow's evolving memory M^t, updated deterministically after every turn: a
record holds the turn and step it belongs to, when it ended (seconds since the task was
submitted), the agent, its parsed answer (the planner's action, the verifier's verdict),
the tool calls it made with their results, and the error signals (an answer that did not
parse, an agent that failed, a tool that failed, a verification that did not pass). A
turn begins each time the task's first agent runs after another. Nothing else holds it:
the same events give the same memory on any daemon and in a replay, and the prompts that
render it (``$memory``) are rebuilt from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kernelflow.events.model import (
    AgentFailed,
    OutputParsed,
    ParseFailed,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.projections.task_state import Dispatch, TaskState

# A memory is shown to a model in every prompt: each value is cut to this many characters.
MAX_VALUE_CHARS = 2000
EMPTY = "(nothing yet: this is the first turn)"


@dataclass(frozen=True)
class ToolRecord:
    tool: str
    args: dict[str, Any]
    ok: bool
    output: str
    error: str = ""


@dataclass(frozen=True)
class MemoryRecord:
    turn: int  # from 1: a turn begins each time the task's first agent runs after another
    step: int  # the dispatch's step in the task, from 1
    agent: str
    elapsed_s: float  # when the dispatch ended, in seconds since the task was submitted
    answer: dict[str, Any]  # its parsed answer ({} when it gave none)
    tool_calls: tuple[ToolRecord, ...]
    error: str = ""  # why it gave no answer, or what its verification found


def memory(state: TaskState) -> list[MemoryRecord]:
    """The records of every dispatch of ``state`` that ended, in order."""
    if not state.dispatches or state.submitted is None:
        return []
    first, submitted_at = state.dispatches[0].agent, state.submitted.at
    records: list[MemoryRecord] = []
    turn, previous = 0, None
    for d in state.dispatches:
        if d.agent == first and previous != first:
            turn += 1
        previous = d.agent
        if d.result is None:
            continue
        records.append(
            MemoryRecord(
                turn=turn,
                step=d.event.step,
                agent=d.agent,
                elapsed_s=round(max(d.result.at - submitted_at, 0.0), 1),
                answer=dict(d.result.fields) if isinstance(d.result, OutputParsed) else {},
                tool_calls=tuple(_tool_record(t) for t in d.tool_calls),
                error=_error(d),
            )
        )
    return records


def _tool_record(call: ToolCalled) -> ToolRecord:
    return ToolRecord(call.tool, dict(call.args), call.ok, call.output, call.error)


def _error(d: Dispatch) -> str:
    result = d.result
    if isinstance(result, ParseFailed):
        return f"its answer did not parse: {result.reason}"
    if isinstance(result, AgentFailed):
        return f"it failed: {result.error}"
    if isinstance(result, VerificationCompleted) and not result.report.passed:
        return f"verification {result.report.verdict}: {result.report.summary}"
    return ""


def render_memory(records: list[MemoryRecord]) -> str:
    """The records as a prompt shows them: turn by turn, one entry per dispatch."""
    if not records:
        return EMPTY
    lines: list[str] = []
    turn = 0
    for r in records:
        if r.turn != turn:
            turn = r.turn
            lines.append(f"Turn {turn}:")
        lines.append(f"- step {r.step}, {r.agent} (at {r.elapsed_s:g}s):")
        lines += [f"    {name}: {_clip(value)}" for name, value in r.answer.items()]
        for call in r.tool_calls:
            args = ", ".join(f"{k}={v!r}" for k, v in call.args.items())
            result = call.output if call.ok else f"error: {call.error or call.output}"
            lines.append(f"    tool call {call.tool}({_clip(args)}) -> {_clip(result)}")
        if r.error:
            lines.append(f"    error signal: {_clip(r.error)}")
    return "\n".join(lines)


def _clip(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.strip()
    if len(text) > MAX_VALUE_CHARS:
        text = text[:MAX_VALUE_CHARS] + f" ... ({len(text) - MAX_VALUE_CHARS} more characters)"
    return text.replace("\n", "\n      ")
