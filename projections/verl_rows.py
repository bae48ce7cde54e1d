"""The two datasets verl's own trainers read, folded from the log.

- ``PromptCollector`` (``export grpo --mode verl``): verl's RL prompt dataset, one row per
  distinct task, in the order tasks were first submitted. A prompt task's row is the
  dataset row it came from (``kernelflow.projections.verl_format``); a kernel task's prompt
  is the first LLM prompt of the agent that writes the kernel, so the policy verl trains
  is asked for what the verifier checks.
- ``ConversationCollector`` (``--mode sft``): verl's multi-turn SFT dataset, a ``messages``
  column with one conversation per row: every dispatch of a chosen agent, as its last LLM
  call saw it plus the reply (a tool-using agent's whole loop), from the rollouts the
  filter keeps (by default those whose reward is positive).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from kernelflow.events.model import (
    TERMINAL_EVENTS,
    Event,
    LLMCalled,
    TaskFinished,
    TaskSubmitted,
)
from kernelflow.projections import verl_format
from kernelflow.projections.flow_grpo import NOT_TURNS, GrpoOptions, Message, RewardTable
from kernelflow.projections.handlers import handler_table
from kernelflow.projections.rewards import rewards_for

Keep = Literal["correct", "finished", "all"]


# --------------------------------------------------------------------------- verl prompts


class VerlPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """A row of verl's prompt dataset (online RL): one per distinct task."""

    data_source: str
    prompt: list[dict[str, Any]]
    ability: str
    reward_model: dict[str, Any]
    extra_info: dict[str, Any]


@dataclass
class _Waiting:
    """A kernel task whose row waits for the prompt of the agent that writes its kernel."""

    order: int
    submitted: TaskSubmitted
    writers: frozenset[str]


class PromptCollector:
    """One verl prompt row per distinct task: a prompt task by its chat prompt, ground
    truth and data source; a kernel task by its source, backend and workflow. Rows are
    emitted by ``finish``, in the order their tasks were first submitted."""

    def __init__(self, options: GrpoOptions, emit: Callable[[VerlPrompt], None]) -> None:
        self.options = options
        self.emit = emit
        self.rows = 0
        self._seen: set[tuple[str, ...]] = set()
        self._waiting: dict[str, _Waiting] = {}
        self._made: list[tuple[int, VerlPrompt]] = []

    def apply(self, position: int, event: Event) -> bool:
        handler = _PROMPT_PASS.get(type(event))
        if handler is not None:
            handler(self, event)
        return True

    def _submitted(self, event: TaskSubmitted) -> None:
        row = verl_format.dataset_row(event)
        chat = verl_format.chat_prompt(event, row)
        if chat is not None:
            truth = verl_format.reward_model(event, row)["ground_truth"]
            key = (json.dumps(chat), json.dumps(truth), verl_format.data_source(event, row))
        else:
            key = (event.task_source, event.backend, event.workflow_name)
        if key in self._seen:
            return
        order = len(self._seen)
        self._seen.add(key)
        if chat is not None:
            self._made.append((order, self._row(event, chat)))
        else:
            writers = self.options.agents or verl_format.kernel_writers(event)
            self._waiting[event.task_id] = _Waiting(order, event, writers)

    def _llm_called(self, event: LLMCalled) -> None:
        waiting = self._waiting.get(event.task_id)
        if waiting is None:
            return
        if event.agent in waiting.writers or (
            not waiting.writers and self.options.wants(event.agent)
        ):
            del self._waiting[event.task_id]
            messages = [{"role": m.role, "content": m.content} for m in event.messages]
            self._made.append((waiting.order, self._row(waiting.submitted, messages)))

    def _ended(self, event: Event) -> None:
        waiting = self._waiting.pop(event.task_id, None)
        if waiting is not None:
            self._made.append((waiting.order, self._source_row(waiting.submitted)))

    def finish(self) -> None:
        """Emit every row: tasks whose writer never called an LLM (in the range read) ask
        for their kernel with the task source as a user message."""
        for waiting in self._waiting.values():
            self._made.append((waiting.order, self._source_row(waiting.submitted)))
        self._waiting.clear()
        for _, row in sorted(self._made, key=lambda made: made[0]):
            extra = row.extra_info
            # verl reads ``extra_info.index``: the dataset's own, else the row's number.
            extra = {**extra, "index": extra.get("index", self.rows)}
            extra["kernelflow"] = extra.pop("kernelflow")  # kernelflow's part comes last
            self.emit(msgspec.structs.replace(row, extra_info=extra))
            self.rows += 1
        self._made.clear()

    def _source_row(self, sub: TaskSubmitted) -> VerlPrompt:
        return self._row(sub, [{"role": "user", "content": sub.task_source}])

    def _row(self, sub: TaskSubmitted, prompt: list[dict[str, Any]]) -> VerlPrompt:
        row = verl_format.dataset_row(sub)
        rewards = [f.key for f in rewards_for(sub)]
        extra = dict(row.extra_info) if row is not None and row.extra_info else {}
        reward_fn = self.options.reward_fn(rewards[0]).key
        extra["kernelflow"] = verl_format.kernelflow_info(sub, reward_fn, rewards)
        return VerlPrompt(
            data_source=verl_format.data_source(sub, row),
            prompt=prompt,
            ability=verl_format.ability(sub, row),
            reward_model=verl_format.reward_model(sub, row),
            extra_info=extra,
        )


