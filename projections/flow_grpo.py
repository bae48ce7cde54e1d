"""Flow-GRPO training samples (seed 002), folded from the log in two passes.

One sample per trainable LLM turn (an ``LLMCalled`` of a chosen agent) of a task that
ended. Every turn of a rollout (task) carries the rollout's outcome reward; its advantage
is normalised within the rollout's group (the tasks submitted together with one
``group_id``; verl's ``uid``).

Two streaming passes keep memory bounded by the number of tasks, not the size of the log:

1. ``MetricsProjection`` (``kernelflow.projections.metrics``) gives every task's status, group,
   verdicts and recorded rewards, and how many trainable turns it has. ``RewardTable``
   turns that into a reward per task (the recorded ``RewardAssigned`` value of the chosen
   function when there is one, else the same function computed from the task's outcome)
   and ``group_stats`` into one mean/std per group.
2. ``SampleBuilder`` reads the log again (up to where pass 1 stopped), holds the turns of
   unfinished tasks only, and emits a task's samples when its terminal event arrives: in
   the order tasks ended, turns in the order they happened. Same log → same samples.

Advantage ``A = (r - mean) / (std + ε)`` (or ``r - mean`` without std, Dr.GRPO) where
mean and std (sample std, ddof = 1, as verl) are taken over the group's rollouts
(``normalize="trajectory"``) or over all its turns (``normalize="turn"``, AgentFlow's
choice: a rollout with more turns weighs more). Groups of one rollout and groups whose
rewards are all equal have no signal: ``singleton`` / ``zero_variance`` say whether to keep
them with advantage 0 or drop them. Drops are counted by reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from kernelflow.events.model import (
    TERMINAL_EVENTS,
    AgentDispatched,
    AgentFailed,
    ChatMessage,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.projections.handlers import handler_table
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.rewards import DEFAULT_REWARD, RewardFn, get_reward

DATA_SOURCE = "kernelflow"
ABILITY = "kernel_generation"

Normalize = Literal["trajectory", "turn"]
KeepOrDrop = Literal["keep", "drop"]
Overlong = Literal["truncate", "drop"]


@dataclass(frozen=True)
class GrpoOptions:
    agents: frozenset[str] | None = None  # None: every agent that called an LLM
    reward: str = DEFAULT_REWARD
    normalize: Normalize = "trajectory"
    scale_std: bool = True  # False: Dr.GRPO (no division by the std)
    epsilon: float = 1e-6
    singleton: KeepOrDrop = "keep"  # groups of one rollout: advantage 0, or drop
    zero_variance: KeepOrDrop = "keep"  # groups whose rewards are all equal
    max_prompt_chars: int | None = None
    max_response_chars: int | None = None
    overlong: Overlong = "truncate"

    def wants(self, agent: str) -> bool:
        return self.agents is None or agent in self.agents

    @property
    def reward_fn(self) -> RewardFn:
        return get_reward(self.reward)


class DropCounts(msgspec.Struct, kw_only=True):
    """Why turns were left out of the dataset (each count is of turns)."""

    unfinished: int = 0  # the task had not ended
    singleton_group: int = 0
    zero_variance: int = 0
    prompt_too_long: int = 0
    response_too_long: int = 0
    truncated_prompts: int = 0  # kept, but shortened (not drops)
    truncated_responses: int = 0


# --------------------------------------------------------------------------- pass 1


# Slotted: the reward table holds one per task of the log through pass 2.
@dataclass(frozen=True, slots=True)
class RolloutReward:
    task_id: str
    group_id: str
    reward: float
    source: Literal["recorded", "computed"]
    turns: int  # trainable turns
    ended: bool


def trainable_turns(t: TaskMetrics, options: GrpoOptions) -> int:
    return sum(n for agent, n in t.llm_calls_by_agent.items() if options.wants(agent))


def rollout_reward(t: TaskMetrics, options: GrpoOptions) -> RolloutReward:
    fn = options.reward_fn
    recorded = t.rewards.get(fn.key)
    return RolloutReward(
        task_id=t.task_id,
        group_id=t.group_id or t.task_id,
        reward=recorded if recorded is not None else fn(t.reward_input()),
        source="recorded" if recorded is not None else "computed",
        turns=trainable_turns(t, options),
        ended=t.ended,
    )


@dataclass(frozen=True, slots=True)
class GroupStats:
    group_id: str
    rollouts: int
    values: int  # how many rewards the statistics were taken over
    mean: float
    std: float | None  # None for a single value
    verdict: Literal["ok", "singleton", "zero_variance"]

    def advantage(self, reward: float, options: GrpoOptions) -> float:
        if self.verdict != "ok":
            return 0.0
        centred = reward - self.mean
        if not options.scale_std:
            return centred
        assert self.std is not None
        return centred / (self.std + options.epsilon)


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var)


def group_stats(rollouts: Iterable[RolloutReward], options: GrpoOptions) -> dict[str, GroupStats]:
    """One ``GroupStats`` per group, over the rollouts that ended."""
    groups: dict[str, list[RolloutReward]] = {}
    for r in rollouts:
        if r.ended:
            groups.setdefault(r.group_id, []).append(r)
    out = {}
    for gid, rs in sorted(groups.items()):
        if options.normalize == "turn":
            values = [r.reward for r in rs for _ in range(r.turns)]
        else:
            values = [r.reward for r in rs]
        if not values:
            values = [r.reward for r in rs]
        mean, std = _mean_std(values)
        verdict: Literal["ok", "singleton", "zero_variance"] = "ok"
        if len(rs) < 2:
            verdict = "singleton"
        elif max(values) == min(values):
            verdict = "zero_variance"
        out[gid] = GroupStats(gid, len(rs), len(values), mean, std, verdict)
    return out


@dataclass
class RewardTable:
    """Pass 1's answer: every task's reward and every group's statistics."""

    options: GrpoOptions
    rollouts: dict[str, RolloutReward]
    groups: dict[str, GroupStats]
    end_position: int  # where pass 1 stopped: pass 2 reads no further

    @classmethod
    def from_tasks(
        cls, tasks: Iterable[TaskMetrics], options: GrpoOptions, end_position: int
    ) -> RewardTable:
        rollouts = {t.task_id: rollout_reward(t, options) for t in tasks}
        return cls(options, rollouts, group_stats(rollouts.values(), options), end_position)

    def reward_sources(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rollouts.values():
            if r.ended:
                counts[r.source] = counts.get(r.source, 0) + 1
        return dict(sorted(counts.items()))


# --------------------------------------------------------------------------- pass 2


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str


class GrpoSample(msgspec.Struct, frozen=True, kw_only=True):
    """One row of the dataset. Field order is the column order."""

    uid: str  # = group_id: what verl's GRPO groups by
    group_id: str
    rollout_id: str  # the task id
    turn_index: int  # among the rollout's trainable turns, from 0
    agent: str
    dispatch_id: str
    event_seq: int  # the LLMCalled event's position in its task
    prompt: list[Message]
    response: str
    prompt_token_ids: list[int] | None
    response_token_ids: list[int] | None
    response_logprobs: list[float] | None
    reward: float
    advantage: float
    reward_fn: str
    reward_source: str
    status: str
    model: str
    provider: str
    workflow: str
    task_name: str
    data_source: str = DATA_SOURCE
    truncated: bool = False


def _truncate_prompt(messages: list[Message], limit: int) -> list[Message]:
    """Shorten the oldest non-system messages from their start until the prompt fits."""
    out = list(messages)
    excess = sum(len(m.content) for m in out) - limit
    for i, m in enumerate(out):
        if excess <= 0:
            break
        if m.role == "system":
            continue
        cut = min(len(m.content), excess)
        out[i] = Message(m.role, m.content[cut:])
        excess -= cut
    return out


@dataclass
class _OpenTask:
    submitted: TaskSubmitted | None = None
    turns: list[LLMCalled] = field(default_factory=list)


class SampleBuilder:
    """Pass 2: emit samples as tasks end. ``apply`` returns False once past the end."""

    def __init__(self, table: RewardTable, emit: Callable[[GrpoSample], None]) -> None:
        self.table = table
        self.options = table.options
        self.emit = emit
        self.drops = DropCounts()
        self.samples = 0
        self._open: dict[str, _OpenTask] = {}
        self._done: set[str] = set()

    def _keep_task(self, task_id: str) -> str | None:
        """None to keep the task's turns, or the reason they are dropped."""
        r = self.table.rollouts.get(task_id)
        if r is None or not r.ended:
            return "unfinished"
        g = self.table.groups[r.group_id]
        if g.verdict == "singleton" and self.options.singleton == "drop":
            return "singleton_group"
        if g.verdict == "zero_variance" and self.options.zero_variance == "drop":
            return "zero_variance"
        return None

    def apply(self, position: int, event: Event) -> bool:
        if position > self.table.end_position:
            return False
        if event.task_id not in self._done:
            handler = _SAMPLE_PASS.get(type(event))
            if handler is not None:
                handler(self, event)
        return True

    def _submitted(self, event: TaskSubmitted) -> None:
        self._open.setdefault(event.task_id, _OpenTask()).submitted = event

    def _llm_called(self, event: LLMCalled) -> None:
        if not self.options.wants(event.agent):
            return
        reason = self._keep_task(event.task_id)
        if reason is None:
            self._open.setdefault(event.task_id, _OpenTask()).turns.append(event)
        else:
            setattr(self.drops, reason, getattr(self.drops, reason) + 1)

    def _ended(self, event: Event) -> None:
        self._done.add(event.task_id)
        task = self._open.pop(event.task_id, None)
        if task is not None and task.turns:
            self._emit_task(event.task_id, task, event)

    def _emit_task(self, task_id: str, task: _OpenTask, end: Event) -> None:
        o = self.options
        rollout = self.table.rollouts[task_id]
        group = self.table.groups[rollout.group_id]
        advantage = group.advantage(rollout.reward, o)
        status = end.status if isinstance(end, TaskFinished) else end.kind.removeprefix("task_")
        sub = task.submitted
        index = 0
        for call in task.turns:
            prompt = [Message(m.role, m.content) for m in call.messages]
            response = call.response_text
            token_ids, logprobs = call.token_ids, call.logprobs
            prompt_ids = call.prompt_token_ids
            truncated = False
            if o.max_prompt_chars is not None and _chars(call.messages) > o.max_prompt_chars:
                if o.overlong == "drop":
                    self.drops.prompt_too_long += 1
                    continue
                prompt = _truncate_prompt(prompt, o.max_prompt_chars)
                prompt_ids, truncated = None, True
                self.drops.truncated_prompts += 1
            if o.max_response_chars is not None and len(response) > o.max_response_chars:
                if o.overlong == "drop":
                    self.drops.response_too_long += 1
                    continue
                # Token ids cannot be cut to match characters: they are left out.
                response, token_ids, logprobs, truncated = (
                    response[: o.max_response_chars],
                    None,
                    None,
                    True,
                )
                self.drops.truncated_responses += 1
            self.emit(
                GrpoSample(
                    uid=rollout.group_id,
                    group_id=rollout.group_id,
                    rollout_id=task_id,
                    turn_index=index,
                    agent=call.agent,
                    dispatch_id=call.dispatch_id,
                    event_seq=call.seq,
                    prompt=prompt,
                    response=response,
                    prompt_token_ids=prompt_ids,
                    response_token_ids=token_ids,
                    response_logprobs=logprobs,
                    reward=rollout.reward,
                    advantage=advantage,
                    reward_fn=o.reward_fn.key,
                    reward_source=rollout.source,
                    status=status,
                    model=call.model,
                    provider=call.provider,
                    workflow=sub.workflow_name if sub else "",
                    task_name=sub.task_name if sub else "",
                    truncated=truncated,
                )
            )
            self.samples += 1
            index += 1

    def finish(self) -> DropCounts:
        """Count the turns of tasks that never ended in the range read."""
        for task in self._open.values():
            self.drops.unfinished += len(task.turns)
        self._open.clear()
        return self.drops


def _chars(messages: list[ChatMessage]) -> int:
    return sum(len(m.content) for m in messages)


# --------------------------------------------------------------------------- verl prompts


class RewardModel(msgspec.Struct, frozen=True):
    style: str
    ground_truth: str


class VerlPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """A row of verl's prompt dataset (online RL): one per distinct task."""

    data_source: str
    prompt: list[Message]
    ability: str
    reward_model: RewardModel
    extra_info: dict[str, Any]


class PromptCollector:
    """One verl prompt row per distinct (task source, backend, workflow), in the order
    tasks were first submitted. The prompt is the first trainable LLM turn's messages
    (what the policy is asked first); without one, the task source as a user message."""

    def __init__(self, options: GrpoOptions, emit: Callable[[VerlPrompt], None]) -> None:
        self.options = options
        self.emit = emit
        self._pending: dict[str, TaskSubmitted] = {}
        self._seen: set[tuple[str, str, str]] = set()
        self.rows = 0

    def _key(self, s: TaskSubmitted) -> tuple[str, str, str]:
        return (s.task_source, s.backend, s.workflow_name)

    def apply(self, position: int, event: Event) -> bool:
        handler = _PROMPT_PASS.get(type(event))
        if handler is not None:
            handler(self, event)
        return True

    def _submitted(self, event: TaskSubmitted) -> None:
        if self._key(event) not in self._seen:
            self._seen.add(self._key(event))
            self._pending[event.task_id] = event

    def _llm_called(self, event: LLMCalled) -> None:
        if self.options.wants(event.agent):
            sub = self._pending.pop(event.task_id, None)
            if sub is not None:
                self._row(sub, [Message(m.role, m.content) for m in event.messages])

    def _ended(self, event: Event) -> None:
        sub = self._pending.pop(event.task_id, None)
        if sub is not None:
            self._row(sub, [Message("user", sub.task_source)])

    def finish(self) -> None:
        for sub in list(self._pending.values()):
            self._row(sub, [Message("user", sub.task_source)])
        self._pending.clear()

    def _row(self, sub: TaskSubmitted, prompt: list[Message]) -> None:
        self.emit(
            VerlPrompt(
                data_source=f"{DATA_SOURCE}/{sub.backend}",
                prompt=prompt,
                ability=ABILITY,
                reward_model=RewardModel(style="rule", ground_truth=sub.task_source),
                extra_info={
                    "index": self.rows,
                    "task_id": sub.task_id,
                    "task_name": sub.task_name,
                    "group_id": sub.group_id,
                    "workflow": sub.workflow_name,
                    "backend": sub.backend,
                    "reward_fn": self.options.reward_fn.key,
                },
            )
        )
        self.rows += 1


# Both passes read the trainable turns (LLM calls) of tasks, from their submission to their
# end; what the agents made of a turn, and the rewards, come from pass 1's metrics.
_NOT_TURNS = (
    AgentDispatched,
    ToolCalled,
    OutputParsed,
    ParseFailed,
    AgentFailed,
    VerificationCompleted,
    ConductorDecided,
    RewardAssigned,
)
_SAMPLE_PASS: dict[type[Event], Callable[[SampleBuilder, Any], None]] = handler_table(
    "flow_grpo samples",
    {
        TaskSubmitted: SampleBuilder._submitted,
        LLMCalled: SampleBuilder._llm_called,
        **{t: SampleBuilder._ended for t in TERMINAL_EVENTS},
    },
    ignored=_NOT_TURNS,
)
_PROMPT_PASS: dict[type[Event], Callable[[PromptCollector, Any], None]] = handler_table(
    "flow_grpo verl prompts",
    {
        TaskSubmitted: PromptCollector._submitted,
        LLMCalled: PromptCollector._llm_called,
        **{t: PromptCollector._ended for t in TERMINAL_EVENTS},
    },
    ignored=_NOT_TURNS,
)
