"""How events, tasks and trajectories look in a terminal."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    ConductorDecided,
    Event,
    KernelReverified,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RewardAssigned,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    ToolCalled,
    UnknownEvent,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.counters import RepeatCounters
from kernelflow.projections.speedups import report_conclusive, report_interval, speedup_text
from kernelflow.projections.task_state import TaskState
from kernelflow.projections.trajectory import Trajectory
from kernelflow.workflows.model import Workflow
from kernelflow.workflows.rules import removal_text


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
        limited = ", ".join(f"{r.agent} ({r.limit} {r.count}/{r.maximum})" for r in e.removed)
        return f"conductor {after}→ {e.chosen} [{e.mode}: {_first_line(e.reason, 70)}]" + (
            f" limits removed {limited}" if limited else ""
        )
    if isinstance(e, AgentDispatched):
        return f"step {e.step}: {e.agent}"
    if isinstance(e, LLMCalled):
        tokens = e.usage.input_tokens + e.usage.output_tokens
        return (
            f"  {e.agent} LLM call: {tokens} tokens in {e.latency_s:.2f}s ({e.provider}/{e.model})"
        )
    if isinstance(e, ToolCalled):
        outcome = "ok" if e.ok else f"failed: {_first_line(e.error, 70)}"
        return f"  {e.agent} → {e.tool} in {e.duration_s:.2f}s: {outcome}"
    if isinstance(e, OutputParsed):
        sizes = ", ".join(f"{k} ({len(str(v))} chars)" for k, v in e.fields.items())
        return f"  {e.agent} output: {sizes}"
    if isinstance(e, ParseFailed):
        return f"  {e.agent} output did not parse: {_first_line(e.reason)}"
    if isinstance(e, AgentFailed):
        return f"  {e.agent} failed: {_first_line(e.error)}"
    if isinstance(e, VerificationCompleted):
        r = e.report
        speed = ""
        if r.speedup is not None:
            # The summary after it says between what: the line keeps to one word.
            inconclusive = report_conclusive(r) is False
            speed = ", speedup " + ("inconclusive" if inconclusive else f"{r.speedup:.2f}x")
        where = f"on {r.device or '?'} in {r.duration_s:.1f}s{speed}"
        return f"  verifier: {r.verdict.upper()} {where} — {_first_line(r.summary, 90)}"
    if isinstance(e, TaskFinished):
        return f"finished: {e.status} — {_first_line(e.reason)}"
    if isinstance(e, TaskRejected):
        return f"rejected: {e.reason}"
    if isinstance(e, TaskCancelled):
        return f"cancelled: {e.reason}"
    if isinstance(e, RewardAssigned):
        return f"reward {e.reward_fn}@{e.version}: {e.value:g}"
    if isinstance(e, KernelReverified):
        r = e.report
        return f"checked again by verifier {r.verifier_version}: {r.verdict.upper()} — {r.summary}"
    if isinstance(e, UnknownEvent):
        return f"{e.kind} (a kind this kernelflow does not know)"
    return e.kind


def unknown_kinds_note(events: Iterable[Event]) -> str | None:
    """A line for stderr when some events are of kinds this version does not know (a newer
    kernelflow wrote them): every view skips them, and says so."""
    kinds = Counter(e.kind for e in events if isinstance(e, UnknownEvent))
    if not kinds:
        return None
    listed = ", ".join(f"{kind} x{n}" for kind, n in sorted(kinds.items()))
    return (
        f"note: skipped {kinds.total()} event(s) of kinds this kernelflow does not know "
        f"({listed}): a newer kernelflow wrote them; upgrade to see them"
    )


def summary(state: TaskState) -> dict[str, Any]:
    """A task's outcome so far, as ``kernelflow run --json`` and ``status`` show it."""
    end = state.terminal
    status = (
        end.status
        if isinstance(end, TaskFinished)
        else (end.kind.removeprefix("task_") if end else "running")
    )
    finished = state.finished
    kept = state.final_check if finished else None
    last = kept.report if kept else None
    conclusive = None
    if finished is not None and finished.speedup is not None:
        conclusive = finished.speedup_conclusive
        if conclusive is None and last is not None:
            conclusive = report_conclusive(last)
    return {
        "task_id": state.task_id,
        "status": status,
        "steps": state.step,
        "verdict": finished.verdict if finished else None,
        "speedup": finished.speedup if finished else None,
        # Whether that speedup says anything, and its 95 % range (kernelflow.projections
        # .speedups): an inconclusive one is printed as such, never as a bare number.
        "speedup_conclusive": conclusive,
        "speedup_ci95": list(report_interval(last)) if last and conclusive is not None else [],
        # The final kernel's fraction of speed-of-light (docs/verifier.md); None: not counted.
        "sol_fraction": last.sol_fraction if last is not None and last.passed else None,
        "reason": getattr(end, "reason", None),
        "verifications": [v.report.verdict for v in state.verifications],
        # Later checks of the final kernel by newer verifiers (kernelflow reverify).
        "rechecks": [
            {"verifier_version": r.report.verifier_version, "verdict": r.report.verdict}
            for r in state.reverified
        ],
        "final_code": finished.final_code if finished else None,
        "events": state.events_seen,
        "forked_from": fork_origin(state.submitted),
    }


