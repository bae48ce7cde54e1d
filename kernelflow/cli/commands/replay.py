"""``kernelflow replay``: one task's trajectory, repeat counters or metrics, folded from
the live log or an exported file."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any

import msgspec

from kernelflow.actors.pins import differences, versions_today
from kernelflow.cli.commands.options import add_source_options
from kernelflow.events.model import Event, QuarantinedEvent, TaskSubmitted
from kernelflow.host.exits import UsageError
from kernelflow.host.settings import Settings
from kernelflow.offline.redecide import redecide
from kernelflow.offline.sources import source_for
from kernelflow.projections.counters import counters_at_decisions, state_counters
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.render import (
    counters_text,
    counters_view,
    trajectory_text,
    unknown_kinds_note,
)
from kernelflow.projections.report import agent_rows, tool_rows
from kernelflow.projections.rewards import REWARD_FUNCTIONS
from kernelflow.projections.speedups import speedup_text
from kernelflow.projections.statistics import projection_metrics
from kernelflow.projections.task_state import fold, workflow_of
from kernelflow.projections.trajectory import build_trajectory


def register(subparsers: Any) -> None:
    rep = subparsers.add_parser(
        "replay", help="a task's trajectory, counters or metrics, from the log or a file"
    )
    add_source_options(rep, one_task=True)
    rep.add_argument("--view", choices=["trajectory", "counters", "metrics"], default="trajectory")
    rep.add_argument("--json", action="store_true")
    rep.add_argument(
        "--check",
        action="store_true",
        help="make every decision the task recorded again with this version's rules, and "
        "say which come out otherwise (exit 1 if any); with --check, TASK_ID may be "
        "several ids, or none for every task the log or file holds",
    )
    rep.add_argument("more", nargs="*", metavar="TASK_ID", help=argparse.SUPPRESS)
    rep.set_defaults(func=cmd_replay)


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    if args.check:
        return _check(args, settings)
    if not args.task:
        raise UsageError("replay: which task? kernelflow replay TASK_ID")
    if args.more:
        raise UsageError("replay: one task at a time (several only with --check)")
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
    first = events[0]
    if isinstance(first, TaskSubmitted):
        today = versions_today(first, settings.workflow_dirs, settings.llm)
        if differ := differences(first.versions, today):
            said = "; ".join(differ)
            print(f"{args.task} started with other versions than today's: {said}", file=sys.stderr)
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
            if t.final_speedup is not None:  # in words where it is inconclusive
                view["final_speedup"] = speedup_text(
                    t.final_speedup, t.final_speedup_ci95, t.final_conclusive
                )
            for k, v in view.items():
                print(f"{k:<22} {_for_people(k, v)}")
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
            state_counters(state, patterns),
            workflow,
            counters_at_decisions(events, patterns),
        )
        print(json.dumps(cview, indent=2) if args.json else counters_text(cview))
        return 0
    trajectory = build_trajectory(args.task, events)
    if args.json:
        print(json.dumps(trajectory.to_dict(), indent=2))
        return 0
    if isinstance(first, TaskSubmitted) and (origin := first.forked_from) is not None:
        print(
            f"forked from {origin.task_id} at event {origin.at}: its steps up to there are "
            f"{origin.task_id}'s, copied as recorded (kernelflow replay {origin.task_id})"
        )
    print(trajectory_text(trajectory))
    return 0


def _for_people(key: str, value: Any) -> str:
    """A metric of ``--view metrics`` as a person reads it: times as dates and durations,
    numbers rounded, lists and counts by name, rewards with what they mean."""
    if value is None or value == () or value == {}:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key.endswith("_at"):
        return datetime.datetime.fromtimestamp(value).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    if key.endswith("_s"):
        return _duration(value)
    if key.endswith("speedup"):
        return value if isinstance(value, str) else f"{value:.2f}x"
    if key == "cost_usd":
        return f"${value:.4f}"
    if key == "rewards":
        said = [f"{name} = {mean:.3g}  ({_meaning(name)})" for name, mean in value.items()]
        return f"\n{'':23}".join(said)  # one a line, under the first
    if key == "revisions":
        return ", ".join(
            f"v{version} {verdict}"
            + (
                ""
                if speedup is None
                else " speedup inconclusive"
                if conclusive is False
                else f" {speedup:.2f}x"
            )
            for version, verdict, speedup, _, conclusive in value
        )
    if isinstance(value, dict):
        return ", ".join(f"{name} {count}" for name, count in value.items())
    if isinstance(value, tuple | list):
        return ", ".join(map(str, value))
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.2f}s" if seconds < 10 else f"{seconds:.1f}s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}m{rest:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def _meaning(reward: str) -> str:
    known = REWARD_FUNCTIONS.get(reward)
    return known.means if known is not None and known.means else "a reward of its own"


def _check(args: argparse.Namespace, settings: Settings) -> int:
    """``--check``: each task's recorded decisions, made again (kernelflow.offline.redecide);
    the tasks named, or every task of the source."""
    wanted = [args.task, *args.more] if args.task else []
    if len(wanted) > 1:
        args.task = None  # the source reads them all; the named ones are kept
    by_task: dict[str, list[Event]] = {}

    def keep(_: int, event: Event) -> None:
        if type(event) is not QuarantinedEvent and (not wanted or event.task_id in wanted):
            by_task.setdefault(event.task_id, []).append(event)

    with source_for(args, settings) as source:
        source.feed(keep)
    missing = [t for t in wanted if t not in by_task]
    if missing or not by_task:
        where = f"the file {args.from_file}" if args.from_file else "the log"
        raise UsageError(
            f"no task {', '.join(missing)} in {where}" if missing else f"no task in {where}"
        )
    found = {task_id: redecide(task_id, events) for task_id, events in by_task.items()}
    if args.json:
        rows = [msgspec.to_builtins(d) for diverged in found.values() for d in diverged]
        print(json.dumps(rows, indent=2))
        return 1 if rows else 0
    for task_id, diverged in found.items():
        if diverged:
            print("\n".join(d.text() for d in diverged))
        else:
            events = by_task[task_id]
            decided = sum(1 for e in events if e.kind in ("conductor_decided", "agent_dispatched"))
            print(f"{task_id}: {decided} recorded decisions, each made again as recorded")
    return 1 if any(found.values()) else 0
