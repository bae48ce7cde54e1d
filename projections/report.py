"""``kernelflow report``: run metrics as terminal tables (pure: strings in, strings out);
and ``bench_text``, a bench run's results with its benchmark card (``kernelflow bench``,
the dashboard's bench page).

"finished" and "correct" are two columns: a task *finished* when it ended with status
``success`` (its workflow got to the end: a kernel passed, an answer was given); it is
*correct* when its own reward (its first reward function: ``binary@1`` for a kernel,
the first of ``rollout --reward`` for a prompt) is positive, as recorded (computed the same
way when a log has none recorded). For kernels the two agree; for prompt rollouts a
finished task may well have the wrong answer.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from kernelflow.projections.benchmark import ProblemResult, card_lines
from kernelflow.projections.flow_grpo import GrpoOptions, TaskReward, rollout_reward
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.rewards import REWARD_FUNCTIONS
from kernelflow.projections.speedups import inconclusive_note
from kernelflow.projections.statistics import RunMetrics

OWN_REWARD = GrpoOptions()  # each task scored by its own reward function


class Table(NamedTuple):
    """One table of the report: its title, column names and rows of display strings (the
    terminal and the HTML report show the same cells)."""

    title: str
    headers: list[str]
    rows: list[list[str]]


def render(t: Table) -> str:
    """A table as terminal text, without its title."""
    return table(t.headers, t.rows)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, cells)])


def wrapped_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], width: int) -> str:
    """``table``, its last column wrapped (at spaces, under itself) so that no line is
    longer than ``width``, as far as the other columns leave it 30 characters."""
    cells = [[_cell(c) for c in row] for row in rows]
    widths = [len(h) for h in headers[:-1]]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row[:-1], strict=False)]
    indent = sum(widths) + 2 * len(widths)
    room = max(30, width - indent)

    def lines(row: Sequence[str]) -> list[str]:
        lead = "  ".join(v.ljust(w) for v, w in zip(row[:-1], widths, strict=True)) + "  "
        last = textwrap.wrap(row[-1], room, break_on_hyphens=False) or [""]
        return [(lead if n == 0 else " " * indent) + text for n, text in enumerate(last)]

    rule = [*("-" * w for w in widths), "-" * min(room, max(len(headers[-1]), 6))]
    out = [*lines(list(headers)), *lines(rule)]
    for row in cells:
        out.extend(lines(row))
    return "\n".join(line.rstrip() for line in out)


def _cell(value: Any) -> str:
    """A table's cell for a person: three significant digits, never an exponent (a
    near-zero time reads ``<0.001``)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if 0 < abs(value) < 0.001:
            return "<0.001" if value > 0 else ">-0.001"
        return f"{value:.3g}" if abs(value) < 999.5 else f"{value:.0f}"
    return str(value)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def correct_by_reward(
    tasks: Iterable[TaskMetrics],
    facts: Mapping[str, TaskReward] | None = None,
    verifier_version: int | None = None,
) -> dict[str, bool]:
    """Ended task id → whether its own reward is positive (``facts``: each task's own
    reward function; without them, the first it recorded); kernels judged by their newest
    check, or by a verifier no newer than ``verifier_version``."""
    known = facts or {}
    own = own_reward(verifier_version)
    return {
        t.task_id: rollout_reward(t, own, known.get(t.task_id)).reward > 0 for t in tasks if t.ended
    }


def own_reward(verifier_version: int | None = None) -> GrpoOptions:
    """Each task scored by its own reward function, kernels judged by their newest check
    (or by a verifier no newer than ``verifier_version``)."""
    if verifier_version is None:
        return OWN_REWARD
    return GrpoOptions(verifier_version=verifier_version)


def correct_rate(tasks: Iterable[TaskMetrics], correct: Mapping[str, bool]) -> float | None:
    ended = [t.task_id for t in tasks if t.ended]
    return sum(correct.get(t, False) for t in ended) / len(ended) if ended else None


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def task_table(tasks: Sequence[TaskMetrics], correct: Mapping[str, bool]) -> Table:
    rows = [
        [
            t.task_id,
            t.task_name,
            t.workflow,
            t.status,
            _yes_no(correct.get(t.task_id)),
            t.steps,
            t.llm_calls,
            t.total_tokens,
            t.cost_usd,
            t.wall_s,
            " ".join(t.verdicts) or "-",
            t.best_speedup,
            # The final kernel's fraction of speed-of-light (docs/verifier.md).
            _pct(t.final_sol_fraction) if t.final_verdict == "pass" else "-",
            t.policy or "-",
            # A fork: its original and the event it was cut at; its counts are its own
            # work (docs/workflows.md, "Forking a task").
            f"{t.forked_from}@{t.fork_at}" if t.forked_from else "-",
        ]
        for t in sorted(tasks, key=lambda t: (t.submitted_at or 0.0, t.task_id))
    ]
    headers = [
        "task",
        "name",
        "workflow",
        "status",
        "correct",
        "steps",
        "llm",
        "tokens",
        "cost$",
        "wall_s",
        "verdicts",
        "best_x",
        "sol",
        "policy",
        "fork_of",
    ]
    return Table("Tasks", headers, _cells(rows))


