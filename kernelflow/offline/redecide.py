"""Re-deciding a recorded task with today's code: every decision its conductor recorded is
made again from the log before it (``plan_next``, a pure function of the folded events),
and any that comes out otherwise is a difference (``kernelflow replay --check``; the
golden logs of tests/data/golden are re-decided by every test run).

A log written by an earlier version must keep its meaning: where a rule or a fold changed,
the old decisions no longer follow from the old events, and that is said here, with the
event and what today's code would have done instead (add an upcaster when an event
changes: docs/extending.md). Decisions made from outside the log are taken as recorded:
the conductor's LLM's choice (its answer is in the log, and is read again), a cancel, a
deadline, a budget, an agent given up on. A fork's copied decisions are its original's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from kernelflow.actors.decide import Append, AskLLM, plan_next
from kernelflow.events.model import (
    AgentDispatched,
    ConductorDecided,
    Event,
    LLMCalled,
    TaskFinished,
)
from kernelflow.projections.task_state import CONDUCTOR, TaskState, apply
from kernelflow.workflows.loader import WorkflowError, parse_recorded_workflow

__all__ = ["Difference", "redecide"]

# What the decision rules append: the events re-decided.
_DECIDED = (ConductorDecided, AgentDispatched, TaskFinished)
# Ended from outside the rules' view of the log: kept as recorded.
_EXTERNAL_ENDS = ("cancelled", "timeout", "budget_exceeded")
# Fields that say when and where an event was stored, not what was decided.
_PLACE = ("v", "seq", "at")


@dataclass(frozen=True)
class Difference:
    """A recorded decision today's code makes otherwise."""

    task_id: str
    seq: int  # the recorded event's
    kind: str
    recorded: str  # what the log holds, in short
    today: str  # what today's rules decide

    def text(self) -> str:
        return (
            f"{self.task_id} event {self.seq} ({self.kind}): recorded {self.recorded}; "
            f"today: {self.today}"
        )


def _copied(state: TaskState, event: Event) -> bool:
    """Whether ``event`` is one a fork copied from its original (docs/workflows.md,
    "Forking a task"): decided under the original's workflow, and re-decided in the
    original's replay, not here (the fork may go on with another workflow)."""
    origin = state.submitted.forked_from if state.submitted is not None else None
    return origin is not None and event.seq <= origin.at


def redecide(task_id: str, events: Sequence[Event]) -> list[Difference]:
    """The decisions of ``events`` (one task's, in order) that today's code makes otherwise
    (empty: every one follows from the events before it, as recorded)."""
    state = TaskState(task_id)
    workflow = None
    differences: list[Difference] = []
    for event in events:
        if state.submitted is not None and workflow is None:
            try:
                workflow = parse_recorded_workflow(
                    state.submitted.workflow_yaml, state.submitted.workflow_name
                )
            except WorkflowError as exc:
                return [Difference(task_id, event.seq, event.kind, "a workflow", str(exc))]
        if workflow is not None and _decided_here(event) and not _copied(state, event):
            plan = plan_next(state, workflow, now=event.at)
            problem = _compare(event, plan)
            if problem is not None:
                differences.append(Difference(task_id, event.seq, event.kind, *problem))
        apply(state, event)
    return differences


def _decided_here(event: Event) -> bool:
    """Whether ``event`` is one the decision rules append, from the log alone."""
    if isinstance(event, TaskFinished):
        external = event.status in _EXTERNAL_ENDS or event.reason.startswith("gave up")
        return not external
    return isinstance(event, _DECIDED)


def _compare(recorded: Event, plan: object) -> tuple[str, str] | None:
    """Why ``plan`` is not ``recorded``, as (recorded, today) in short; None: it is."""
    if isinstance(plan, AskLLM):
        # The conductor asked its LLM here; a decision recorded without an answer of its
        # is a fallback from the same options (the LLM failed).
        if (
            isinstance(recorded, ConductorDecided)
            and recorded.mode == "fallback"
            and list(plan.options) == list(recorded.options)
        ):
            return None
        return _short(recorded), f"ask the conductor's LLM among {list(plan.options)}"
    if not isinstance(plan, Append):
        return _short(recorded), f"nothing ({getattr(plan, 'reason', plan)})"
    if _decision(plan.event) == _decision(recorded):
        return None
    return _short(recorded), _short(plan.event)


def _decision(event: Event) -> dict[str, object]:
    data = msgspec.to_builtins(event)
    assert isinstance(data, dict)
    return {k: v for k, v in data.items() if k not in _PLACE}


def _short(event: Event) -> str:
    if isinstance(event, ConductorDecided):
        return f"{event.mode} decision after {event.after_agent or 'submit'}: {event.chosen}"
    if isinstance(event, AgentDispatched):
        return f"dispatch of {event.agent} (step {event.step})"
    if isinstance(event, TaskFinished):
        return f"finish as {event.status} ({event.reason[:80]})"
    if isinstance(event, LLMCalled) and event.agent == CONDUCTOR:
        return "a call of the conductor's LLM"
    return event.kind
