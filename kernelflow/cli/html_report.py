"""The page of ``kernelflow report --html``: the run's plots (``kernelflow.cli.plots``) and the
report's tables (``projections.report.report_sections``, the same cells as the terminal
report) in one HTML file that fetches nothing: inline SVG and CSS, no scripts. Every value
from the log (task names, reasons, group ids) is escaped. Composition only: data in, a
string out; the command writes the file."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kernelflow.cli import plots
from kernelflow.projections.flow_grpo import TaskReward, rollout_reward
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.report import Table, own_reward, report_sections
from kernelflow.projections.speedups import counted
from kernelflow.projections.statistics import RunMetrics, fast_p

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h1 { margin-bottom: 0.2em; }
.meta { color: #666; margin-top: 0; }
.plots { display: flex; flex-wrap: wrap; gap: 1.5em; }
figure { margin: 0; max-width: 100%; }
figure svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 0.9em; max-width: 42em; }
table { border-collapse: collapse; margin-bottom: 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; }
th { background: #f3f3f3; }
tbody tr:nth-child(even) { background: #fafafa; }
"""


def rewards_by_group(
    tasks: Iterable[TaskMetrics],
    facts: Mapping[str, TaskReward] | None = None,
    verifier_version: int | None = None,
) -> dict[str, list[float]]:
    """Group id → the own reward of each of its tasks that ended (recorded, or computed
    the same way where the log has none; by the newest check of each kernel, or by a
    verifier no newer than ``verifier_version``), groups in the order of their first task."""
    known = facts or {}
    own = own_reward(verifier_version)
    groups: dict[str, list[float]] = {}
    for t in sorted(tasks, key=lambda t: (t.submitted_at or 0.0, t.task_id)):
        if t.ended:
            r = rollout_reward(t, own, known.get(t.task_id))
            groups.setdefault(r.group_id, []).append(r.reward)
    return groups


def report_plots(
    tasks: Sequence[TaskMetrics],
    facts: Mapping[str, TaskReward] | None,
    fast_ps: Sequence[float],
    verifier_version: int | None = None,
) -> list[tuple[str, str, str]]:
    """The page's plots: (id, caption, SVG) each. Outcomes (rewards, fast_p, speedups) by
    the newest check of each kernel, or by a verifier no newer than ``verifier_version``;
    the verdicts plot shows the verifications as they happened."""
    groups = rewards_by_group(tasks, facts, verifier_version)
    shown, total = plots.compared_groups(groups)
    capped = f" Only the first {len(shown)} of {total} are drawn." if len(shown) < total else ""
    outcomes = [t.outcome(verifier_version) for t in tasks if t.ended]
    passed = [o for o in outcomes if o.status == "success" and o.speedup is not None]
    speedups = [s for o in passed if (s := counted(o.speedup, o.speedup_conclusive)) is not None]
    left_out = len(passed) - len(speedups)
    inconclusive = (
        f" {left_out} inconclusive (their 95 % interval holds 1 or spans more than 2x: the "
        "machine was busy) are not drawn, nor counted in fast_p."
        if left_out
        else ""
    )
    return [
        (
            "verdicts",
            "Verifications by verdict over time; a task's verifications count at its end.",
            plots.verdicts_over_time(tasks),
        ),
        (
            "steps-tokens",
            f"Steps (agent dispatches) and LLM tokens per task id; the latest "
            f"{plots.MAX_TASKS} tasks at most.",
            plots.steps_and_tokens_per_task(tasks),
        ),
        (
            "rewards",
            "Each task's own reward, per group of more than one task (submit --samples N)."
            f"{capped}",
            plots.reward_distribution_per_group(groups),
        ),
        (
            "fast-p",
            "fast_p at each --fast-p threshold: the share of ended tasks whose kernel is "
            "correct and more than p times faster than the baseline; 'no timing' where no "
            f"task was timed (Triton on the CPU interpreter never is).{inconclusive}",
            plots.fast_p_curve({p: fast_p(tasks, p, verifier_version) for p in fast_ps}),
        ),
        (
            "speedups",
            f"Speedups of the correct kernels that were timed.{inconclusive}",
            plots.speedup_histogram(speedups),
        ),
    ]


def report_page(
    overall: RunMetrics,
    per_workflow: dict[str, RunMetrics],
    tasks: Sequence[TaskMetrics],
    facts: Mapping[str, TaskReward] | None,
    *,
    fast_ps: Sequence[float],
    generated_at: datetime,
    card: dict[str, Any] | None = None,
    verifier_version: int | None = None,
) -> str:
    """The whole page, as one string (its tables and card as ``report_sections`` has them;
    tables and plots judge each kernel by the same check: see ``report_plots``)."""
    figures = "\n".join(
        f'<figure id="plot-{name}">\n{svg}\n<figcaption>{_text(caption)}</figcaption>\n</figure>'
        for name, caption, svg in report_plots(tasks, facts, fast_ps, verifier_version)
    )
    sections = "\n".join(
        _table(section) if isinstance(section, Table) else _lines(section)
        for section in report_sections(
            overall, per_workflow, tasks, facts, card=card, verifier_version=verifier_version
        )
    )
    count = f"{len(tasks)} task{'' if len(tasks) == 1 else 's'}"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>kernelflow report</title>
<style>{_STYLE}</style>
</head>
<body>
<h1>kernelflow report</h1>
<p class="meta">{count}; generated {_text(generated_at.isoformat(timespec="seconds"))}</p>
<section id="plots">
<h2>Plots</h2>
<div class="plots">
{figures}
</div>
</section>
<section id="tables">
{sections}
</section>
</body>
</html>
"""


def _text(value: str) -> str:
    return html.escape(value, quote=True)


def _table(t: Table) -> str:
    head = "".join(f"<th>{_text(h)}</th>" for h in t.headers)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{_text(cell)}</td>" for cell in row) + "</tr>" for row in t.rows
    )
    return (
        f"<h2>{_text(t.title)}</h2>\n<table>\n<thead><tr>{head}</tr></thead>\n"
        f"<tbody>\n{body}\n</tbody>\n</table>"
    )


def _lines(lines: Sequence[str]) -> str:
    return "<p>" + "<br>\n".join(_text(line) for line in lines) + "</p>"
