"""Outcome rewards: named, versioned pure functions of how a task ended.

A reward function reads a ``RewardInput`` (the task's final status, its last verdict and
speedup, and the verdicts of every verification) and returns one float. Its name and
version identify it for good: a function whose behaviour changes gets a new version, so a
reward recorded in the log (``RewardAssigned``) always means what it meant when recorded.

Registered functions (``name@version``):

- ``binary@1``: 1.0 if the task succeeded (its last verification passed), else 0.0.
- ``speedup@1``: ``correct * clip(speedup, 0, cap)`` with ``cap = 10``; a correct kernel
  whose speedup was not measured (no GPU) counts as parity (1.0).
- ``cheat_penalty@1``: ``binary - penalty`` (``penalty = 1``) when any verification of the
  task was ``rejected_static`` or ``rejected_runtime`` (an attempted reward hack), else
  ``binary``; so a rollout that tried a hack and then passed gets 0, one that only
  hacked gets -1.

The conductor records every registered function's reward right after a task's
``TaskFinished`` (``pending_reward_events``): ``RewardAssigned`` is the one kind of event
that may follow a terminal event. Exports use the recorded value when present and
otherwise compute it with the same function, and say which in their provenance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from events.model import RewardAssigned, TaskFinished
from projections.task_state import TaskState

CHEAT_VERDICTS = frozenset({"rejected_static", "rejected_runtime"})


class RewardInput(msgspec.Struct, frozen=True, kw_only=True):
    """What a reward function may look at."""

    status: str  # TaskFinished.status, or "cancelled" / "rejected" / "unfinished"
    verdict: str | None = None  # the last verification's verdict
    speedup: float | None = None  # the last verification's speedup
    verdicts: tuple[str, ...] = ()  # every verification's verdict, in order

    @property
    def correct(self) -> bool:
        return self.status == "success" and self.verdict == "pass"

    @property
    def cheated(self) -> bool:
        return any(v in CHEAT_VERDICTS for v in self.verdicts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "verdict": self.verdict,
            "speedup": self.speedup,
            "verdicts": list(self.verdicts),
        }


@dataclass(frozen=True)
class RewardFn:
    name: str
    version: int
    fn: Callable[[RewardInput, dict[str, float]], float]
    params: dict[str, float] = field(default_factory=dict)
    doc: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def __call__(self, inputs: RewardInput) -> float:
        return float(self.fn(inputs, self.params))


def _binary(r: RewardInput, p: dict[str, float]) -> float:
    return 1.0 if r.correct else 0.0


def _speedup(r: RewardInput, p: dict[str, float]) -> float:
    if not r.correct:
        return 0.0
    s = 1.0 if r.speedup is None else r.speedup
    return min(max(s, 0.0), p["cap"])


def _cheat_penalty(r: RewardInput, p: dict[str, float]) -> float:
    return _binary(r, p) - (p["penalty"] if r.cheated else 0.0)


REWARD_FUNCTIONS: dict[str, RewardFn] = {
    f.key: f
    for f in (
        RewardFn("binary", 1, _binary, doc="1 if the task's kernel passed verification, else 0"),
        RewardFn(
            "speedup",
            1,
            _speedup,
            {"cap": 10.0},
            doc="correct * clip(speedup, 0, cap); unmeasured speedup counts as 1",
        ),
        RewardFn(
            "cheat_penalty",
            1,
            _cheat_penalty,
            {"penalty": 1.0},
            doc="binary - penalty if any verification was rejected as a reward hack",
        ),
    )
}
DEFAULT_REWARD = "binary@1"


class UnknownReward(ValueError):
    pass


def get_reward(spec: str) -> RewardFn:
    """``name@version`` or just ``name`` (its newest version)."""
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    versions = [f for f in REWARD_FUNCTIONS.values() if f.name == spec]
    if versions:
        return max(versions, key=lambda f: f.version)
    known = ", ".join(sorted(REWARD_FUNCTIONS))
    raise UnknownReward(f"unknown reward function {spec!r} (known: {known})")


def reward_input(state: TaskState, finished: TaskFinished | None = None) -> RewardInput:
    """The reward input of a task from its fold (``finished`` when it is about to be
    appended and so is not yet in the fold)."""
    end = finished if finished is not None else state.terminal
    verdicts = tuple(v.report.verdict for v in state.verifications)
    if isinstance(end, TaskFinished):
        return RewardInput(
            status=end.status, verdict=end.verdict, speedup=end.speedup, verdicts=verdicts
        )
    status = "unfinished" if end is None else end.kind.removeprefix("task_")
    return RewardInput(status=status, verdicts=verdicts)


def reward_events(
    state: TaskState,
    finished: TaskFinished | None = None,
    functions: Iterable[RewardFn] | None = None,
) -> list[RewardAssigned]:
    """The ``RewardAssigned`` events of a finished task: one per reward function (default:
    every registered one). ``finished`` defaults to the task's recorded ``TaskFinished``;
    pass it explicitly for a finish about to be appended (as the next event). Their cause is
    the ``TaskFinished`` event's id either way, so both paths record the same events."""
    end = finished if finished is not None else state.finished
    if end is None:
        return []
    inputs = reward_input(state, end)
    # The finish's own id: its recorded one, or the one it gets appended next.
    cause = end.event_id if end.seq else f"{state.task_id}:{state.events_seen + 1}"
    return [
        RewardAssigned(
            task_id=state.task_id,
            cause=cause,
            reward_fn=f.name,
            version=f.version,
            value=f(inputs),
            inputs={**inputs.to_dict(), "params": dict(f.params)},
        )
        for f in (functions if functions is not None else REWARD_FUNCTIONS.values())
    ]


def pending_reward_events(state: TaskState) -> list[RewardAssigned]:
    """Rewards of a finished task not recorded yet: they are appended right after its
    ``TaskFinished``, so a conductor that died before all of them were recorded leaves
    the rest for the next conductor that sees the task. Empty otherwise."""
    return [r for r in reward_events(state) if r.reward_fn not in state.rewards]
