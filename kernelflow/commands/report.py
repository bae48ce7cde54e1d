"""``kernelflow report``: run metrics per task, per workflow and overall."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kernelflow.commands.options import add_source_options
from kernelflow.events.model import Event
from kernelflow.offline.sources import Source, source_for
from kernelflow.projections.flow_grpo import RewardFacts
from kernelflow.projections.metrics import (
    DEFAULT_FAST_P,
    MetricsProjection,
    by_workflow,
    projection_metrics,
)
from kernelflow.projections.report import report_json, report_text
from kernelflow.settings import Settings
from kernelflow.usage import UsageError


def register(subparsers: Any) -> None:
    report = subparsers.add_parser("report", help="run metrics: per task, per workflow, overall")
    report.add_argument(
        "--fast-p",
        default=",".join(f"{p:g}" for p in DEFAULT_FAST_P),
        help="speedup thresholds p for fast_p (comma-separated)",
    )
    report.add_argument("--json", action="store_true")
    add_source_options(report)
    report.set_defaults(func=cmd_report)


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise UsageError(f"{what} {text!r}: expected comma-separated numbers") from exc


def _fold(source: Source) -> tuple[MetricsProjection, RewardFacts]:
    """The metrics, and which reward function is each task's own (what "correct" is by)."""
    projection, facts = MetricsProjection(), RewardFacts()

    def both(position: int, event: Event) -> None:
        projection.apply(position, event)
        facts.apply(position, event)

    source.feed(both)
    return projection, facts


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    fast_ps = parse_floats(args.fast_p, "--fast-p")
    with source_for(args, settings) as source:
        projection, facts = _fold(source)
    tasks = list(projection.tasks.values())
    overall = projection_metrics(projection, fast_ps)
    per_workflow = by_workflow(tasks, fast_ps)
    if args.json:
        print(json.dumps(report_json(overall, per_workflow, tasks, facts.tasks), indent=2))
    elif not tasks:
        print("no tasks in the log")
    else:
        print(report_text(overall, per_workflow, tasks, facts.tasks))
    return 0
