"""``kernelflow report``: run metrics per task, per workflow and overall."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kernelflow.cli.commands.options import add_source_options, add_verifier_version_option
from kernelflow.events.model import Event
from kernelflow.host.exits import UsageError
from kernelflow.host.settings import Settings
from kernelflow.offline.files import atomic_output
from kernelflow.offline.sources import Source, source_for
from kernelflow.projections.benchmark import benchmark_card
from kernelflow.projections.flow_grpo import RewardFacts
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.report import report_json, report_text
from kernelflow.projections.search import SearchDatabase
from kernelflow.projections.statistics import DEFAULT_FAST_P, by_workflow, projection_metrics


def register(subparsers: Any) -> None:
    report = subparsers.add_parser("report", help="run metrics: per task, per workflow, overall")
    report.add_argument(
        "--fast-p",
        default=",".join(f"{p:g}" for p in DEFAULT_FAST_P),
        help="speedup thresholds p for fast_p (comma-separated)",
    )
    report.add_argument("--json", action="store_true")
    report.add_argument(
        "--html",
        action="store_true",
        help="write an HTML page with plots and the tables to --out FILE "
        "(needs matplotlib: pip install 'kernelflow[report]')",
    )
    report.add_argument("--out", metavar="FILE", help="where --html writes its page")
    add_verifier_version_option(report)
    add_source_options(report)
    report.set_defaults(func=cmd_report)


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise UsageError(f"{what} {text!r}: expected comma-separated numbers") from exc


def _fold(source: Source) -> tuple[MetricsProjection, RewardFacts, SearchDatabase]:
    """The metrics, which reward function is each task's own (what "correct" is by), and
    how each task's kernel was judged (what the benchmark card reads)."""
    projection, facts, kernels = (
        MetricsProjection(),
        RewardFacts(),
        SearchDatabase(None, light=True),
    )

    def each(position: int, event: Event) -> None:
        projection.apply(position, event)
        facts.apply(position, event)
        kernels.apply(position, event)

    source.feed(each)
    return projection, facts, kernels


def _html_page_builder() -> Callable[..., str]:
    """``report_page``, or a usage error naming what to install (plain reports never
    import matplotlib)."""
    try:
        from kernelflow.cli.html_report import report_page
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "matplotlib":
            raise
        raise UsageError(
            "report --html needs matplotlib: pip install 'kernelflow[report]'"
        ) from None
    return report_page


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    fast_ps = parse_floats(args.fast_p, "--fast-p")
    if args.html and args.json:
        raise UsageError("--html and --json: choose one")
    if args.html and not args.out:
        raise UsageError("--html needs --out FILE (the page to write)")
    if args.out and not args.html:
        raise UsageError("--out FILE is for --html (text and --json print to stdout)")
    report_page = _html_page_builder() if args.html else None
    with source_for(args, settings) as source:
        projection, facts, kernels = _fold(source)
    version = args.verifier_version
    tasks = list(projection.tasks.values())
    overall = projection_metrics(projection, fast_ps, version)
    per_workflow = by_workflow(tasks, fast_ps, version)
    judged = kernels.as_of(version)
    card = benchmark_card(
        {"log": judged},
        timed=[(c.task_id, c.task_id) for c in judged.ordered() if c.passed and c.speedup],
    )
    if report_page is not None:
        page = report_page(
            overall,
            per_workflow,
            tasks,
            facts.tasks,
            fast_ps=fast_ps,
            generated_at=datetime.now(UTC),
            card=card,
            verifier_version=version,
        )
        try:
            with atomic_output(Path(args.out)) as partial:
                partial.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot write: {exc.strerror or exc}") from exc
        print(f"wrote {args.out}: {len(tasks)} tasks")
    elif args.json:
        out = report_json(
            overall, per_workflow, tasks, facts.tasks, card=card, verifier_version=version
        )
        print(json.dumps(out, indent=2))
    elif not tasks:
        print("no tasks in the log")
    else:
        print(
            report_text(
                overall, per_workflow, tasks, facts.tasks, card=card, verifier_version=version
            )
        )
    return 0
