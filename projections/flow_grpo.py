"""Flow-GRPO training samples (docs/datasets.md, "Flow-GRPO in kernelflow"), folded from
the log in two passes.

One sample per trainable LLM turn (an ``LLMCalled`` of a chosen agent: by default of the
agents the task's workflow trains, ``trainable_agents`` — agentflow's planner —, else of
every agent; never the judge's, which grades the rollout) of a task that ended. Every turn
of a rollout (task) carries the rollout's outcome reward; its advantage is normalised
within the rollout's group (the tasks submitted together with one ``group_id``; verl's
``uid``).

Two streaming passes keep memory bounded by the number of tasks, not the size of the log:

1. ``MetricsProjection`` (``kernelflow.projections.metrics``) gives every task's status, group,
   verdicts and recorded rewards, and how many trainable turns it has; ``RewardFacts``
   which reward function is the task's own (its first: ``binary@1`` for a kernel task,
   the first of ``rollout --reward`` for a prompt task) and a prompt task's answer and
   reference. ``RewardTable`` turns that into a reward per task (the recorded
   ``RewardAssigned`` value of the chosen function — by default the task's own — when
   there is one, else the same function computed from the task's outcome) and
   ``group_stats`` into one mean/std per group.
2. ``SampleBuilder`` reads the log again (up to where pass 1 stopped), holds the turns of
   unfinished tasks only, and emits a task's samples when its terminal event arrives: in
   the order tasks ended, turns in the order they happened. Same log → same samples.

Advantage ``A = (r - mean) / (std + ε)`` (or ``r - mean`` without std, Dr.GRPO) where
mean and std (sample std, ddof = 1, as verl) are taken over the group's rollouts
(``normalize="trajectory"``) or over all its turns (``normalize="turn"``, AgentFlow's
choice: a rollout with more turns weighs more; verl's own estimator over the rows). Groups
whose rewards are all equal have no signal (advantage 0, or dropped). A group of one
rollout gets advantage 0 (``singleton="keep"``, the default), is dropped, or gets what
verl's ``compute_grpo_outcome_advantage`` gives a lone value (``"raw"``: mean 0, std 1, so
about the reward itself). Drops are counted by reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

import msgspec

from kernelflow.events.model import (
    TERMINAL_EVENTS,
    AgentDispatched,
    AgentFailed,
    ChatMessage,
    ConductorDecided,
    Event,
    KernelReverified,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RewardAssigned,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.projections import verl_format
from kernelflow.projections.handlers import handler_table
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.rewards import DEFAULT_REWARD, RewardFn, get_reward, rewards_for
from kernelflow.projections.task_state import JUDGE
from kernelflow.workflows.loader import WorkflowError, parse_recorded_workflow

Normalize = Literal["trajectory", "turn"]
KeepOrDrop = Literal["keep", "drop"]
Singleton = Literal["keep", "drop", "raw"]
Overlong = Literal["truncate", "drop"]


@dataclass(frozen=True)
class GrpoOptions:
    # None: each task's workflow's ``trainable_agents``, else every agent that called an LLM.
    agents: frozenset[str] | None = None
    reward: str | None = None  # None: each task's own reward function, as recorded
    normalize: Normalize = "trajectory"
    scale_std: bool = True  # False: Dr.GRPO (no division by the std)
    epsilon: float = 1e-6
    singleton: Singleton = "keep"  # groups of one rollout: advantage 0, drop, or verl's
    zero_variance: KeepOrDrop = "keep"  # groups whose rewards are all equal
    max_prompt_chars: int | None = None
    max_response_chars: int | None = None
    max_prompt_tokens: int | None = None
    max_response_tokens: int | None = None
    overlong: Overlong = "truncate"
    # Kernels judged by the newest check by a verifier no newer than this (rewards are
    # then computed, not read); None: the newest check, and the rewards recorded with it.
    verifier_version: int | None = None

    def wants(self, agent: str, trainable: frozenset[str] | None = None) -> bool:
        """A trainable turn: a chosen agent's (by default, one of the task's ``trainable``
        agents, when its workflow names them), never the judge's (it grades the rollout)."""
        chosen = self.agents if self.agents is not None else trainable
        return agent != JUDGE and (chosen is None or agent in chosen)

    def reward_fn(self, task_reward: str | None = None) -> RewardFn:
        """The chosen function, else the task's own (``task_reward``), else the default."""
        return get_reward(self.reward or task_reward or DEFAULT_REWARD)

    @property
    def reward_label(self) -> str:
        return self.reward_fn().key if self.reward else "recorded"


