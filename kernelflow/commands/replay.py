"""``kernelflow replay``: one task's trajectory, repeat counters or metrics, folded from
the live log or an exported file."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from kernelflow.actors.worker import workflow_of
from kernelflow.commands.options import add_source_options
from kernelflow.events.model import Event, QuarantinedEvent
from kernelflow.offline.sources import source_for
from kernelflow.projections.counters import counters_at_decisions, repeat_counters
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.report import agent_rows, tool_rows
from kernelflow.projections.statistics import projection_metrics
from kernelflow.projections.task_state import fold
from kernelflow.projections.trajectory import build_trajectory
from kernelflow.render import counters_text, counters_view, trajectory_text, unknown_kinds_note
from kernelflow.settings import Settings
from kernelflow.usage import UsageError


def register(subparsers: Any) -> None:
    rep = subparsers.add_parser(
        "replay", help="a task's trajectory, counters or metrics, from the log or a file"
    )
    add_source_options(rep, task_required=True)
    rep.add_argument("--view", choices=["trajectory", "counters", "metrics"], default="trajectory")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    events: list[Event] = []

    def keep(_: int, event: Event) -> None:
        if type(event) is not QuarantinedEvent:  # the source counts it, and says so
            events.append(event)

    with source_for(args, settings) as source:
        source.feed(keep)
    if not events:
        raise UsageError(f"no task {args.task} in the log")
    if note := unknown_kinds_note(events):
        print(note, file=sys.stderr)
    if args.view == "metrics":
        projection = MetricsProjection().apply_all(enumerate(events, 1))
        t = projection.tasks[args.task]
        run = projection_metrics(projection)
        view = {**msgspec.to_builtins(t), "wall_s": t.wall_s, "total_tokens": t.total_tokens}
        if args.json:
            view["agents"] = msgspec.to_builtins(run.agents)
            view["tools"] = msgspec.to_builtins(run.tools)
            print(json.dumps(view, indent=2))
        else:
            for k, v in view.items():
                print(f"{k:<20} {v}")
            print(f"\nPer agent (time: dispatch → result)\n{agent_rows(run)}")
            if run.tools:
                print(f"\nPer tool ({run.tool_calls} calls)\n{tool_rows(run)}")
        return 0
    if args.view == "counters":
        state = fold(args.task, events)
        if state.submitted is None:
            raise UsageError(f"task {args.task} was never accepted: no workflow to count for")
        workflow = workflow_of(state)
        patterns = workflow.sequence_patterns
        cview = counters_view(
            repeat_counters(state.history, patterns),
            workflow,
            counters_at_decisions(events, patterns),
        )
        print(json.dumps(cview, indent=2) if args.json else counters_text(cview))
        return 0
    trajectory = build_trajectory(args.task, events)
    print(json.dumps(trajectory.to_dict(), indent=2) if args.json else trajectory_text(trajectory))
    return 0
