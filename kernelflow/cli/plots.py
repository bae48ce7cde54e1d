"""Plots of a run, each one self-contained SVG string to put inline in a page.

Every function takes plain data (``TaskMetrics`` rows, mappings, numbers) and returns an
``<svg>…</svg>`` element with no XML prolog, no external references and element ids of its
own (prefixed with the plot's name, so that several plots can share a page). The SVG's
``<title>`` is the plot's title; text stays text (``svg.fonttype: none``), and labels are
never read as matplotlib math (a task name with ``$`` in it is shown as it is). Rendering
happens in memory with matplotlib's SVG backend: no files, no network, no pyplot (and so
no global figure state); a lock keeps the style settings of concurrent callers apart.

Used by ``kernelflow report --html`` (``kernelflow.cli.html_report``) and the web
dashboard. Needs matplotlib: the ``report`` extra (``pip install 'kernelflow[report]'``).
"""

from __future__ import annotations

import io
import math
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import matplotlib
import numpy as np
from matplotlib import dates as mdates
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import (
    FuncFormatter,
    LogLocator,
    MaxNLocator,
    NullFormatter,
    PercentFormatter,
)

from kernelflow.projections.metrics import TaskMetrics

# Read when the figure is built (text.parse_math) or saved (svg.*): text as <text>, ids
# that depend on the drawing only, labels taken literally.
_STYLE: dict[Any, Any] = {
    "svg.fonttype": "none",
    "svg.hashsalt": "kernelflow",
    "text.parse_math": False,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
_LOCK = threading.Lock()  # rcParams are process-wide
_VERDICT_COLORS = {
    "pass": "#2ca02c",
    "mismatch": "#ff7f0e",
    "compile_error": "#d62728",
    "runtime_error": "#9467bd",
    "timeout": "#8c564b",
    "rejected_static": "#7f7f7f",
    "rejected_runtime": "#525252",
    "unsupported": "#c7c7c7",
}
_OTHER_COLORS = ("#17becf", "#bcbd22", "#e377c2", "#1f77b4")
MAX_TASKS = 30
MAX_GROUPS = 12
EMPTY_HEIGHT = 0.8  # inches: a plot with nothing to draw says so in a strip this high


def verdicts_over_time(tasks: Iterable[TaskMetrics]) -> str:
    """Verifications per verdict over time: stacked counts in up to 24 time bins (UTC).

    A ``TaskMetrics`` row keeps no time per verification, so each task's verdicts are
    counted at its end (``ended_at``; a running task's at its submission)."""
    stamped = [
        (at, verdict)
        for t in tasks
        if (at := t.ended_at if t.ended_at is not None else t.submitted_at) is not None
        for verdict in t.verdicts
    ]
    title = f"Verdicts over time ({_count(len(stamped), 'verification')})"

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        if not stamped:
            _note(ax, "no verifications")
            return
        counts: dict[str, int] = {}
        for _, verdict in stamped:
            counts[verdict] = counts.get(verdict, 0) + 1
        verdicts = sorted(counts, key=lambda v: (-counts[v], v))
        days = np.array([mdates.date2num(datetime.fromtimestamp(at, UTC)) for at, _ in stamped])
        low, high = float(days.min()), float(days.max())
        if high - low < 1 / 1440:  # all within a minute: one bin a minute wide
            low, high = low - 1 / 2880, high + 1 / 2880
        edges = np.linspace(low, high, min(24, len(set(days.tolist())) + 1) + 1)
        series = [[d for d, (_, v) in zip(days, stamped, strict=True) if v == w] for w in verdicts]
        colors = [_verdict_color(v, i) for i, v in enumerate(verdicts)]
        ax.hist(series, bins=edges.tolist(), stacked=True, label=verdicts, color=colors)
        # Every tick a whole time, in one format (a tick of seconds alone reads as a
        # number of its own); the date once, in the label.
        span = high - low
        shown = "%H:%M:%S" if span < 1 / 24 else "%H:%M" if span < 2 else "%m-%d %H:%M"
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=6))
        ax.xaxis.set_major_formatter(mdates.DateFormatter(shown, tz=UTC))
        first, last = mdates.num2date(low, UTC), mdates.num2date(high, UTC)
        dates = f"{first:%Y-%m-%d}" + (
            "" if first.date() == last.date() else f" to {last:%Y-%m-%d}"
        )
        ax.set_xlabel(f"time (UTC, {dates}; a task's verifications at its end)")
        ax.set_ylabel("verifications")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)

    return _render("verdicts_over_time", title, draw, empty=not stamped)


