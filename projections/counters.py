"""The workflow's repeat-limit counters, a projection of a task's dispatches.

The conductor enforces ``limitation_info`` from exactly these numbers:
- ``step``: agents run so far (``max_step``);
- ``consecutive``: how many times the most recent agent ran in a row (``single_agent``);
- ``sequences``: for each configured pattern, how many back-to-back copies of it end the
  history (``sequences.<name>.max_repeats``).

``counters_at_decisions`` gives them as they stood at each of a task's decisions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kernelflow.events.model import AgentDispatched, ConductorDecided, Event


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


def repeat_counters(
    history: Sequence[str], sequences: Mapping[str, Sequence[str]]
) -> RepeatCounters:
    """Counters after the agents in ``history`` ran, in order."""
    run = 0
    for agent in reversed(history):
        if agent != history[-1]:
            break
        run += 1
    return RepeatCounters(
        step=len(history),
        last_agent=history[-1] if history else None,
        last_agent_run=run,
        sequences={name: _tail_repeats(history, p) for name, p in sequences.items()},
    )


def counters_at_decisions(
    events: Iterable[Event], sequences: Mapping[str, Sequence[str]]
) -> list[tuple[ConductorDecided, RepeatCounters]]:
    """Each conductor decision of a task with the counters it was decided on: those of
    the agents dispatched before it."""
    history: list[str] = []
    decisions: list[tuple[ConductorDecided, RepeatCounters]] = []
    for event in events:
        if isinstance(event, AgentDispatched):
            history.append(event.agent)
        elif isinstance(event, ConductorDecided):
            decisions.append((event, repeat_counters(history, sequences)))
    return decisions
