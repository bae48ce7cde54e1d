"""``kernelflow report``: run metrics as terminal tables (pure: strings in, strings out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from kernelflow.projections.metrics import RunMetrics, TaskMetrics


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def task_rows(tasks: Sequence[TaskMetrics]) -> str:
    rows = [
        [
            t.task_id,
            t.task_name,
            t.workflow,
            t.status,
            t.steps,
            t.llm_calls,
            t.total_tokens,
            t.cost_usd,
            t.wall_s,
            " ".join(t.verdicts) or "-",
            t.best_speedup,
        ]
        for t in sorted(tasks, key=lambda t: (t.submitted_at or 0.0, t.task_id))
    ]
    headers = [
        "task",
        "name",
        "workflow",
        "status",
        "steps",
        "llm",
        "tokens",
        "cost$",
        "wall_s",
        "verdicts",
        "best_x",
    ]
    return table(headers, rows)


def summary_rows(metrics: dict[str, RunMetrics]) -> str:
    fast_keys = next(iter(metrics.values())).fast_p.keys() if metrics else []
    headers = ["scope", "tasks", "ended", "correct", *fast_keys, "geomean_x", "steps", "wall_s"]
    rows = [
        [
            name,
            m.tasks,
            m.ended,
            _pct(m.correctness_rate),
            *(_pct(m.fast_p[k]) for k in fast_keys),
            m.geomean_speedup,
            m.mean_steps,
            m.mean_wall_s,
        ]
        for name, m in metrics.items()
    ]
    return table(headers, rows)


def agent_rows(m: RunMetrics) -> str:
    agents = sorted(set(m.agents) | set(m.agent_latency) | set(m.llm_latency))
    rows = []
    for a in agents:
        s, d, c = m.agents.get(a), m.agent_latency.get(a), m.llm_latency.get(a)
        rows.append(
            [
                a,
                s.runs if s else 0,
                s.successes if s else 0,
                s.failures if s else 0,
                _pct(s.success_rate) if s else "-",
                s.total_s if s else None,
                s.mean_s if s else None,
                d.p50_s if d else None,
                d.p90_s if d else None,
                d.max_s if d else None,
                c.count if c else 0,
                c.mean_s if c else None,
                s.tool_calls if s else 0,
            ]
        )
    headers = [
        "agent",
        "runs",
        "ok",
        "failed",
        "ok%",
        "total_s",
        "mean_s",
        "p50_s",
        "p90_s",
        "max_s",
        "llm_calls",
        "llm_mean_s",
        "tool_calls",
    ]
    return table(headers, rows)


def tool_rows(m: RunMetrics) -> str:
    rows = [
        [name, t.calls, t.successes, t.failures, _pct(t.success_rate), t.truncated, t.mean_s]
        for name, t in m.tools.items()
    ]
    return table(["tool", "calls", "ok", "failed", "ok%", "truncated", "mean_s"], rows)


def report_text(
    overall: RunMetrics, per_workflow: dict[str, RunMetrics], tasks: Sequence[TaskMetrics]
) -> str:
    parts = [
        "Tasks",
        task_rows(tasks),
        "",
        "Summary (rates over tasks that ended)",
        summary_rows({"all": overall, **{f"workflow {k}": v for k, v in per_workflow.items()}}),
        "",
        "Verdicts: "
        + (", ".join(f"{k} {v}" for k, v in overall.verdicts.items()) or "none")
        + f"   statuses: {', '.join(f'{k} {v}' for k, v in overall.statuses.items()) or 'none'}",
        f"LLM calls: {overall.llm_calls}   tool calls: {overall.tool_calls}   tokens: "
        f"{overall.total_tokens}   cost: "
        + ("-" if overall.cost_usd is None else f"${overall.cost_usd:.4f}"),
    ]
    if overall.rewards_mean:
        parts.append(
            "Mean recorded reward: "
            + ", ".join(f"{k} {v:.3g}" for k, v in overall.rewards_mean.items())
        )
    if overall.agents or overall.agent_latency or overall.llm_latency:
        parts += ["", "Per agent (time: dispatch → result)", agent_rows(overall)]
    if overall.tools:
        parts += ["", f"Per tool ({overall.tool_calls} calls)", tool_rows(overall)]
    return "\n".join(parts)


def report_json(
    overall: RunMetrics, per_workflow: dict[str, RunMetrics], tasks: Sequence[TaskMetrics]
) -> dict[str, Any]:
    return {
        "overall": msgspec.to_builtins(overall),
        "per_workflow": {k: msgspec.to_builtins(v) for k, v in per_workflow.items()},
        "tasks": [
            {**msgspec.to_builtins(t), "wall_s": t.wall_s, "total_tokens": t.total_tokens}
            for t in sorted(tasks, key=lambda t: t.task_id)
        ],
    }
