"""A task's page: what it is doing now, its facts, and its trajectory as a timeline.

The timeline is the task's trajectory (``projections.trajectory.build_trajectory``), one
item per step, each drawn from the event it was built from: the conductor's decisions
(mode, options, reason, suggestion, and its LLM exchange when it asked one), each agent's
LLM turns (prompt and answer, parsed output), tool calls, the verifier's checks (verdict,
feedback, the attempt's code and its diff from the attempt before), failures, and the end
with its rewards. What the task does now comes from its state (``task_state.fold``).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import Any

from kernelflow.cli.ui.html import (
    badge,
    clock,
    esc,
    folded,
    group_link,
    number,
    pre,
    seconds,
    task_link,
    task_speedup,
    ticking,
)
from kernelflow.events.model import (
    TERMINAL_EVENTS,
    AgentFailed,
    ConductorDecided,
    Event,
    LLMCalled,
    ParseFailed,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.projections.metrics import MetricsProjection, TaskMetrics
from kernelflow.projections.speedups import report_conclusive, report_interval, speedup_text
from kernelflow.projections.task_state import TaskState, fold
from kernelflow.projections.trajectory import StepType, Trajectory, TrajectoryStep, build_trajectory


def task_fragment(task_id: str, events: Sequence[Event]) -> str:
    """The live part of a task's page (``events``: the task's, in order)."""
    state = fold(task_id, events)
    trajectory = build_trajectory(task_id, events)
    metrics = MetricsProjection().apply_all(enumerate(events, 1)).tasks.get(task_id)
    by_id = {e.event_id: e for e in events}
    return "".join(
        (
            f"<h1>task {esc(task_id)}</h1>",
            doing_now(state),
            facts(state, trajectory, metrics),
            "<h2>Timeline</h2>",
            _Timeline(trajectory, by_id, state.decisions).render(),
        )
    )


def doing_now(state: TaskState) -> str:
    """One line on what a running task waits for: the agent at work, or the conductor."""
    if state.terminal is not None:
        return ""
    current = state.current
    if current is None:
        what = "the conductor is choosing the first agent"
        since = state.submitted.at if state.submitted is not None else None
    elif current.result is None:
        calls = len(current.llm_calls)
        tools = len(current.tool_calls)
        done = ", ".join(n for n in (_count(calls, "LLM call"), _count(tools, "tool call")) if n)
        what = f"{current.agent} is running (step {state.step}" + (
            f"; {done} so far)" if done else ")"
        )
        since = current.event.at
    else:
        what = f"the conductor is deciding what follows {current.agent}"
        since = current.result.at
    running_for = f" — for {ticking(since)}" if since else ""
    return f'<p class="card now" id="now">Now: {esc(what)}{running_for}</p>'


def _count(n: int, what: str) -> str:
    return "" if not n else f"{n} {what}" + ("s" if n != 1 else "")


def facts(state: TaskState, trajectory: Trajectory, t: TaskMetrics | None) -> str:
    meta = trajectory.metadata
    status = t.status if t is not None else str(meta.get("status", "running"))
    rows: list[tuple[str, str]] = [("status", badge(status))]
    if state.terminal is not None and (reason := getattr(state.terminal, "reason", "")):
        rows.append(("reason", esc(reason)))
    sub = state.submitted
    if sub is not None:
        rows += [
            ("task", esc(sub.task_name or "—")),
            ("workflow", esc(sub.workflow_name)),
            ("backend", esc(sub.backend)),
        ]
        if sub.group_id:
            rows.append(("group", group_link(sub.group_id)))
        if (origin := sub.forked_from) is not None:  # docs/workflows.md, "Forking a task"
            copied = f"at event {origin.at}: its steps up to there are copied, as recorded"
            rows.append(("forked from", f"{task_link(origin.task_id)} {copied}"))
        rows.append(("submitted", clock(sub.at)))
    if t is not None:
        wall = t.wall_s
        took = seconds(wall) if wall is not None else (ticking(sub.at) if sub else "—")
        rows.append(("time", took))
        rows.append(("steps", str(t.steps)))
        rows.append(("verifications", " → ".join(badge(v) for v in t.verdicts) or "none"))
        if t.final_verdict is not None:
            rows.append(("final verdict", badge(t.final_verdict)))
        for version, verdict, *_ in t.revisions:  # kernelflow reverify
            rows.append((f"checked again (verifier {version})", badge(verdict)))
        rows.append(("speedup", task_speedup(t)))
        if t.final_verdict == "pass" and t.final_sol_fraction is not None:
            # The final kernel against the machine's limit (docs/verifier.md).
            rows.append(("speed-of-light", f"{t.final_sol_fraction:.0%}"))
        tokens = f"{t.llm_calls} calls, {t.total_tokens:,} tokens"
        if t.cost_usd is not None:
            tokens += f", ${t.cost_usd:.4f}"
        rows.append(("LLM", tokens))
    rewards = meta.get("rewards") or {}
    if rewards:
        rows.append(("rewards", _rewards(rewards)))
    items = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows)
    return f'<div class="card"><dl class="facts">{items}</dl></div>'


def _rewards(rewards: dict[str, Any]) -> str:
    return ", ".join(f"{esc(name)} = {esc(number(float(v), 3))}" for name, v in rewards.items())


def code_diff(before: str, after: str, old: str, new: str) -> str:
    """A unified diff of two attempts' code, each line escaped, added and removed lines
    marked."""
    lines = list(
        difflib.unified_diff(before.splitlines(), after.splitlines(), old, new, lineterm="")
    )
    if not lines:
        return '<p class="muted">the same code as the attempt before</p>'
    spans = []
    for line in lines:
        kind = ""
        if line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+") and not line.startswith("+++"):
            kind = "add"
        elif line.startswith("-") and not line.startswith("---"):
            kind = "del"
        spans.append(f'<span class="{kind}">{esc(line) or " "}</span>')
    return '<pre class="diff">' + "".join(spans) + "</pre>"


def _messages(messages: list[dict[str, Any]]) -> str:
    return "".join(
        f'<div class="msg"><div class="role">{esc(m.get("role", ""))}</div>'
        f"{pre(m.get('content', ''))}</div>"
        for m in messages
    )


class _Timeline:
    """One ``<li>`` per trajectory step, drawn from the event behind it."""

    def __init__(
        self, trajectory: Trajectory, by_id: dict[str, Event], decisions: list[ConductorDecided]
    ) -> None:
        self.t = trajectory
        self.by_id = by_id
        # A decision's step is named by the LLM call it made, when it made one: the
        # decisions are matched to the steps of thought in order instead.
        self.decisions = iter(decisions)
        self.start = float(trajectory.metadata.get("submitted_at") or 0.0)
        self.attempts: list[str] = []  # the code of each verification so far

    def render(self) -> str:
        items = [self.step(i, s) for i, s in enumerate(self.t.steps)]
        return '<ol class="timeline">' + "".join(i for i in items if i) + "</ol>"

    def step(self, i: int, s: TrajectoryStep) -> str:
        ident = f"s{i}"
        if s.step_type == StepType.THOUGHT:
            decision = next(self.decisions, None)
            return self.decided(ident, decision, s) if decision is not None else ""
        e = self.by_id.get(str(s.metadata.get("event", "")))
        if isinstance(e, TaskSubmitted):
            return self.submitted(ident, e)
        if isinstance(e, LLMCalled):
            return self.answered(ident, e, s)
        if isinstance(e, ToolCalled):
            # The call and its result are two steps of one event: drawn once.
            return self.tool(ident, e) if s.step_type == StepType.ACTION else ""
        if isinstance(e, VerificationCompleted):
            return self.verified(ident, e)
        if isinstance(e, ParseFailed | AgentFailed):
            what = "could not parse its output" if isinstance(e, ParseFailed) else "failed"
            reason = e.reason if isinstance(e, ParseFailed) else e.error
            return self.item("failure", ident, e, f"{esc(e.agent)} {what}", pre(reason))
        if isinstance(e, TERMINAL_EVENTS):
            return self.ended(ident, e)
        return self.item("", ident, e, esc(s.step_type), pre(s.content))

    def item(self, cls: str, ident: str, e: Event | None, head: str, body: str) -> str:
        when = ""
        if e is not None and self.start:
            when = f'<span class="when">+{e.at - self.start:.1f} s</span>'
        return f'<li class="{cls}" id="{ident}">{when}<div class="head">{head}</div>{body}</li>'

    def submitted(self, ident: str, e: TaskSubmitted) -> str:
        body = folded("task source", pre(e.task_source), ident=f"{ident}-src")
        if e.prompt is not None:
            body = pre(e.prompt) + body
        if e.candidate_code:
            body += folded("candidate it starts from", pre(e.candidate_code), ident=f"{ident}-c")
        head = f"submitted: {esc(e.task_name or e.task_id)} on workflow {esc(e.workflow_name)}"
        return self.item("", ident, e, head, body)

    def decided(self, ident: str, e: ConductorDecided, s: TrajectoryStep) -> str:
        head = (
            f"conductor after {esc(e.after_agent or 'the start')} → <b>{esc(e.chosen)}</b> "
            f"{badge(e.mode)}"
        )
        body = f'<p>{esc(e.reason)}</p><p class="muted">options: {esc(", ".join(e.options))}</p>'
        if e.removed:
            removed = "; ".join(
                f"{r.agent} ({r.limit}{' ' + r.sequence if r.sequence else ''}: "
                f"{r.count} of {r.maximum})"
                for r in e.removed
            )
            body += f'<p class="muted">removed by limits: {esc(removed)}</p>'
        if e.suggestion:
            body += "<div>suggestion to the next agent:</div>" + pre(e.suggestion)
        if "llm_response" in s.metadata:
            exchange = _messages(s.metadata.get("messages") or []) + (
                "<div>the conductor's LLM answered:</div>" + pre(s.metadata["llm_response"])
            )
            body += folded("the conductor's LLM exchange", exchange, ident=f"{ident}-llm")
        return self.item("decision", ident, e, head, body)

    def answered(self, ident: str, e: LLMCalled, s: TrajectoryStep) -> str:
        tokens = e.usage.input_tokens + e.usage.output_tokens
        head = (
            f"{esc(e.agent)} answered "
            f'<span class="muted">({esc(e.model or e.provider)}, {tokens:,} tokens, '
            f"{e.latency_s:.1f} s)</span>"
        )
        prompt = s.metadata.get("messages") or []
        body = folded(
            f"prompt ({len(prompt)} messages)", _messages(prompt), ident=f"{ident}-prompt"
        )
        body += pre(e.response_text, "reply")
        if e.tool_calls:
            calls = "\n".join(f"{c.name}({json.dumps(c.args)})" for c in e.tool_calls)
            body += "<div>tool calls:</div>" + pre(calls)
        if (output := s.metadata.get("output")) is not None:
            shown = json.dumps(output, indent=2, ensure_ascii=False)
            body += folded("parsed output", pre(shown), ident=f"{ident}-out")
        return self.item("answer", ident, e, head, body)

    def tool(self, ident: str, e: ToolCalled) -> str:
        outcome = badge("ok") if e.ok else badge("failed")
        head = f"{esc(e.agent)} called {esc(e.tool)} {outcome}"
        body = pre(json.dumps(e.args, indent=2, ensure_ascii=False))
        if e.error:
            body += pre(e.error)
        body += folded(
            f"output{' (truncated)' if e.truncated else ''}", pre(e.output), ident=f"{ident}-out"
        )
        return self.item("tool", ident, e, head, body)

    def verified(self, ident: str, e: VerificationCompleted) -> str:
        r = e.report
        n = len(self.attempts) + 1
        head = f"{esc(e.agent)}: {badge(r.verdict)} attempt {n}"
        extra = [x for x in (r.device, r.backend) if x]
        if r.speedup is not None:
            shown = speedup_text(r.speedup, report_interval(r), report_conclusive(r))
            extra.insert(0, f"speedup {shown}")
        if r.roofline is not None:
            extra.insert(1, f"{r.roofline.sol_fraction:.0%} of speed-of-light ({r.roofline.bound})")
        extra.append(seconds(r.duration_s))
        head += f' <span class="muted">({esc(", ".join(extra))})</span>'
        body = f"<p>{esc(r.summary)}</p>"
        if r.feedback:
            body += "<div>feedback to the agent:</div>" + pre(r.feedback)
        elif problems := [*r.errors, *r.mismatches, *r.reasons]:
            body += pre("\n".join(problems))
        body += folded(f"code of attempt {n}", pre(e.code), ident=f"{ident}-code")
        if self.attempts:
            diff = code_diff(self.attempts[-1], e.code, f"attempt {n - 1}", f"attempt {n}")
            body += folded(f"diff from attempt {n - 1}", diff, ident=f"{ident}-diff", is_open=True)
        self.attempts.append(e.code)
        cls = "verify ok" if r.passed else "verify bad"
        return self.item(cls, ident, e, head, body)

    def ended(self, ident: str, e: Event) -> str:
        status = str(self.t.metadata.get("status") or e.kind)
        reason = getattr(e, "reason", "")
        body = f"<p>{esc(reason)}</p>" if reason else ""
        if isinstance(e, TaskFinished):
            if e.final_answer is not None:
                body += "<div>final answer:</div>" + pre(e.final_answer)
            if e.final_code:
                body += folded("final code", pre(e.final_code), ident=f"{ident}-code")
        rewards = self.t.metadata.get("rewards") or {}
        if rewards:
            body += f"<p>rewards: {_rewards(rewards)}</p>"
        for check in self.t.metadata.get("reverified") or []:
            body += (
                f'<p class="muted">checked again by verifier v{esc(check.get("verifier_version"))}'
                f": {badge(check.get('verdict'))} {esc(check.get('summary', ''))}</p>"
            )
        return self.item("end", ident, e, f"ended: {badge(status)}", body)
