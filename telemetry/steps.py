"""What metrics and traces read off an appended event and its task's history: when the
step it ends began, what caused it, how the task ended. Pure and cheap: they run on the
bridge loop for every event a daemon appends."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kernelflow.actors.worker import GAVE_UP
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    Event,
    OutputParsed,
    ParseFailed,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    VerificationCompleted,
)

# How a step ended: the agent's output (parsed, or a verification done, whatever its
# verdict), an output that did not parse, or a failure (given up included).
STEP_OUTCOMES = {
    OutputParsed: "ok",
    VerificationCompleted: "ok",
    ParseFailed: "parse_failed",
    AgentFailed: "failed",
}
_CONDUCTOR_GAVE_UP = "conductor " + GAVE_UP


def dispatch_of(history: TaskHistory, dispatch_id: str) -> AgentDispatched | None:
    """The dispatch a result answers: a few events back, usually."""
    for event in reversed(history.events):
        if type(event) is AgentDispatched and event.dispatch_id == dispatch_id:
            return event
    return None


def cause_of(history: TaskHistory, event: Event) -> Event | None:
    """The event of the same task that ``event`` names as its cause (a decision's
    trigger), if it is one."""
    task_id, _, seq = event.cause.rpartition(":")
    if task_id != event.task_id or not seq.isdigit() or not 0 < int(seq) <= len(history.events):
        return None
    return history.events[int(seq) - 1]


def submitted_of(history: TaskHistory) -> TaskSubmitted | None:
    first = history.events[0] if history.events else None
    return first if type(first) is TaskSubmitted else None


def end_status(event: Event) -> str | None:
    """The status a task ends with, if ``event`` ends it."""
    if type(event) is TaskFinished:
        return event.status
    if type(event) is TaskRejected:
        return "rejected"
    if type(event) is TaskCancelled:
        return "cancelled"
    return None


def gave_up_role(event: Event) -> str | None:
    """The role that gave up on its work, if ``event`` records that."""
    if type(event) is AgentFailed and event.error.startswith(GAVE_UP):
        return event.agent
    if type(event) is TaskFinished and event.reason.startswith(_CONDUCTOR_GAVE_UP):
        return "conductor"
    return None


def routed(
    by_kind: Mapping[type[Event], Callable[[Any, TaskHistory], None]],
    step_ended: Callable[[Any, str, TaskHistory], None],
    task_ended: Callable[[Event, str, TaskHistory], None],
) -> Callable[[Event, TaskHistory], None]:
    """One function for every appended event: the handler ``by_kind`` names for its type;
    else, for a step's result, ``step_ended`` with its outcome; else, for a task's end,
    ``task_ended`` with its status. Other events are left alone."""

    def route(event: Event, history: TaskHistory) -> None:
        kind = type(event)
        if (handler := by_kind.get(kind)) is not None:
            handler(event, history)
        elif (outcome := STEP_OUTCOMES.get(kind)) is not None:
            step_ended(event, outcome, history)
        elif (status := end_status(event)) is not None:
            task_ended(event, status, history)

    return route
