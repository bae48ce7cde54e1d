"""The workflow's repeat-limit counters, a projection of a task's dispatches.

The conductor enforces ``limitation_info`` from exactly these numbers:
- ``step``: agents run so far (``max_step``);
- ``consecutive``: how many times the most recent agent ran in a row (``single_agent``);
- ``sequences``: for each configured pattern, how many back-to-back copies of it end the
  history (``sequences.<name>.max_repeats``), a run whose answer did not parse giving way
  to its rerun: a retry is the same run of the pattern, not a break in it (so AgentFlow's
  ``turn`` counts planner actions, however many tries each took: docs/workflows.md,
  "Limits").

``counters_at_decisions`` gives them as they stood at each of a task's decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kernelflow.events.model import (
    AgentDispatched,
    ConductorDecided,
    Event,
    ParseFailed,
    TaskSubmitted,
)
from kernelflow.projections.task_state import TaskState


@dataclass(frozen=True)
class RepeatCounters:
    step: int = 0
    last_agent: str | None = None
    last_agent_run: int = 0  # consecutive runs of last_agent at the end of the history
    sequences: Mapping[str, int] = field(default_factory=dict)

    def consecutive(self, agent: str) -> int:
        return self.last_agent_run if agent == self.last_agent else 0

    def sequence_repeats(self, name: str) -> int:
        return self.sequences.get(name, 0)


def _tail_repeats(history: Sequence[str], pattern: Sequence[str]) -> int:
    history, pattern = list(history), list(pattern)
    n, k = len(pattern), 0
    while n and len(history) >= (k + 1) * n:
        end = len(history) - k * n
        if history[end - n : end] != pattern:
            break
        k += 1
    return k


def pattern_history(history: Sequence[str], parse_failed: Sequence[bool]) -> list[str]:
    """``history`` as the sequences count it: a run whose answer did not parse
    (``parse_failed``, aligned with ``history``) and that the same agent ran again next
    gives way to that rerun."""
    return [
        agent
        for i, agent in enumerate(history)
        if not (
            i + 1 < len(history)
            and i < len(parse_failed)
            and parse_failed[i]
            and history[i + 1] == agent
        )
    ]


def repeat_counters(
    history: Sequence[str],
    sequences: Mapping[str, Sequence[str]],
    parse_failed: Sequence[bool] = (),
) -> RepeatCounters:
    """Counters after the agents in ``history`` ran, in order (``parse_failed``: which of
    those runs gave an answer that did not parse)."""
    runs = pattern_history(history, parse_failed)
    run = 0
    for agent in reversed(history):
        if agent != history[-1]:
            break
        run += 1
    return RepeatCounters(
        step=len(history),
        last_agent=history[-1] if history else None,
        last_agent_run=run,
        sequences={name: _tail_repeats(runs, p) for name, p in sequences.items()},
    )


def state_counters(state: TaskState, sequences: Mapping[str, Sequence[str]]) -> RepeatCounters:
    """The counters of a task as it stands (a task under routing version 1 counts every run
    in its sequences: ``TaskSubmitted.routing_version``)."""
    if not _retries_give_way(state.submitted):
        return repeat_counters(state.history, sequences)
    failed = [isinstance(d.result, ParseFailed) for d in state.dispatches]
    return repeat_counters(state.history, sequences, failed)


def _retries_give_way(submitted: TaskSubmitted | None) -> bool:
    return submitted is None or submitted.routing_version >= 2


def counters_at_decisions(
    events: Iterable[Event], sequences: Mapping[str, Sequence[str]]
) -> list[tuple[ConductorDecided, RepeatCounters]]:
    """Each conductor decision of a task with the counters it was decided on: those of
    the agents dispatched before it."""
    history: list[str] = []
    failed: list[bool] = []
    runs: dict[str, int] = {}  # dispatch id -> its index in history
    decisions: list[tuple[ConductorDecided, RepeatCounters]] = []
    retries_give_way = True
    for event in events:
        if isinstance(event, TaskSubmitted):
            retries_give_way = _retries_give_way(event)
        elif isinstance(event, AgentDispatched):
            runs[event.dispatch_id] = len(history)
            history.append(event.agent)
            failed.append(False)
        elif isinstance(event, ParseFailed) and retries_give_way and event.dispatch_id in runs:
            failed[runs[event.dispatch_id]] = True
        elif isinstance(event, ConductorDecided):
            decisions.append((event, repeat_counters(history, sequences, failed)))
    return decisions
