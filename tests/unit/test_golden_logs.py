"""Golden logs: what this version recorded for a success, a failure, a search, a rollout
and agentflow tasks (tests/data/golden, written by tests/golden_logs.py) is folded by
today's code and every recorded decision made again from the log before it. A later
version that decides one of them otherwise fails here: it needs an upcaster or a versioned
rule, never a rewritten golden log (docs/extending.md)."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path

import msgspec
import pytest

from kernelflow.actors import decide
from kernelflow.events.model import (
    ConductorDecided,
    Event,
    TaskCancelled,
    TaskFinished,
)
from kernelflow.offline.files import file_events
from kernelflow.offline.redecide import redecide
from kernelflow.projections.logfile import LogWriter
from kernelflow.projections.task_state import fold
from kernelflow.workflows.rules import Route
from tests.golden_logs import GOLDEN, RUNS

EXPECTED_STATUS = {
    "success": {"success"},
    "failure": {"failed"},
    "search": {"success", "failed"},
    "rollout": {"success"},
    "agentflow": {"success"},
    "agentflow_retries": {"success"},
}


def tasks_in(name: str) -> dict[str, list[Event]]:
    tasks: dict[str, list[Event]] = defaultdict(list)
    for _, event in file_events(GOLDEN / f"{name}.jsonl"):
        tasks[event.task_id].append(event)
    return dict(tasks)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_todays_code_makes_every_recorded_decision_again(name: str) -> None:
    tasks = tasks_in(name)
    assert tasks, f"{name}.jsonl holds no task"
    for task_id, events in tasks.items():
        assert [d.text() for d in redecide(task_id, events)] == []
        state = fold(task_id, events)
        if name == "search" and isinstance(state.terminal, TaskCancelled):
            continue  # the search's other candidate, cancelled by its early win
        assert isinstance(state.terminal, TaskFinished), task_id
        assert state.terminal.status in EXPECTED_STATUS[name]
        assert state.rewards, f"{task_id}: no reward recorded"
    if name == "search":
        assert len(tasks) >= 2  # the candidates of one search, each a task


def test_a_decision_recorded_otherwise_is_found() -> None:
    ((task_id, events),) = tasks_in("success").items()
    index, decided = next(
        (i, e) for i, e in enumerate(events) if isinstance(e, ConductorDecided) and e.chosen
    )
    forged = msgspec.structs.replace(decided, chosen="verifier", mode="auto")
    (difference,) = redecide(task_id, [*events[:index], forged])
    assert difference.seq == decided.seq and "verifier" in difference.recorded


def test_a_rule_that_decides_otherwise_today_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    real_route = decide.route

    def contrary(workflow, counters, outcome, routing_version):  # type: ignore[no-untyped-def]
        route: Route = real_route(workflow, counters, outcome, routing_version)
        others = [o for o in route.options if o != route.chosen]
        if route.chosen is None or not others:
            return route
        return dataclasses.replace(route, chosen=others[0])  # another option than today's

    monkeypatch.setattr(decide, "route", contrary)
    differences = [d for name in RUNS for t, e in tasks_in(name).items() for d in redecide(t, e)]
    assert differences, "a changed rule went unnoticed"


def write_log(path: Path, events: list[Event]) -> None:
    writer = LogWriter()
    path.write_bytes(writer.header() + b"".join(map(writer.record, events)) + writer.trailer())
