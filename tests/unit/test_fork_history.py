"""A fork's history as ``kernelflow fork`` makes it (kernelflow.fork; docs/workflows.md,
"Forking a task"), from the golden success log: where it is cut, what it copies and how,
what it refuses; the status tree its rows make; its metrics count only its own work; the
report's and the dashboard's word on its origin."""

from __future__ import annotations

import msgspec
import pytest

from kernelflow.cli.ui.task_page import task_fragment
from kernelflow.events.model import ConductorDecided, LLMCalled, TaskSubmitted
from kernelflow.fork import ForkChanges, ForkError, cut_of, forked_events, step_ends
from kernelflow.offline.redecide import redecide
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.render import fork_tree
from kernelflow.projections.report import task_table
from tests.unit.test_golden_logs import tasks_in


def golden() -> tuple[str, list]:  # type: ignore[type-arg]
    ((task_id, events),) = tasks_in("success").items()
    return task_id, events


def test_a_fork_is_cut_after_a_step_and_copies_the_history_as_recorded() -> None:
    task_id, events = golden()
    ends = step_ends(events)
    assert cut_of(task_id, events, after_step=2) == ends[2]
    inside = ends[3] - 1  # inside step 3: back to the end of step 2
    assert cut_of(task_id, events, at=inside) == ends[2]
    forked = forked_events(events, ends[2], "f-1", ForkChanges(llm="scripted:x.yaml"))
    first = forked[0]
    assert isinstance(first, TaskSubmitted) and first.forked_from is not None
    assert (first.task_id, first.cause) == ("f-1", f"{task_id}:{ends[2]}")
    assert first.forked_from.changed == {"llm": "scripted:x.yaml"}
    assert first.group_id != events[0].group_id
    assert [e.seq for e in forked[1:]] == list(range(2, ends[2] + 1))
    for copy, recorded in zip(forked[1:], events[1 : ends[2]], strict=True):
        assert copy.task_id == "f-1" and not copy.cause.startswith(f"{task_id}:")
        back = msgspec.structs.replace(
            copy,
            task_id=task_id,
            cause=copy.cause.replace("f-1:", f"{task_id}:"),
            **(
                {"dispatch_id": copy.dispatch_id.replace("f-1:", f"{task_id}:")}  # type: ignore[attr-defined]
                if hasattr(copy, "dispatch_id")
                else {}
            ),
        )
        assert back == recorded


def test_a_fork_that_cannot_be_made_is_refused() -> None:
    task_id, events = golden()
    with pytest.raises(ForkError, match="no step 99 that ended"):
        cut_of(task_id, events, after_step=99)
    with pytest.raises(ForkError, match="no step ended at or before event 2"):
        cut_of(task_id, events, at=2)
    with pytest.raises(ForkError, match="no agent"):
        forked_events(events, step_ends(events)[2], "f", ForkChanges(workflow="coder_only"))


def test_a_forks_metrics_count_its_own_work_once() -> None:
    task_id, events = golden()
    cut = step_ends(events)[2]
    forked = forked_events(events, cut, "f-1", ForkChanges())
    metrics = MetricsProjection().apply_all(enumerate([*events, *forked], 1))
    fork, original = metrics.tasks["f-1"], metrics.tasks[task_id]
    assert (fork.forked_from, fork.fork_at, fork.reused_events) == (task_id, cut, cut - 1)
    assert (fork.llm_calls, fork.steps, fork.input_tokens) == (0, 0, 0)
    assert original.llm_calls == sum(isinstance(e, LLMCalled) for e in events)


def test_status_rows_stand_under_the_task_they_were_forked_from() -> None:
    def row(task_id: str, parent: str | None = None) -> dict[str, object]:
        return {"task_id": task_id, "forked_from": parent and {"task_id": parent, "at": 5}}

    rows = [row("b", "a"), row("a"), row("c", "b"), row("d", "gone"), row("e"), row("b2", "a")]
    assert [(d, r["task_id"]) for d, r in fork_tree(rows)] == [
        (0, "a"), (1, "b"), (2, "c"), (1, "b2"), (0, "d"), (0, "e")
    ]  # fmt: skip
    loop = [row("x", "y"), row("y", "x")]  # a log written by hand: still listed
    assert sorted(r["task_id"] for _, r in fork_tree(loop)) == ["x", "y"]


def test_the_report_and_the_dashboard_name_a_forks_origin() -> None:
    task_id, events = golden()
    cut = step_ends(events)[2]
    forked = forked_events(events, cut, "f-1", ForkChanges())
    metrics = MetricsProjection().apply_all(enumerate([*events, *forked], 1))
    table = task_table(list(metrics.tasks.values()), {})
    fork_of = {row[0]: row[table.headers.index("fork_of")] for row in table.rows}
    assert fork_of == {task_id: "-", "f-1": f"{task_id}@{cut}"}
    page = task_fragment("f-1", forked)
    assert f'href="/tasks/{task_id}"' in page and f"at event {cut}: its steps" in page


def test_replay_check_of_a_fork_on_another_workflow_re_decides_only_its_own_decisions() -> None:
    """The copied decisions were the original's workflow's (its replay checks them); the
    fork's own are re-decided with the fork's workflow."""
    _, events = golden()
    cut = step_ends(events)[2]
    forked = forked_events(events, cut, "f-1", ForkChanges(workflow="conductor_connect_all"))
    assert redecide("f-1", forked) == []
    tail = msgspec.structs.replace(events[cut], task_id="f-1", cause=f"f-1:{cut}", seq=cut + 1)
    assert isinstance(tail, ConductorDecided)  # the original's next decision, made again
    forged = msgspec.structs.replace(tail, chosen="verifier", mode="auto", reason="forged")
    (difference,) = redecide("f-1", [*forked, forged])
    assert difference.seq == cut + 1
