"""The task list (the daemons' read model: status, steps, verdicts, filters), the run
page (the report's plots and tables, ``kernelflow report --html``'s, for the whole log or
one group or workflow, with the groups, searches and bench runs to look into) and a bench
run's page (``kernelflow bench``'s report and benchmark card, and the plots of its
candidates)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kernelflow.cli.ui.data import LocalFold, TaskRows
from kernelflow.cli.ui.html import (
    badge,
    cell,
    esc,
    group_link,
    href,
    link,
    pre,
    sol_cell,
    speedup,
    table,
    task_link,
)
from kernelflow.projections.benchmark import (
    BENCH_FAST_P,
    benchmark_card,
    problem_result,
    run_summary,
)
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.report import Table, bench_text, report_sections
from kernelflow.projections.speedups import counted
from kernelflow.projections.statistics import (
    DEFAULT_FAST_P,
    by_workflow,
    projection_metrics,
    run_metrics,
)

MAX_ROWS = 500  # rows a table shows (the newest); the page says how many it left out
MAX_GROUPS = 100
STATUSES = ("running", "success", "failed", "timeout", "cancelled", "rejected", "budget_exceeded")


def task_list_fragment(rows: TaskRows, status: str, text: str) -> str:
    """Every task's row, newest first, narrowed to a ``status`` and to ids or reasons
    holding ``text``."""
    counts = Counter(str(r["status"]) for r in rows.rows)
    needle = text.lower()
    matching = [
        r
        for r in reversed(rows.rows)
        if (not status or r["status"] == status)
        and (
            not needle
            or needle in str(r["task_id"]).lower()
            or needle in str(r["reason"] or "").lower()
        )
    ]
    chips = [link(f"all {len(rows.rows)}", href(q=text))]
    chips += [
        link(f"{name} {counts[name]}", href(status=name, q=text))
        for name in sorted(counts, key=lambda s: (s not in STATUSES, s))
    ]
    options = "".join(
        f'<option value="{esc(s)}"{" selected" if s == status else ""}>{esc(s or "any")}</option>'
        for s in ("", *STATUSES, *sorted(set(counts) - set(STATUSES)))
    )
    form = (
        '<form class="filters" method="get" action="/">'
        f'<label>status <select name="status">{options}</select></label>'
        f'<input type="search" name="q" value="{esc(text)}" placeholder="task id or reason">'
        "<button>filter</button></form>"
    )
    shown = matching[:MAX_ROWS]
    body = table(
        ["task", "status", "steps", "verifications", "verdict", "speedup", "sol", "reason"],
        (
            [
                task_link(str(r["task_id"])),
                badge(r["status"]),
                esc(r["steps"]),
                " → ".join(badge(v) for v in r["verifications"]) or "none",
                badge(r["verdict"]) if r["verdict"] else "—",
                speedup(r["speedup"], r.get("speedup_conclusive"), r.get("speedup_ci95") or ()),
                sol_cell(r.get("sol_fraction")),
                cell(r["reason"]),
            ]
            for r in shown
        ),
        cls="tasks",
    )
    left_out = len(matching) - len(shown)
    more = f'<p class="muted">and {left_out:,} more (narrow the filter)</p>' if left_out else ""
    if not rows.rows:
        body = '<p class="muted">no tasks in the log yet (kernelflow submit TASK.py)</p>'
    return (
        f'<h1>Tasks</h1>{form}<p class="chips">{" ".join(chips)}</p>{body}{more}'
        f'<p class="muted">rows from {esc(rows.source)}</p>'
    )


def run_fragment(fold: LocalFold, group: str, workflow: str) -> str:
    """The report of the tasks of the log (of one group, of one workflow): plots, the
    report's tables, and the groups worth a look."""
    tasks = [
        t
        for t in fold.metrics.tasks.values()
        if (not group or t.group_id == group) and (not workflow or t.workflow == workflow)
    ]
    scope = " and ".join(
        s
        for s in (f"group {group}" if group else "", f"workflow {workflow}" if workflow else "")
        if s
    )
    form = (
        '<form class="filters" method="get" action="/run">'
        f'<input type="search" name="group" value="{esc(group)}" placeholder="group id">'
        f'<input type="search" name="workflow" value="{esc(workflow)}" placeholder="workflow">'
        "<button>show</button></form>"
    )
    parts = [f"<h1>Run{': ' + esc(scope) if scope else ''}</h1>", form]
    if not tasks:
        parts.append('<p class="muted">no tasks here</p>')
        return "".join(parts)
    # Per-agent and per-tool tallies are kept for the whole log only.
    overall = projection_metrics(fold.metrics) if not scope else run_metrics(tasks)
    parts.append("<h2>Plots</h2>" + _plots(tasks, fold))
    for section in report_sections(overall, by_workflow(tasks), tasks, fold.rewards.tasks):
        parts.append(_section(section))
    parts.append(_groups(tasks, fold))
    parts.append(_benches(fold))
    return "".join(parts)