def steps_and_tokens_per_task(tasks: Sequence[TaskMetrics], *, limit: int = MAX_TASKS) -> str:
    """Steps (agent dispatches) and LLM tokens (input, output, cached) per task, one row
    per task id in submission order; only the ``limit`` latest are drawn (the title
    says how many of how many)."""
    ordered = sorted(tasks, key=lambda t: (t.submitted_at or 0.0, t.task_id))
    shown = ordered[-limit:]
    count = _count(len(ordered), "task")
    title = "Steps and tokens per task (" + (
        f"latest {len(shown)} of {count})" if len(shown) < len(ordered) else f"{count})"
    )

    def draw(fig: Figure) -> None:
        if not shown:
            _note(fig.subplots(), "no tasks")
            return
        steps_ax, tokens_ax = fig.subplots(1, 2, sharey=True, width_ratios=(1, 2))
        rows = np.arange(len(shown))
        steps_ax.barh(rows, [t.steps for t in shown], color="#1f77b4")
        steps_ax.set_yticks(rows, [_short(t.task_id) for t in shown])
        steps_ax.invert_yaxis()
        steps_ax.set_xlabel("steps")
        left = np.zeros(len(shown))
        for label, values, color in (
            ("input", [t.input_tokens for t in shown], "#9ecae1"),
            ("output", [t.output_tokens for t in shown], "#3182bd"),
            ("cached", [t.cached_tokens for t in shown], "#c6dbef"),
        ):
            tokens_ax.barh(rows, values, left=left, label=label, color=color)
            left += np.array(values, dtype=float)
        tokens_ax.set_xlabel("LLM tokens")
        tokens_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)

    height = 1.4 + 0.2 * max(len(shown), 3)
    return _render("steps_and_tokens", title, draw, height=height, empty=not shown)


def compared_groups(
    rewards: Mapping[str, Sequence[float]], max_groups: int = MAX_GROUPS
) -> tuple[dict[str, list[float]], int]:
    """The groups worth comparing (more than one reward), the first ``max_groups`` of
    them in the mapping's order, and how many there are in all."""
    several = {g: list(v) for g, v in rewards.items() if len(v) > 1}
    return dict(list(several.items())[:max_groups]), len(several)


def reward_distribution_per_group(
    rewards: Mapping[str, Sequence[float]], *, max_groups: int = MAX_GROUPS
) -> str:
    """Each group's rewards (group id → one reward per task): a box and its points per
    group. Groups of one task are left out (nothing to compare); of the rest, the first
    ``max_groups`` in the mapping's order are drawn and the title says how many of how
    many (``compared_groups``)."""
    shown, total = compared_groups(rewards, max_groups)
    groups = _count(total, "group")
    count = f"{len(shown)} of {groups}" if len(shown) < total else groups
    title = f"Reward per group ({count} of more than one task)"

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        if not shown:
            _note(ax, "no group of more than one task")
            return
        positions = np.arange(1, len(shown) + 1)
        values = list(shown.values())
        ax.boxplot(values, positions=positions, widths=0.5, showfliers=False)
        for x, ys in zip(positions, values, strict=True):
            spread = np.linspace(-0.15, 0.15, len(ys))  # points side by side, not on top
            ax.scatter(x + spread, ys, s=12, color="#1f77b4", alpha=0.7, zorder=3)
        ax.set_xticks(positions, [_short(g) for g in shown], rotation=30, ha="right")
        ax.set_xlabel("group")
        ax.set_ylabel("reward (each task's own)")

    return _render("reward_per_group", title, draw, empty=not shown)


