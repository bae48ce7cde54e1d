"""A task's state: the fold of its events. The conductor and agents decide from this only."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field

from events.model import (
    DISPATCH_RESULTS,
    TERMINAL_EVENTS,
    AgentDispatched,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)

CONDUCTOR = "conductor"
# The LLM that judges a finished prompt task's answer (the ``judge`` reward); its call is
# recorded after the TaskFinished, keyed by the finish's event id.
JUDGE = "judge"


@dataclass
class Dispatch:
    """One run of one agent: its dispatch, the LLM and tool calls it made, and how it
    ended."""

    event: AgentDispatched
    llm_calls: list[LLMCalled] = field(default_factory=list)
    tool_calls: list[ToolCalled] = field(default_factory=list)
    result: Event | None = None

    @property
    def agent(self) -> str:
        return self.event.agent

    @property
    def dispatch_id(self) -> str:
        return self.event.dispatch_id


@dataclass
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
        for d in reversed(self.dispatches):
            if d.dispatch_id == dispatch_id:
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
    def final_answer(self) -> str | None:
        """A prompt task's answer: the ``answer`` field of the last parsed output (or its
        only field, or all fields as JSON)."""
        for d in reversed(self.dispatches):
            if isinstance(d.result, OutputParsed):
                fields = d.result.fields
                if "answer" in fields:
                    return str(fields["answer"])
                if len(fields) == 1:
                    return str(next(iter(fields.values())))
                return json.dumps(fields, sort_keys=True)
        return None

    @property
    def finished(self) -> TaskFinished | None:
        return self.terminal if isinstance(self.terminal, TaskFinished) else None


def apply(state: TaskState, event: Event) -> TaskState:
    """Fold one event into ``state`` (in place, returned for convenience)."""
    state.events_seen += 1
    state.last = event
    if isinstance(event, TaskSubmitted):
        state.submitted = event
    elif isinstance(event, TERMINAL_EVENTS):
        state.terminal = event
    elif isinstance(event, AgentDispatched):
        state.dispatches.append(Dispatch(event))
    elif isinstance(event, ConductorDecided):
        state.decisions.append(event)
    elif isinstance(event, LLMCalled):
        if event.agent == CONDUCTOR:
            state.conductor_calls[event.dispatch_id] = event
        elif event.agent == JUDGE:
            state.judge_call = event
        elif (d := state.dispatch(event.dispatch_id)) is not None:
            d.llm_calls.append(event)
    elif isinstance(event, ToolCalled):
        if (d := state.dispatch(event.dispatch_id)) is not None:
            d.tool_calls.append(event)
    elif isinstance(event, RewardAssigned):
        state.rewards[event.reward_fn] = event
    elif isinstance(event, DISPATCH_RESULTS):
        d = state.dispatch(event.dispatch_id)  # type: ignore[attr-defined]
        if d is not None:
            d.result = event
    return state


def fold(task_id: str, events: Iterable[Event]) -> TaskState:
    state = TaskState(task_id)
    for event in events:
        apply(state, event)
    return state
