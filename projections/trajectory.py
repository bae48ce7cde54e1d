"""Trajectories in the AgenticRollout format (docs/agents.md, "Trajectories"), rebuilt from
a task's events.

Mapping: the submitted task is the first ``observation``; every conductor decision is a
``thought`` (its LLM exchange attached when it asked one); every LLM turn of an agent is an
``action`` with no ``tool_name`` (``metadata["agent"]`` says whose; its parsed output is
``metadata["output"]``); every tool call an agent made is an ``action`` (``tool_name`` =
the tool, ``tool_args`` = its arguments) followed by its ``action_result``
(``tool_result`` = what the tool returned; None when it failed, ``metadata`` says why); a
parse failure and every verification (``tool_result`` = the verifier's report) are
``action_result`` steps; the end of the task is the ``final_answer`` (with the judge's
exchange, if one judged it). The first agent's system prompt is
``metadata["system_prompt"]`` (the head of ``get_messages``). The recorded rewards set
``metadata["rewards"]``, and the task's own (first) reward function sets
``final_reward`` and scores the final answer: its ``reward_score``, and ``is_correct`` =
reward > 0 (before a reward is recorded a kernel is correct when its last verification
passed; an answer is not yet known).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

import msgspec

from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
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
from kernelflow.projections.rewards import rewards_for
from kernelflow.projections.task_state import CONDUCTOR, JUDGE


class StepType(StrEnum):
    OBSERVATION = "observation"
    THOUGHT = "thought"
    ACTION = "action"
    ACTION_RESULT = "action_result"
    FINAL_ANSWER = "final_answer"


@dataclass
class TrajectoryStep:
    """One step (docs/agents.md, "Trajectories"): a dataclass (``dataclasses.asdict``
    works, and a step
    takes attributes of its own as any dataclass does), whose plain data and JSON are
    msgspec's (``to_dict``/``from_dict``: what the log's exports and files hold; attributes
    set beside the declared fields are not part of it)."""

    step_type: StepType
    content: str
    metadata: dict[str, Any] = field(default_factory=dict)
    tool_name: str | None = None
    tool_args: dict[str, Any] | None = None
    tool_result: Any | None = None
    reward_score: float | None = None
    is_correct: bool | None = None
    log_probs: list[float] | None = None
    attention_mask: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data, every declared field (a copy: changing it leaves the step as it
        was)."""
        return {name: msgspec.to_builtins(getattr(self, name)) for name in _STEP_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrajectoryStep:
        return cls(**{**data, "step_type": StepType(data["step_type"])})


@dataclass
class Trajectory:
    """A whole run (docs/agents.md, "Trajectories"): a dataclass as its steps are, with
    msgspec's plain
    data and JSON (``to_dict``/``from_dict``)."""

    request_id: str
    steps: list[TrajectoryStep] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    is_completed: bool = False
    final_reward: float | None = None
    total_tokens: int = 0

    def add_step(self, step: TrajectoryStep) -> None:
        self.steps.append(step)

    def get_messages(self) -> list[dict[str, Any]]:
        """The trajectory as one chat (docs/agents.md, "Trajectories as chats"): the
        system prompt (``metadata["system_prompt"]``) if it has one, then its steps as
        ``conversation`` writes them: what chat templates and verl's multi-turn datasets
        read."""
        system = self.metadata.get("system_prompt")
        head = [{"role": "system", "content": system}] if isinstance(system, str) else []
        return head + conversation(self.steps)

    def get_final_response(self) -> str:
        for step in reversed(self.steps):
            if step.step_type == StepType.FINAL_ANSWER:
                return step.content
        return ""

    def get_tool_calls(self) -> list[TrajectoryStep]:
        """The tool calls the agents made (an agent's own LLM turns are not tool calls)."""
        return [s for s in self.steps if s.step_type == StepType.ACTION and s.tool_name]

    def get_total_reward(self) -> float:
        """The sum of the steps' reward scores (a built trajectory scores its final answer
        with ``final_reward``); ``final_reward`` when no step has a score."""
        scores = [s.reward_score for s in self.steps if s.reward_score is not None]
        return math.fsum(scores) if scores else (self.final_reward or 0.0)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, every declared field (a copy)."""
        return {
            "request_id": self.request_id,
            "steps": [s.to_dict() for s in self.steps],
            "metadata": msgspec.to_builtins(self.metadata),
            "is_completed": self.is_completed,
            "final_reward": self.final_reward,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        return cls(
            request_id=data["request_id"],
            steps=[TrajectoryStep.from_dict(s) for s in data.get("steps", ())],
            metadata=dict(data.get("metadata") or {}),
            is_completed=data.get("is_completed", False),
            final_reward=data.get("final_reward"),
            total_tokens=data.get("total_tokens", 0),
        )


_STEP_FIELDS = tuple(f.name for f in fields(TrajectoryStep))


# How an agent's own steps are written in its replies (the ReAct text format).
_WRITTEN = {
    StepType.THOUGHT: "Thought",
    StepType.ACTION: "Action",
    StepType.FINAL_ANSWER: "Final Answer",
}


def conversation(steps: Iterable[TrajectoryStep]) -> list[dict[str, Any]]:
    """Steps as chat messages: an ``observation`` is the user's; the agent's thoughts,
    actions and final answer are its (assistant) replies, written as the ReAct format
    writes them (``Thought: ...``, ``Action: ...``, ``Final Answer: ...``; the steps of
    one reply, ``metadata["llm_call"]``, in one message); a tool's result is the user's
    ``Observation: ...``. Consecutive messages of one role are joined.

    Steps recorded from the log (``metadata["event"]``) are the agents' replies whole (an
    ``action`` without ``tool_name``, a native call's result a ``tool`` message), the
    results as the agent was shown them (``Observation (tool): ...``; a check or a
    failure as it is); the thoughts (the conductor's routing), tool actions (written in
    the reply) and final answer (the last reply already) beside them are not said."""
    messages: list[dict[str, Any]] = []
    native: set[str] = set()
    reply_of: Any = None  # the reply the last assistant message was written from
    for s in steps:
        kind, meta = s.step_type, s.metadata
        logged = "event" in meta
        if kind == StepType.OBSERVATION:
            _say(messages, "user", s.content)
        elif kind == StepType.ACTION_RESULT:
            call_id = meta.get("call_id")
            if not logged:
                _say(messages, "user", f"Observation: {s.content}")
            elif call_id is not None and call_id in native:
                messages.append({"role": "tool", "content": s.content, "tool_call_id": call_id})
            elif call_id is not None:
                _say(messages, "user", f"Observation ({s.tool_name}): {s.content}")
            else:
                _say(messages, "user", s.content)
        elif logged and kind == StepType.ACTION and s.tool_name is None:
            reply: dict[str, Any] = {"role": "assistant", "content": s.content}
            calls = meta.get("tool_calls") or []
            if calls:
                reply["tool_calls"] = [_openai_call(c) for c in calls]
                native.update(str(c.get("id")) for c in calls)
            messages.append(reply)
        elif not logged:
            text = f"{_WRITTEN[kind]}: {s.content}"
            same_role = bool(messages) and messages[-1]["role"] == "assistant"
            if same_role and meta.get("llm_call", reply_of) != reply_of:
                messages.append({"role": "assistant", "content": text})
            else:
                _say(messages, "assistant", text)
            reply_of = meta.get("llm_call")
    return messages


def _say(messages: list[dict[str, Any]], role: str, content: str) -> None:
    """Append a message, joining it to the previous one when that is the same role's."""
    if messages and messages[-1]["role"] == role and "tool_calls" not in messages[-1]:
        messages[-1]["content"] += "\n" + content
    else:
        messages.append({"role": role, "content": content})


def _openai_call(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": call.get("name"), "arguments": json.dumps(call.get("args", {}))},
    }


def _llm_metadata(call: LLMCalled) -> dict[str, Any]:
    return {
        "provider": call.provider,
        "model": call.model,
        "messages": msgspec.to_builtins(call.messages),
        "usage": msgspec.to_builtins(call.usage),
        "latency_s": call.latency_s,
        "event": call.event_id,
    }


def build_trajectory(task_id: str, events: Iterable[Event]) -> Trajectory:
    builder = _Builder(Trajectory(request_id=task_id))
    handlers = _Builder.HANDLERS
    for e in events:
        handler = handlers.get(type(e))
        if handler is not None:
            handler(builder, e)
    return builder.t


class _Builder:
    """The fold behind ``build_trajectory``: one method per event type, found by a dict
    lookup (replays build trajectories for millions of events, so a step's metadata is
    built as one dict, and steps are appended directly)."""

    HANDLERS: dict[type[Event], Callable[[_Builder, Any], None]]

    def __init__(self, t: Trajectory) -> None:
        self.t = t
        self.steps = t.steps
        self.pending_conductor_call: LLMCalled | None = None
        self.last_action: dict[str, TrajectoryStep] = {}  # dispatch id → its last LLM turn
        self.primary_reward = ""
        self.final: TrajectoryStep | None = None

    def submitted(self, e: TaskSubmitted) -> None:
        row = verl_format.dataset_row(e)
        self.t.metadata.update(
            task_name=e.task_name,
            workflow=e.workflow_name,
            backend=e.backend,
            group_id=e.group_id,
            submitted_at=e.at,
            data_source=verl_format.data_source(e, row),
        )
        if e.forked_from is not None:  # its steps up to ``at`` are the original's, copied
            self.t.metadata["forked_from"] = {
                "task_id": e.forked_from.task_id,
                "at": e.forked_from.at,
            }
        self.primary_reward = rewards_for(e)[0].name
        content = e.prompt if e.prompt is not None else e.task_source
        meta = {"event": e.event_id, "at": e.at}
        self.steps.append(TrajectoryStep(StepType.OBSERVATION, content, meta))

    def llm_called(self, e: LLMCalled) -> None:
        t = self.t
        t.total_tokens += e.usage.input_tokens + e.usage.output_tokens
        if e.agent == CONDUCTOR:
            self.pending_conductor_call = e
            return
        meta = _llm_metadata(e)
        if e.agent == JUDGE and t.steps:
            meta["response"] = e.response_text
            t.steps[-1].metadata["judge"] = meta
            return
        meta["agent"], meta["dispatch_id"] = e.agent, e.dispatch_id
        if "system_prompt" not in t.metadata and e.messages and e.messages[0].role == "system":
            # The conversation's system prompt: the first agent's (get_messages).
            t.metadata["system_prompt"] = e.messages[0].content
        if e.tool_calls:
            meta["tool_calls"] = msgspec.to_builtins(e.tool_calls)
        # The agent's own turn: an action, but no tool's (its tool calls are steps of
        # their own), so ``tool_name`` stays None.
        step = TrajectoryStep(StepType.ACTION, e.response_text, meta, log_probs=e.logprobs)
        self.last_action[e.dispatch_id] = step
        self.steps.append(step)

    def parsed(self, e: OutputParsed) -> None:
        if (acted := self.last_action.get(e.dispatch_id)) is not None:
            acted.metadata["output"] = dict(e.fields)

    def failed(self, e: ParseFailed | AgentFailed) -> None:
        reason = e.reason if isinstance(e, ParseFailed) else e.error
        self.steps.append(
            TrajectoryStep(
                StepType.ACTION_RESULT,
                reason,
                {"event": e.event_id, "at": e.at, "agent": e.agent, "kind": e.kind},
                is_correct=False,
            )
        )

    def verified(self, e: VerificationCompleted) -> None:
        # The observation is what the coder's next prompt shows of the check: the
        # verifier's feedback, word for word (docs/verifier.md, "Feedback that teaches");
        # the summary where a report has none.
        self.steps.append(
            TrajectoryStep(
                StepType.ACTION_RESULT,
                e.report.feedback or e.report.summary,
                {"event": e.event_id, "at": e.at, "agent": e.agent, "dispatch_id": e.dispatch_id},
                tool_name=e.agent,
                tool_args={"code": e.code},
                tool_result=msgspec.to_builtins(e.report),
                is_correct=e.report.passed,
            )
        )

    def tool_called(self, e: ToolCalled) -> None:
        where = {
            "event": e.event_id,
            "at": e.at,
            "agent": e.agent,
            "dispatch_id": e.dispatch_id,
            "call_id": e.call_id,
        }
        self.steps.append(
            TrajectoryStep(
                StepType.ACTION,
                f"{e.tool}({', '.join(f'{k}={v!r}' for k, v in e.args.items())})",
                where,
                tool_name=e.tool,
                tool_args=dict(e.args),
            )
        )
        outcome = {"ok": e.ok, "error": e.error, "truncated": e.truncated}
        self.steps.append(
            TrajectoryStep(
                StepType.ACTION_RESULT,
                e.output,
                {**where, **outcome, "duration_s": e.duration_s},
                tool_name=e.tool,
                # What the tool gave back (what the agent was shown); nothing when it failed.
                tool_result=e.output if e.ok else None,
                is_correct=e.ok,
            )
        )

    def rewarded(self, e: RewardAssigned) -> None:
        self.t.metadata.setdefault("rewards", {})[e.reward_fn] = e.value
        if e.reward_fn == self.primary_reward:
            self.t.final_reward = e.value
            self._score_final()

    def _score_final(self) -> None:
        """The task's own (first) reward scores its final answer: correct when positive."""
        if self.final is not None and self.t.final_reward is not None:
            self.final.reward_score = self.t.final_reward
            self.final.is_correct = self.t.final_reward > 0

    def reverified(self, e: KernelReverified) -> None:
        """A later check of the final kernel: noted beside the outcome (the final answer
        stays the last step; the rewards it changes follow as ``RewardAssigned``)."""
        r = e.report
        self.t.metadata.setdefault("reverified", []).append(
            {
                "event": e.event_id,
                "at": e.at,
                "verifier_version": r.verifier_version,
                "verdict": r.verdict,
                "speedup": r.speedup,
                "speedup_conclusive": r.speedup_conclusive,
                "previous_verdict": e.previous_verdict,
                "summary": r.summary,
            }
        )

    def decided(self, e: ConductorDecided) -> None:
        meta = {
            "event": e.event_id,
            "at": e.at,
            "mode": e.mode,
            "options": e.options,
            "chosen": e.chosen,
            "after": e.after_agent,
        }
        if self.pending_conductor_call is not None:
            call = self.pending_conductor_call
            meta.update(_llm_metadata(call), llm_response=call.response_text)
            self.pending_conductor_call = None
        content = f"{e.reason} → {e.chosen}" + (f"\n{e.suggestion}" if e.suggestion else "")
        self.steps.append(TrajectoryStep(StepType.THOUGHT, content, meta))

    def ended(self, e: TaskFinished | TaskRejected | TaskCancelled) -> None:
        t = self.t
        t.is_completed = True
        t.metadata["finished_at"] = e.at
        correct: bool | None = False
        if isinstance(e, TaskFinished):
            t.metadata.update(status=e.status, verdict=e.verdict, speedup=e.speedup)
            if e.speedup_conclusive is not None:  # False: the speedup is no figure
                t.metadata["speedup_conclusive"] = e.speedup_conclusive
            content = e.final_answer or e.final_code or e.reason
            if e.final_answer is not None:
                correct = None  # an answer is right or wrong by its reward, recorded next
            else:
                correct = e.status == "success" and e.verdict == "pass"
        else:
            t.metadata["status"] = "rejected" if isinstance(e, TaskRejected) else "cancelled"
            content = e.reason
        self.final = TrajectoryStep(
            StepType.FINAL_ANSWER,
            content,
            {"event": e.event_id, "at": e.at, "reason": e.reason},
            is_correct=correct,
        )
        self.steps.append(self.final)
        self._score_final()


_Builder.HANDLERS = handler_table(
    "trajectory",
    {
        TaskSubmitted: _Builder.submitted,
        LLMCalled: _Builder.llm_called,
        OutputParsed: _Builder.parsed,
        ParseFailed: _Builder.failed,
        AgentFailed: _Builder.failed,
        VerificationCompleted: _Builder.verified,
        ToolCalled: _Builder.tool_called,
        RewardAssigned: _Builder.rewarded,
        KernelReverified: _Builder.reverified,
        ConductorDecided: _Builder.decided,
        TaskFinished: _Builder.ended,
        TaskRejected: _Builder.ended,
        TaskCancelled: _Builder.ended,
    },
    # A dispatch is shown by what the agent did (its LLM calls, tools and result).
    ignored=(AgentDispatched,),
)