def _cells(rows: Sequence[Sequence[Any]]) -> list[list[str]]:
    return [[_cell(c) for c in row] for row in rows]


def summary_table(
    metrics: dict[str, RunMetrics], correct_rates: Mapping[str, float | None] | None = None
) -> Table:
    """One row per scope: ``finished`` = status success, ``correct`` = own reward > 0 (both
    over the tasks that ended); ``correct_rates`` by scope name."""
    fast_keys = next(iter(metrics.values())).fast_p.keys() if metrics else []
    headers = [
        "scope",
        "tasks",
        "ended",
        "finished",
        "correct",
        *fast_keys,
        "geomean_x",
        "steps",
        "wall_s",
    ]
    rates = correct_rates or {}
    rows = [
        [
            name,
            m.tasks,
            m.ended,
            _pct(m.correctness_rate),
            _pct(rates.get(name)),
            *(_pct(m.fast_p[k]) for k in fast_keys),
            m.geomean_speedup,
            m.mean_steps,
            m.mean_wall_s,
        ]
        for name, m in metrics.items()
    ]
    return Table(
        "Summary (rates over tasks that ended; finished: status success, correct: own reward > 0)",
        headers,
        _cells(rows),
    )


def agent_table(m: RunMetrics) -> Table:
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
    return Table("Per agent (time: dispatch → result)", headers, _cells(rows))


def agent_rows(m: RunMetrics) -> str:
    return render(agent_table(m))


def tool_table(m: RunMetrics) -> Table:
    rows = [
        [name, t.calls, t.successes, t.failures, _pct(t.success_rate), t.truncated, t.mean_s]
        for name, t in m.tools.items()
    ]
    headers = ["tool", "calls", "ok", "failed", "ok%", "truncated", "mean_s"]
    return Table(f"Per tool ({m.tool_calls} calls)", headers, _cells(rows))


def tool_rows(m: RunMetrics) -> str:
    return render(tool_table(m))


def _scope_rates(
    tasks: Sequence[TaskMetrics], correct: Mapping[str, bool]
) -> dict[str, float | None]:
    rates = {"all": correct_rate(tasks, correct)}
    for workflow in sorted({t.workflow or "?" for t in tasks}):
        scoped = [t for t in tasks if (t.workflow or "?") == workflow]
        rates[f"workflow {workflow}"] = correct_rate(scoped, correct)
    return rates


def report_sections(
    overall: RunMetrics,
    per_workflow: dict[str, RunMetrics],
    tasks: Sequence[TaskMetrics],
    facts: Mapping[str, TaskReward] | None = None,
    *,
    card: dict[str, Any] | None = None,
    verifier_version: int | None = None,
) -> list[Table | list[str]]:
    """What a report shows, in order: tables, and groups of summary lines (the terminal
    report and the HTML page render the same sections); ``card``: how its speedups were
    measured (``kernelflow.projections.benchmark.benchmark_card``), shown with them."""
    correct = correct_by_reward(tasks, facts, verifier_version)
    totals = [
        "Verdicts: "
        + (", ".join(f"{k} {v}" for k, v in overall.verdicts.items()) or "none")
        + f"   statuses: {', '.join(f'{k} {v}' for k, v in overall.statuses.items()) or 'none'}",
        f"LLM calls: {overall.llm_calls}   tool calls: {overall.tool_calls}   tokens: "
        f"{overall.total_tokens}   cost: "
        + ("-" if overall.cost_usd is None else f"${overall.cost_usd:.4f}"),
    ]
    if overall.speedups_inconclusive:
        totals.append(
            f"Speedups inconclusive (their 95 % interval holds 1 or spans more than 2x: the "
            f"machine was busy): {overall.speedups_inconclusive}, not counted in fast_p "
            f"(p > 0) and geomean_x"
        )
    warned = sum(1 for t in tasks if t.final_warned)
    if overall.faults or warned:
        totals.append(
            f"Faults not the candidates' (task_error, unsupported; left out of the rates): "
            f"{overall.faults}   passed with their policy's warnings: {warned}"
        )
    sections: list[Table | list[str]] = [
        task_table(tasks, correct),
        summary_table(
            {"all": overall, **{f"workflow {k}": v for k, v in per_workflow.items()}},
            _scope_rates(tasks, correct),
        ),
        totals,
    ]
    if overall.rewards_mean:
        timed = any(t.outcome(verifier_version).speedup is not None for t in tasks)
        sections.append(reward_table(overall.rewards_mean, timed=timed))
    if overall.agents or overall.agent_latency or overall.llm_latency:
        sections.append(agent_table(overall))
    if overall.tools:
        sections.append(tool_table(overall))
    if card is not None:
        sections.append(
            ["Benchmark card (how the speedups above were measured):", *card_lines(card)]
        )
    return sections