# --------------------------------------------------------------------------- SFT


class SftRow(msgspec.Struct, frozen=True, kw_only=True):
    """One conversation. verl's ``MultiTurnSFTDataset`` reads ``messages``; the rest says
    where it came from. Field order is the column order."""

    messages: list[Message]
    uid: str
    group_id: str
    rollout_id: str
    agent: str
    dispatch_id: str
    llm_calls: int  # the calls of the dispatch: the conversation has one reply per call
    reward: float
    reward_fn: str
    correct: bool  # reward > 0
    status: str
    data_source: str
    task_name: str
    workflow: str
    model: str


class SftDrops(msgspec.Struct, kw_only=True):
    """Conversations left out, by reason."""

    unfinished: int = 0  # the task had not ended
    not_kept: int = 0  # the rollout failed the --keep filter
    native_tool_calls: int = 0  # role/content messages cannot hold a native tool call


@dataclass
class _OpenConversations:
    submitted: TaskSubmitted | None = None
    # dispatch id -> (its last LLM call, how many it made), in the order dispatches began
    last_call: dict[str, tuple[LLMCalled, int]] = field(default_factory=dict)


class ConversationCollector:
    """Pass 2 of ``--mode sft`` (pass 1 is the samples' ``RewardTable``)."""

    def __init__(self, table: RewardTable, keep: Keep, emit: Callable[[SftRow], None]) -> None:
        self.table = table
        self.options = table.options
        self.keep = keep
        self.emit = emit
        self.drops = SftDrops()
        self._open: dict[str, _OpenConversations] = {}
        self._done: set[str] = set()

    def apply(self, position: int, event: Event) -> bool:
        if position > self.table.end_position:
            return False
        if event.task_id not in self._done:
            handler = _SFT_PASS.get(type(event))
            if handler is not None:
                handler(self, event)
        return True

    def _submitted(self, event: TaskSubmitted) -> None:
        self._open.setdefault(event.task_id, _OpenConversations()).submitted = event

    def _llm_called(self, event: LLMCalled) -> None:
        if self.options.wants(event.agent):
            open_task = self._open.setdefault(event.task_id, _OpenConversations())
            _, calls = open_task.last_call.get(event.dispatch_id, (event, 0))
            open_task.last_call[event.dispatch_id] = (event, calls + 1)

    def _ended(self, event: Event) -> None:
        self._done.add(event.task_id)
        task = self._open.pop(event.task_id, None)
        rollout = self.table.rollouts.get(event.task_id)
        if task is None or not task.last_call or rollout is None:
            return
        status = (
            event.status if isinstance(event, TaskFinished) else event.kind.removeprefix("task_")
        )
        kept = {
            "correct": rollout.reward > 0,
            "finished": status == "success",
            "all": True,
        }[self.keep]
        if not kept:
            self.drops.not_kept += len(task.last_call)
            return
        sub = task.submitted
        row = verl_format.dataset_row(sub) if sub is not None else None
        source = verl_format.data_source(sub, row) if sub is not None else ""
        for dispatch_id, (call, calls) in task.last_call.items():
            if _native_tool_use(call):
                self.drops.native_tool_calls += 1
                continue
            self.emit(
                SftRow(
                    messages=[
                        *(Message(m.role, m.content) for m in call.messages),
                        Message("assistant", call.response_text),
                    ],
                    uid=rollout.group_id,
                    group_id=rollout.group_id,
                    rollout_id=event.task_id,
                    agent=call.agent,
                    dispatch_id=dispatch_id,
                    llm_calls=calls,
                    reward=rollout.reward,
                    reward_fn=rollout.reward_fn,
                    correct=rollout.reward > 0,
                    status=status,
                    data_source=source,
                    task_name=sub.task_name if sub is not None else "",
                    workflow=sub.workflow_name if sub is not None else "",
                    model=call.model,
                )
            )

    def finish(self) -> SftDrops:
        for task in self._open.values():
            self.drops.unfinished += len(task.last_call)
        self._open.clear()
        return self.drops


def _native_tool_use(call: LLMCalled) -> bool:
    return bool(call.tool_calls) or any(m.role == "tool" or m.tool_calls for m in call.messages)


_PROMPT_PASS: dict[type[Event], Callable[[PromptCollector, Any], None]] = handler_table(
    "flow_grpo verl prompts",
    {
        TaskSubmitted: PromptCollector._submitted,
        LLMCalled: PromptCollector._llm_called,
        **{t: PromptCollector._ended for t in TERMINAL_EVENTS},
    },
    ignored=NOT_TURNS,
)
_SFT_PASS: dict[type[Event], Callable[[ConversationCollector, Any], None]] = handler_table(
    "flow_grpo sft conversations",
    {
        TaskSubmitted: ConversationCollector._submitted,
        LLMCalled: ConversationCollector._llm_called,
        **{t: ConversationCollector._ended for t in TERMINAL_EVENTS},
    },
    ignored=NOT_TURNS,
)
