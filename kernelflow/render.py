"""How events and trajectories look in a terminal."""

from __future__ import annotations

from events.model import (
    AgentDispatched,
    AgentFailed,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    VerificationCompleted,
)
from projections.trajectory import Trajectory


def _first_line(text: str, limit: int = 100) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def describe(event: Event) -> str:
    """One line saying what happened."""
    e = event
    if isinstance(e, TaskSubmitted):
        return f"submitted {e.task_name} (workflow {e.workflow_name}, backend {e.backend})"
    if isinstance(e, ConductorDecided):
        after = f"after {e.after_agent} " if e.after_agent else ""
        return f"conductor {after}→ {e.chosen} [{e.mode}: {_first_line(e.reason, 70)}]"
    if isinstance(e, AgentDispatched):
        return f"step {e.step}: {e.agent}"
    if isinstance(e, LLMCalled):
        tokens = e.usage.input_tokens + e.usage.output_tokens
        return (
            f"  {e.agent} LLM call: {tokens} tokens in {e.latency_s:.2f}s ({e.provider}/{e.model})"
        )
    if isinstance(e, OutputParsed):
        sizes = ", ".join(f"{k} ({len(str(v))} chars)" for k, v in e.fields.items())
        return f"  {e.agent} output: {sizes}"
    if isinstance(e, ParseFailed):
        return f"  {e.agent} output did not parse: {_first_line(e.reason)}"
    if isinstance(e, AgentFailed):
        return f"  {e.agent} failed: {_first_line(e.error)}"
    if isinstance(e, VerificationCompleted):
        r = e.report
        speed = f", speedup {r.speedup:.2f}x" if r.speedup is not None else ""
        where = f"on {r.device or '?'} in {r.duration_s:.1f}s{speed}"
        return f"  verifier: {r.verdict.upper()} {where} — {_first_line(r.summary, 90)}"
    if isinstance(e, TaskFinished):
        return f"finished: {e.status} — {_first_line(e.reason)}"
    if isinstance(e, TaskRejected):
        return f"rejected: {e.reason}"
    if isinstance(e, TaskCancelled):
        return f"cancelled: {e.reason}"
    return e.kind


def trajectory_text(t: Trajectory) -> str:
    status = t.metadata.get("status", "in progress")
    lines = [
        f"trajectory {t.request_id}: {t.metadata.get('task_name', '')} "
        f"[{status}] {len(t.steps)} steps, {t.total_tokens} tokens"
    ]
    for i, s in enumerate(t.steps, 1):
        who = s.tool_name or s.metadata.get("agent") or ""
        mark = "" if s.is_correct is None else (" ✓" if s.is_correct else " ✗")
        lines.append(
            f"{i:3d}. {s.step_type.value:<13} {who:<10}{mark} {_first_line(s.content, 80)}"
        )
    return "\n".join(lines)