def reward_table(means: Mapping[str, float], *, timed: bool) -> Table:
    """The mean of each reward recorded, with what its values mean; ``timed``: some kernel
    was timed (else a speedup reward is 1 for every pass, which says so)."""
    rows = []
    for key, mean in means.items():
        known = REWARD_FUNCTIONS.get(key)
        means_what = known.means if known is not None else ""
        if known is not None and known.name == "speedup" and not timed:
            means_what += "; no kernel was timed here, so 1 for every pass"
        rows.append([key, means_what or "-", mean])
    return Table(
        "Rewards (means of those recorded)", ["reward", "what it is", "mean"], _cells(rows)
    )


def report_text(
    overall: RunMetrics,
    per_workflow: dict[str, RunMetrics],
    tasks: Sequence[TaskMetrics],
    facts: Mapping[str, TaskReward] | None = None,
    *,
    card: dict[str, Any] | None = None,
    verifier_version: int | None = None,
) -> str:
    sections = report_sections(
        overall, per_workflow, tasks, facts, card=card, verifier_version=verifier_version
    )
    return "\n\n".join(
        f"{section.title}\n{render(section)}" if isinstance(section, Table) else "\n".join(section)
        for section in sections
    )


def report_json(
    overall: RunMetrics,
    per_workflow: dict[str, RunMetrics],
    tasks: Sequence[TaskMetrics],
    facts: Mapping[str, TaskReward] | None = None,
    *,
    card: dict[str, Any] | None = None,
    verifier_version: int | None = None,
) -> dict[str, Any]:
    """``correctness_rate`` (kept for readers of older reports) and ``finished_rate`` are
    the share that ended with status success; ``correct_rate`` the share whose own reward
    is positive."""
    correct = correct_by_reward(tasks, facts, verifier_version)
    rates = _scope_rates(tasks, correct)

    def scope(name: str, m: RunMetrics) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(m)
        out.update(finished_rate=m.correctness_rate, correct_rate=rates.get(name))
        return out

    return {
        "overall": scope("all", overall),
        "per_workflow": {k: scope(f"workflow {k}", v) for k, v in per_workflow.items()},
        "tasks": [
            {
                **msgspec.to_builtins(t),
                "wall_s": t.wall_s,
                "total_tokens": t.total_tokens,
                "correct": correct.get(t.task_id),
            }
            for t in sorted(tasks, key=lambda t: t.task_id)
        ],
        "card": card,
    }


# --------------------------------------------------------------------------- bench runs


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _speedup_cell(value: float | None, conclusive: bool | None) -> str:
    return _x(value) if conclusive is not False else "inconclusive"


def bench_text(
    run: str, results: list[ProblemResult], summary: dict[str, Any], card: dict[str, Any]
) -> str:
    """A bench run's report (``kernelflow bench``, the dashboard's bench page): a row per
    problem, the run's summary (``benchmark.run_summary``) and its benchmark card."""
    rows = [
        [
            r.problem,
            r.best_verdict or "-",
            _speedup_cell(r.speedup, r.speedup_conclusive),
            _speedup_cell(r.speedup_compile, r.speedup_compile_conclusive),
            _pct(r.sol_fraction),
            r.candidates,
            r.verifications,
            r.tokens,
            "-" if r.cost_usd is None else f"{r.cost_usd:.4f}",
        ]
        for r in results
    ]
    headers = [
        "problem", "best", "vs eager", "vs compile", "sol", "candidates", "checks", "tokens", "usd"
    ]  # fmt: skip
    fast = ", ".join(
        f"fast_{p}={'-' if v is None else f'{v:.2f}'}" for p, v in summary["fast_p"].items()
    )
    left_out = inconclusive_note(summary.get("inconclusive", 0))
    lines = [
        f"bench {run}",
        table(headers, rows),
        "",
        f"solved {summary['solved']}/{summary['problem_count']}  {fast}{left_out}  "
        f"geomean {_x(summary['geomean_speedup'])}{left_out}",
        f"tokens {summary['tokens']}  usd "
        + ("-" if summary["dollars"] is None else f"{summary['dollars']:.4f}")
        + f"  gpu-seconds {summary['gpu_seconds']:.1f}",
    ]
    if summary["note"]:
        lines.append(f"note: {summary['note']}")
    lines += ["", "benchmark card", *card_lines(card)]
    return "\n".join(lines)
