"""A task's state: the fold of its events. The conductor and agents decide from this only."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgspec

from kernelflow.events.model import (
    DISPATCH_RESULTS,
    TERMINAL_EVENTS,
    AgentDispatched,
    ConductorDecided,
    Event,
    KernelReverified,
    LLMCalled,
    OutputParsed,
    QuarantinedEvent,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.projections.handlers import handler_table
from kernelflow.workflows.loader import parse_recorded_workflow
from kernelflow.workflows.model import Workflow

CONDUCTOR = "conductor"
# The LLM that judges a finished prompt task's answer (the ``judge`` reward); its call is
# recorded after the TaskFinished, keyed by the finish's event id.
JUDGE = "judge"


# A msgspec struct (built in C): a replay makes one per dispatch of millions of events.
class Dispatch(msgspec.Struct):
    """One run of one agent: its dispatch, the LLM and tool calls it made, and how it
    ended."""

    event: AgentDispatched
    llm_calls: list[LLMCalled] = []
    tool_calls: list[ToolCalled] = []
    result: Event | None = None

    @property
    def agent(self) -> str:
        return self.event.agent

    @property
    def dispatch_id(self) -> str:
        return self.event.dispatch_id


# Slotted: slots make reading and setting its fields cheaper.
@dataclass(slots=True)
class TaskState:
    task_id: str
    submitted: TaskSubmitted | None = None
    terminal: Event | None = None
    last: Event | None = None
    dispatches: list[Dispatch] = field(default_factory=list)
    decisions: list[ConductorDecided] = field(default_factory=list)
    # LLM calls the conductor made, keyed by the id of the event it was deciding after.
    conductor_calls: dict[str, LLMCalled] = field(default_factory=dict)
    # The outcome rewards recorded after the finish, by reward function name.
    rewards: dict[str, RewardAssigned] = field(default_factory=dict)
    judge_call: LLMCalled | None = None
    # Later checks of the kernel the task ended with (``kernelflow reverify``), in order.
    reverified: list[KernelReverified] = field(default_factory=list)
    events_seen: int = 0

    @property
    def history(self) -> list[str]:
        """The agents that ran, in order (the input of the repeat-limit rules)."""
        return [d.agent for d in self.dispatches]

    @property
    def step(self) -> int:
        return len(self.dispatches)

    @property
    def current(self) -> Dispatch | None:
        return self.dispatches[-1] if self.dispatches else None

    def dispatch(self, dispatch_id: str) -> Dispatch | None:
        for d in reversed(self.dispatches):  # almost always the last one
            if d.event.dispatch_id == dispatch_id:
                return d
        return None

    def llm_calls_by(self, agent: str) -> int:
        if agent == CONDUCTOR:
            return len(self.conductor_calls)
        return sum(len(d.llm_calls) for d in self.dispatches if d.agent == agent)

    def latest_output(self, agent: str) -> dict[str, object] | None:
        for d in reversed(self.dispatches):
            if d.agent == agent and isinstance(d.result, OutputParsed):
                return d.result.fields
        return None

    @property
    def verifications(self) -> list[VerificationCompleted]:
        return [d.result for d in self.dispatches if isinstance(d.result, VerificationCompleted)]

    @property
    def finished(self) -> TaskFinished | None:
        return self.terminal if isinstance(self.terminal, TaskFinished) else None

    @property
    def final_check(self) -> VerificationCompleted | None:
        """The verification whose kernel the task ended with (``TaskFinished.final_check``),
        or, before it ends or where that names none, its last."""
        checks = self.verifications
        named = self.finished.final_check if self.finished is not None else None
        if named is not None:
            return next((c for c in checks if c.event_id == named), None)
        return checks[-1] if checks else None


def _submitted(state: TaskState, event: TaskSubmitted) -> None:
    state.submitted = event


def _terminal(state: TaskState, event: Event) -> None:
    state.terminal = event


def _dispatched(state: TaskState, event: AgentDispatched) -> None:
    state.dispatches.append(Dispatch(event))


def _decided(state: TaskState, event: ConductorDecided) -> None:
    state.decisions.append(event)


def _llm_called(state: TaskState, event: LLMCalled) -> None:
    if event.agent == CONDUCTOR:
        state.conductor_calls[event.dispatch_id] = event
    elif event.agent == JUDGE:
        state.judge_call = event
    elif (d := state.dispatch(event.dispatch_id)) is not None:
        d.llm_calls.append(event)


def _tool_called(state: TaskState, event: ToolCalled) -> None:
    if (d := state.dispatch(event.dispatch_id)) is not None:
        d.tool_calls.append(event)


def _rewarded(state: TaskState, event: RewardAssigned) -> None:
    state.rewards[event.reward_fn] = event


def _reverified(state: TaskState, event: KernelReverified) -> None:
    state.reverified.append(event)


def _dispatch_result(state: TaskState, event: Event) -> None:
    d = state.dispatch(event.dispatch_id)  # type: ignore[attr-defined]
    if d is not None:
        d.result = event


# One handler per event type: a dict lookup instead of a chain of isinstance checks
# (replays fold millions of events).
_HANDLERS: dict[type[Event], Callable[[TaskState, Any], None]] = handler_table(
    "task_state",
    {
        TaskSubmitted: _submitted,
        AgentDispatched: _dispatched,
        ConductorDecided: _decided,
        LLMCalled: _llm_called,
        ToolCalled: _tool_called,
        RewardAssigned: _rewarded,
        KernelReverified: _reverified,
        **{t: _terminal for t in TERMINAL_EVENTS},
        **{t: _dispatch_result for t in DISPATCH_RESULTS},
    },
    ignored=(),
)


def apply(state: TaskState, event: Event) -> TaskState:
    """Fold one event into ``state`` (in place, returned for convenience). A quarantined
    message (``QuarantinedEvent``) is no event of the task: it takes no place in it."""
    if type(event) is QuarantinedEvent:
        return state
    state.events_seen += 1
    state.last = event
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event)
    return state


def fold(task_id: str, events: Iterable[Event]) -> TaskState:
    state = TaskState(task_id)
    for event in events:
        apply(state, event)
    return state


def workflow_of(state: TaskState) -> Workflow:
    """The workflow a task was submitted with, parsed once per document."""
    assert state.submitted is not None
    return _parse_cached(state.submitted.workflow_yaml, state.submitted.workflow_name)


@lru_cache(maxsize=64)
def _parse_cached(text: str, name: str) -> Workflow:
    # The document was accepted at submission, perhaps under laxer rules than today's.
    return parse_recorded_workflow(text, name)