class DropCounts(msgspec.Struct, kw_only=True):
    """Why turns were left out of the dataset (each count is of turns)."""

    unfinished: int = 0  # the task had not ended
    fault: int = 0  # it ended on the task's or the node's fault (a broken reference ...)
    cancelled: int = 0  # it was cancelled (a user's or an interrupt's doing, not the policy's)
    singleton_group: int = 0
    zero_variance: int = 0
    prompt_too_long: int = 0
    response_too_long: int = 0
    truncated_prompts: int = 0  # kept, but shortened (not drops)
    truncated_responses: int = 0


# --------------------------------------------------------------------------- pass 1


@dataclass(frozen=True, slots=True)
class TaskReward:
    """What pass 1 needs of a task beyond its metrics: its own reward function and, for a
    prompt task, the answer and reference its rewards compare."""

    own: str  # "name@version" of the task's first reward function
    prompt: bool
    reference: str | None = None
    answer: str | None = None
    # The agents whose turns its workflow says are trained (None: every agent's).
    trainable: frozenset[str] | None = None


class RewardFacts:
    """Pass 1's fold beside the metrics: a ``TaskReward`` per task."""

    def __init__(self) -> None:
        self.tasks: dict[str, TaskReward] = {}

    def apply(self, position: int, event: Event) -> bool:
        handler = _FACTS.get(type(event))
        if handler is not None:
            handler(self, event)
        return True

    def _submitted(self, event: TaskSubmitted) -> None:
        self.tasks[event.task_id] = TaskReward(
            own=rewards_for(event)[0].key,
            prompt=event.prompt is not None,
            reference=event.reference_answer,
            trainable=trainable_agents(event.workflow_yaml, event.workflow_name),
        )

    def _finished(self, event: TaskFinished) -> None:
        known = self.tasks.get(event.task_id)
        if known is not None and known.prompt:
            self.tasks[event.task_id] = dataclasses.replace(known, answer=event.final_answer)


# Slotted: the reward table holds one per task of the log through pass 2.
@dataclass(frozen=True, slots=True)
class RolloutReward:
    task_id: str
    group_id: str
    reward: float
    reward_fn: str  # "name@version"
    source: Literal["recorded", "computed"]
    turns: int  # trainable turns
    ended: bool
    fault: bool = False  # ended on the task's or the node's fault: not the policy's reward
    trainable: frozenset[str] | None = None  # its workflow's trainable agents (None: all)
    # Cancelled (CancelTask: a user or an interrupted run): cut short from outside, so its
    # reward is not the policy's either; a resumed rollout runs it again in its group.
    cancelled: bool = False

    @property
    def grouped(self) -> bool:
        """Whether it counts in its group's statistics."""
        return self.ended and not self.fault and not self.cancelled


@lru_cache(maxsize=256)
def trainable_agents(workflow_yaml: str, workflow_name: str) -> frozenset[str] | None:
    """The agents a recorded workflow trains (``trainable_agents``; docs/workflows.md); None
    for every agent, and for a workflow that can no longer be read."""
    try:
        return parse_recorded_workflow(workflow_yaml, workflow_name).trainable_agents
    except WorkflowError:
        return None


def trainable_turns(
    t: TaskMetrics, options: GrpoOptions, trainable: frozenset[str] | None = None
) -> int:
    return sum(n for agent, n in t.llm_calls_by_agent.items() if options.wants(agent, trainable))