def fork_origin(submitted: TaskSubmitted | None) -> dict[str, Any] | None:
    """Where a fork came from (``task_id``, ``at``); None for a task that is no fork."""
    origin = submitted.forked_from if submitted is not None else None
    return None if origin is None else {"task_id": origin.task_id, "at": origin.at}


def fork_tree(rows: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Status rows as the tree their forks make (docs/workflows.md, "Forking a task"):
    each fork under the task it was forked from, with its depth; a fork whose original is
    not among the rows stands at the top. Otherwise in the rows' order."""
    ids = {row["task_id"] for row in rows}
    children: dict[str, list[dict[str, Any]]] = {}
    tops = []
    for row in rows:
        origin = row.get("forked_from")
        if origin and origin["task_id"] in ids and origin["task_id"] != row["task_id"]:
            children.setdefault(origin["task_id"], []).append(row)
        else:
            tops.append(row)
    ordered: list[tuple[int, dict[str, Any]]] = []
    stack = [(0, row) for row in reversed(tops)]
    while stack:
        depth, row = stack.pop()
        ordered.append((depth, row))
        stack.extend((depth + 1, child) for child in reversed(children.get(row["task_id"], [])))
    shown = {id(row) for _, row in ordered}
    # Rows that only name each other (a log written by hand): at the top, not lost.
    return ordered + [(0, row) for row in rows if id(row) not in shown]


def report_speedup_text(report: VerificationReport) -> str:
    """A verification's speedup in words: ``1.70x``, ``inconclusive (between 0.03x and
    10.57x): the machine was busy``, or ``not timed``."""
    return speedup_text(
        report.speedup, report_interval(report), report_conclusive(report), untimed="not timed"
    )


def row_speedup_text(row: dict[str, Any]) -> str:
    """The speedup of a ``status`` row (:func:`summary`, the read model's rows) in words,
    with the kernel's fraction of speed-of-light where it was counted."""
    text = speedup_text(
        row.get("speedup"),
        row.get("speedup_ci95") or (),
        row.get("speedup_conclusive"),
        untimed="not timed",
    )
    sol = row.get("sol_fraction")
    return text if sol is None else f"{text}; {sol:.0%} of speed-of-light"


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


def counters_view(
    counters: RepeatCounters,
    workflow: Workflow,
    decisions: Sequence[tuple[ConductorDecided, RepeatCounters]] = (),
) -> dict[str, Any]:
    """The repeat-limit counters next to the limits they are checked against: now, and at
    each of ``decisions`` (each with the counters it was decided on)."""
    return {
        "workflow": workflow.name,
        "step": counters.step,
        "max_step": workflow.max_step,
        "consecutive": {
            agent: {
                "runs": counters.consecutive(agent),
                "limit": workflow.single_agent_limit(agent),
            }
            for agent in workflow.agents
        },
        "sequences": {
            s.name: {
                "pattern": list(s.pattern),
                "repeats": counters.sequence_repeats(s.name),
                "max_repeats": s.max_repeats,
            }
            for s in workflow.sequences
        },
        "decisions": [_decision_counters(d, c, workflow) for d, c in decisions],
    }


def _decision_counters(
    decision: ConductorDecided, counters: RepeatCounters, workflow: Workflow
) -> dict[str, Any]:
    return {
        "seq": decision.seq,
        "after_agent": decision.after_agent,
        "chosen": decision.chosen,
        "mode": decision.mode,
        "options": list(decision.options),
        "removed": [{**msgspec.to_builtins(r), "why": removal_text(r)} for r in decision.removed],
        "step": counters.step,
        "consecutive": {agent: counters.consecutive(agent) for agent in workflow.agents},
        "sequences": {s.name: counters.sequence_repeats(s.name) for s in workflow.sequences},
    }


def counters_text(view: dict[str, Any]) -> str:
    lines = [f"workflow {view['workflow']}: step {view['step']} of max_step {view['max_step']}"]
    for agent, c in view["consecutive"].items():
        lines.append(f"  {agent:<12} {c['runs']} in a row (single_agent limit {c['limit']})")
    for name, seq in view["sequences"].items():
        pattern = " → ".join(seq["pattern"])
        lines.append(
            f"  {name:<12} {seq['repeats']} x [{pattern}] (max_repeats {seq['max_repeats']})"
        )
    if view["decisions"]:
        lines.append("at each decision, the counters it was decided on:")
    for d in view["decisions"]:
        lines.append("  " + _decision_line(d, view))
        lines.extend(f"      removed {r['agent']}: {r['why']}" for r in d["removed"])
    return "\n".join(lines)


def _decision_line(d: dict[str, Any], view: dict[str, Any]) -> str:
    after = f"after {d['after_agent']}" if d["after_agent"] else "start"
    counts = [f"step {d['step']}/{view['max_step']}"]
    counts += [
        f"{agent} {runs}/{view['consecutive'][agent]['limit']} in a row"
        for agent, runs in d["consecutive"].items()
        if runs
    ]
    counts += [
        f"{name} {repeats}/{view['sequences'][name]['max_repeats']}"
        for name, repeats in d["sequences"].items()
    ]
    where = f"#{d['seq']} {after}"
    return f"{where:<20} → {d['chosen']:<10} [{d['mode']}]  {', '.join(counts)}"


def workflow_text(workflow: Workflow) -> str:
    lines = [
        f"workflow {workflow.name}: start at {workflow.start_agent}, max_step {workflow.max_step}"
    ]
    for agent in workflow.agents.values():
        fields = ", ".join(
            f"{f.name}:{f.field_type}{'' if f.mandatory else '?'}" for f in agent.output_fields
        )
        mandatory = " [LLM analysis]" if agent.name in workflow.mandatory_llm_analysis else ""
        how = ""
        if agent.kind != "llm" or agent.tools:
            tools = f" with {', '.join(agent.tools)}" if agent.tools else ""
            how = f"   [{agent.kind}{tools}]"
        lines.append(
            f"  {agent.name:<12} → {', '.join(agent.possible_next) or '(nothing)'}{mandatory}"
            + (f"   output: {fields}" if fields else "")
            + how
        )
    limits = [f"{a} ≤ {n} in a row" for a, n in workflow.single_agent_limits.items()]
    limits += [
        f"{s.name} [{' → '.join(s.pattern)}] ≤ {s.max_repeats} repeats" for s in workflow.sequences
    ]
    lines.append(
        "  limits: " + ("; ".join(limits) if limits else "single_agent ≤ 3 in a row (default)")
    )
    return "\n".join(lines)