def fast_p_curve(fractions: Mapping[float, float | None]) -> str:
    """fast_p against the speedup threshold p: the share of tasks that are correct and
    more than p times faster than the baseline (p → fraction in [0, 1]). A None fraction
    means no timing at p: it is drawn as a dotted line labelled "no timing", never as 0,
    and the curve breaks there."""
    points = sorted(fractions.items())
    untimed = [p for p, f in points if f is None]
    timing = (
        ""
        if not untimed
        else " (no timing)"
        if len(untimed) == len(points)
        else " (partly untimed)"
    )
    title = f"fast_p by speedup threshold p{timing}"

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlabel("p (speedup over the baseline)")
        ax.set_ylabel("fast_p")
        if not points:
            _note(ax, "no thresholds")
            return
        xs = [p for p, _ in points]
        ys = [math.nan if f is None else f for _, f in points]
        ax.plot(xs, ys, marker="o", color="#1f77b4", gid="measured")
        for p in untimed:
            ax.axvline(p, linestyle=":", color="#7f7f7f")
            ax.text(
                p,
                0.5,
                "no timing",
                rotation=90,
                ha="right",
                va="center",
                color="#525252",
                transform=ax.get_xaxis_transform(),
            )
        if len(xs) == 1:
            ax.set_xlim(xs[0] - 1, xs[0] + 1)

    return _render("fast_p", title, draw, empty=not points)


def speedup_histogram(speedups: Iterable[float]) -> str:
    """How many kernels reached each speedup over the baseline (log-spaced bins), with
    the baseline (1x) and the geometric mean marked. Values that are not finite and
    positive are left out (the title counts them); none at all reads "no timing"."""
    given = list(speedups)
    valid = [s for s in given if math.isfinite(s) and s > 0]
    left_out = f", {len(given) - len(valid)} invalid left out" if len(valid) < len(given) else ""
    title = f"Speedup over the baseline ({_count(len(valid), 'kernel')}{left_out})"

    def draw(fig: Figure) -> None:
        ax = fig.subplots()
        ax.set_xlabel("speedup (x, log scale)")
        ax.set_ylabel("kernels")
        if not valid:
            _note(ax, "no timing: no speedup measured")
            return
        low, high = min(min(valid), 0.5), max(max(valid), 2.0)
        ax.hist(valid, bins=np.geomspace(low, high, 21).tolist(), color="#3182bd")
        ax.set_xscale("log")
        # Plain numbers: the log axis's default labels are math text, which is off here.
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.axvline(1.0, color="#525252", linestyle="--", label="baseline (1x)")
        mean = math.exp(math.fsum(map(math.log, valid)) / len(valid))
        ax.axvline(mean, color="#d62728", label=f"geomean {mean:.3g}x")
        ax.legend(loc="upper right", frameon=False)

    return _render("speedup", title, draw, empty=not valid)


def _verdict_color(verdict: str, index: int) -> str:
    return _VERDICT_COLORS.get(verdict, _OTHER_COLORS[index % len(_OTHER_COLORS)])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _short(label: str, limit: int = 28) -> str:
    """``label`` cut in its middle to ``limit`` characters: its end (a sample's ``-3``)
    tells rows of one prefix apart."""
    if len(label) <= limit:
        return label
    tail = (limit - 1) // 2
    return label[: limit - 1 - tail] + "…" + label[-tail:]


def _note(ax: Axes, text: str) -> None:
    """Say, in place of the plot, why it holds nothing (no empty axes)."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#525252")
    ax.set_axis_off()


def _render(
    name: str,
    title: str,
    draw: Callable[[Figure], None],
    *,
    width: float = 7.0,
    height: float = 3.4,
    empty: bool = False,
) -> str:
    """``draw``'s figure as inline SVG under ``title``; ``empty`` (it only says why it has
    nothing to draw): a strip of a figure, not a plot's space."""
    with _LOCK, matplotlib.rc_context(_STYLE):
        fig = Figure(figsize=(width, EMPTY_HEIGHT if empty else height), layout="constrained")
        draw(fig)
        fig.suptitle(title)
        out = io.StringIO()
        # No Creator/Date/Format metadata: the same data gives the same SVG.
        none = dict.fromkeys(("Creator", "Date", "Format", "Type"))
        fig.savefig(out, format="svg", metadata={"Title": title, **none})
    return _inline(out.getvalue(), f"kf-{name}-")


def _inline(svg: str, prefix: str) -> str:
    """The SVG element alone (no prolog, no RDF metadata), its ids prefixed."""
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}\1"', svg)
    return re.sub(r'(href="#|url\(#)([^")]+)', rf"\1{prefix}\2", svg)