def rollout_reward(
    t: TaskMetrics, options: GrpoOptions, facts: TaskReward | None = None
) -> RolloutReward:
    """The task's reward by the chosen function (default: its own, ``facts.own``; without
    facts, the first it recorded): recorded when it was, else computed."""
    fn = options.reward_fn(facts.own if facts is not None else next(iter(t.rewards), None))
    value = t.rewards.get(fn.key) if options.verifier_version is None else None
    source: Literal["recorded", "computed"] = "recorded"
    if value is None:
        inputs = t.outcome(options.verifier_version)
        if facts is not None and facts.prompt:
            inputs = msgspec.structs.replace(inputs, answer=facts.answer, reference=facts.reference)
        value, source = fn(inputs), "computed"
    return RolloutReward(
        task_id=t.task_id,
        group_id=t.group_id or t.task_id,
        reward=value,
        reward_fn=fn.key,
        source=source,
        turns=trainable_turns(t, options, facts.trainable if facts is not None else None),
        ended=t.ended,
        fault=t.outcome(options.verifier_version).fault,
        trainable=facts.trainable if facts is not None else None,
        cancelled=t.status == "cancelled",
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
        mean, std = self.mean, self.std
        if self.verdict == "singleton" and options.singleton == "raw" and self.values == 1:
            mean, std = 0.0, 1.0  # verl's compute_grpo_outcome_advantage for a lone value
        elif self.verdict != "ok":
            return 0.0
        centred = reward - mean
        if not options.scale_std:
            return centred
        assert std is not None
        return centred / (std + options.epsilon)


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var)


def group_stats(rollouts: Iterable[RolloutReward], options: GrpoOptions) -> dict[str, GroupStats]:
    """One ``GroupStats`` per group, over the rollouts that ended (a task's or node's
    fault, and a cancelled task, left out: their rewards are not the policy's)."""
    groups: dict[str, list[RolloutReward]] = {}
    for r in rollouts:
        if r.grouped:
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
        cls,
        tasks: Iterable[TaskMetrics],
        options: GrpoOptions,
        end_position: int,
        facts: dict[str, TaskReward] | None = None,
    ) -> RewardTable:
        known = facts or {}
        rollouts = {t.task_id: rollout_reward(t, options, known.get(t.task_id)) for t in tasks}
        return cls(options, rollouts, group_stats(rollouts.values(), options), end_position)

    def reward_sources(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rollouts.values():
            if r.ended:
                counts[r.source] = counts.get(r.source, 0) + 1
        return dict(sorted(counts.items()))

    def reward_fns(self) -> dict[str, int]:
        """How many ended rollouts each reward function scored."""
        counts: dict[str, int] = {}
        for r in self.rollouts.values():
            if r.ended:
                counts[r.reward_fn] = counts.get(r.reward_fn, 0) + 1
        return dict(sorted(counts.items()))


# --------------------------------------------------------------------------- pass 2


class Message(msgspec.Struct, frozen=True):
    role: str
    content: str


class RewardModel(msgspec.Struct, frozen=True):
    style: str
    ground_truth: str


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
    data_source: str
    truncated: bool = False
    # verl's per-token view of the turn: 1 for each response token (all of them are the
    # policy's), None where the server returned no token ids.
    response_mask: list[int] | None = None
    token_ids_recorded: bool = False
    # Whether the recorded ids drifted from the text under the policy's tokenizer (None:
    # not checked; kernelflow.offline.token_drift).
    token_drift: bool | None = None
    # Lengths in tokens: of the recorded ids, else as the provider counted them.
    prompt_tokens: int = 0
    response_tokens: int = 0
    ability: str = ""
    reward_model: RewardModel | None = None
    extra_info: dict[str, Any] = {}


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


def prompt_token_count(call: LLMCalled) -> int:
    if call.prompt_token_ids is not None:
        return len(call.prompt_token_ids)
    u = call.usage
    return u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens


def response_token_count(call: LLMCalled) -> int:
    return len(call.token_ids) if call.token_ids is not None else call.usage.output_tokens


@dataclass
class _OpenTask:
    submitted: TaskSubmitted | None = None
    turns: list[LLMCalled] = field(default_factory=list)


@dataclass(frozen=True)
class TaskColumns:
    """The columns every turn of a task shares (verl's dataset fields among them)."""

    workflow: str = ""
    task_name: str = ""
    data_source: str = ""
    ability: str = ""
    reward_model: RewardModel | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, sub: TaskSubmitted | None, rollout: RolloutReward) -> TaskColumns:
        if sub is None:
            return cls()
        row = verl_format.dataset_row(sub)
        truth = verl_format.reward_model(sub, row)
        rewards = [f.key for f in rewards_for(sub)]
        return cls(
            workflow=sub.workflow_name,
            task_name=sub.task_name,
            data_source=verl_format.data_source(sub, row),
            ability=verl_format.ability(sub, row),
            reward_model=RewardModel(
                str(truth.get("style", "rule")),
                verl_format.ground_truth_text(truth["ground_truth"]),
            ),
            extra_info={"kernelflow": verl_format.kernelflow_info(sub, rollout.reward_fn, rewards)},
        )