def bench_fragment(run: str, fold: LocalFold) -> str | None:
    """A bench run: its problems (each a search), its report and benchmark card as
    ``kernelflow bench`` prints them, and the plots of its candidates; None when the log
    has no such run."""
    problems = fold.benches.get(run)
    if not problems:
        return None
    searches = {problem: fold.searches[sid] for problem, sid in problems.items()}
    results = [problem_result(problem, db) for problem, db in searches.items()]
    summary = run_summary(results, BENCH_FAST_P)
    rows = [
        [
            esc(r.problem),
            group_link(r.search_id),
            task_link(r.best_task) if r.best_task else "—",
            badge(r.best_verdict) if r.best_verdict else "—",
            speedup(r.speedup, r.speedup_conclusive, r.speedup_ci95),
            sol_cell(r.sol_fraction),
            str(r.candidates),
            str(r.running),
        ]
        for r in results
    ]
    headers = [
        "problem", "search", "best kernel", "verdict", "speedup", "sol", "candidates", "running"
    ]  # fmt: skip
    tasks = [
        fold.metrics.tasks[c.task_id]
        for db in searches.values()
        for c in db.ordered()
        if c.task_id in fold.metrics.tasks
    ]
    return (
        f"<h1>Bench {esc(run)}</h1>"
        + table(headers, rows)
        + "<h2>Report</h2>"
        + pre(bench_text(run, results, summary, benchmark_card(searches, results)))
        + "<h2>Plots of its candidates</h2>"
        + _plots(tasks, fold)
    )


def _benches(fold: LocalFold) -> str:
    if not fold.benches:
        return ""
    rows = [
        [link(run, href("bench", run)), str(len(problems))]
        for run, problems in reversed(fold.benches.items())
    ][:MAX_GROUPS]
    return "<h2>Bench runs</h2>" + table(["run", "problems"], rows)


def _plots(tasks: Sequence[TaskMetrics], fold: LocalFold) -> str:
    try:  # matplotlib comes with the report extra: the rest of the page works without it
        from kernelflow.cli.html_report import report_plots
    except ImportError as exc:
        return (
            f'<p class="muted">no plots: {esc(exc)} '
            "(pip install 'kernelflow[report]' or 'kernelflow[ui]')</p>"
        )
    figures = "".join(
        f'<figure id="plot-{esc(name)}">{svg}<figcaption class="muted">{esc(caption)}'
        "</figcaption></figure>"
        for name, caption, svg in report_plots(tasks, fold.rewards.tasks, DEFAULT_FAST_P)
    )
    return f'<div class="plots">{figures}</div>'


def _section(section: Table | list[str]) -> str:
    if not isinstance(section, Table):
        return "<p>" + "<br>".join(esc(line) for line in section) + "</p>"
    rows = section.rows[:MAX_ROWS]
    more = len(section.rows) - len(rows)
    note = f'<p class="muted">and {more:,} more rows</p>' if more else ""
    cells = ([esc(c) for c in row] for row in rows)
    return f"<h2>{esc(section.title)}</h2>" + table(section.headers, cells) + note


def _groups(tasks: Sequence[TaskMetrics], fold: LocalFold) -> str:
    """Groups of more than one task, and searches, newest first."""
    members: dict[str, list[TaskMetrics]] = {}
    for t in tasks:
        members.setdefault(t.group_id, []).append(t)
    shown = [(gid, ts) for gid, ts in members.items() if len(ts) > 1 or gid in fold.searches][::-1][
        :MAX_GROUPS
    ]
    if not shown:
        return ""
    rows = [
        [
            group_link(gid),
            "search" if gid in fold.searches else "group",
            str(len(ts)),
            str(sum(t.ended for t in ts)),
            str(sum(t.correct for t in ts)),
            speedup(max((s for t in ts if (s := _counted(t)) is not None), default=None)),
        ]
        for gid, ts in shown
    ]
    headers = ["group", "kind", "tasks", "ended", "succeeded", "best speedup"]
    return "<h2>Groups and searches</h2>" + table(headers, rows)


def _counted(t: TaskMetrics) -> float | None:
    """A correct task's final speedup, when it counts (conclusive)."""
    return counted(t.final_speedup, t.final_conclusive) if t.correct else None