class SampleBuilder:
    """Pass 2: emit samples as tasks end. ``apply`` returns False once past the end."""

    def __init__(self, table: RewardTable, emit: Callable[[GrpoSample], None]) -> None:
        self.table = table
        self.options = table.options
        self.emit = emit
        self.drops = DropCounts()
        self.samples = 0
        self.with_token_ids = 0  # samples whose token ids the server returned
        self._open: dict[str, _OpenTask] = {}
        self._done: set[str] = set()

    def _keep_task(self, task_id: str) -> str | None:
        """None to keep the task's turns, or the reason they are dropped."""
        r = self.table.rollouts.get(task_id)
        if r is None or not r.ended:
            return "unfinished"
        if r.fault:
            return "fault"
        if r.cancelled:
            return "cancelled"
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
        rollout = self.table.rollouts.get(event.task_id)
        if not self.options.wants(event.agent, rollout.trainable if rollout else None):
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

    def _too_long(self, call: LLMCalled) -> str | None:
        """Token limits only drop: text cannot be cut to a token count without the
        tokenizer, nor token ids to match a cut text."""
        o = self.options
        if o.max_prompt_tokens is not None and prompt_token_count(call) > o.max_prompt_tokens:
            return "prompt_too_long"
        if o.max_response_tokens is not None and response_token_count(call) > o.max_response_tokens:
            return "response_too_long"
        return None

    def _emit_task(self, task_id: str, task: _OpenTask, end: Event) -> None:
        o = self.options
        rollout = self.table.rollouts[task_id]
        group = self.table.groups[rollout.group_id]
        advantage = group.advantage(rollout.reward, o)
        status = end.status if isinstance(end, TaskFinished) else end.kind.removeprefix("task_")
        columns = TaskColumns.of(task.submitted, rollout)
        index = 0
        for call in task.turns:
            if (too_long := self._too_long(call)) is not None:
                setattr(self.drops, too_long, getattr(self.drops, too_long) + 1)
                continue
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
                    reward_fn=rollout.reward_fn,
                    reward_source=rollout.source,
                    status=status,
                    model=call.model,
                    provider=call.provider,
                    workflow=columns.workflow,
                    task_name=columns.task_name,
                    data_source=columns.data_source,
                    truncated=truncated,
                    response_mask=[1] * len(token_ids) if token_ids is not None else None,
                    token_ids_recorded=token_ids is not None,
                    prompt_tokens=prompt_token_count(call),
                    response_tokens=response_token_count(call),
                    ability=columns.ability,
                    reward_model=columns.reward_model,
                    extra_info=columns.extra_info,
                )
            )
            self.samples += 1
            self.with_token_ids += token_ids is not None
            index += 1

    def finish(self) -> DropCounts:
        """Count the turns of tasks that never ended in the range read."""
        for task in self._open.values():
            self.drops.unfinished += len(task.turns)
        self._open.clear()
        return self.drops


def _chars(messages: list[ChatMessage]) -> int:
    return sum(len(m.content) for m in messages)


# The sample pass reads the trainable turns (LLM calls) of tasks, from their submission to
# their end; what the agents made of a turn, and the rewards, come from pass 1's metrics.
NOT_TURNS: tuple[type[Event], ...] = (
    AgentDispatched,
    ToolCalled,
    OutputParsed,
    ParseFailed,
    AgentFailed,
    VerificationCompleted,
    ConductorDecided,
    RewardAssigned,
    KernelReverified,
)
_SAMPLE_PASS: dict[type[Event], Callable[[SampleBuilder, Any], None]] = handler_table(
    "flow_grpo samples",
    {
        TaskSubmitted: SampleBuilder._submitted,
        LLMCalled: SampleBuilder._llm_called,
        **{t: SampleBuilder._ended for t in TERMINAL_EVENTS},
    },
    ignored=NOT_TURNS,
)
_FACTS: dict[type[Event], Callable[[RewardFacts, Any], None]] = handler_table(
    "flow_grpo reward facts",
    {TaskSubmitted: RewardFacts._submitted, TaskFinished: RewardFacts._finished},
    ignored=(*NOT_TURNS, LLMCalled, TaskCancelled, TaskRejected),
)
