"""Agent kinds: how an agent turns its dispatch into LLM calls, tool calls and an answer.

A kind is a pure step function. Given everything the log holds about one dispatch (the
task's prompt, the LLM calls made so far and the tool calls they led to), ``next_step``
says what happens next: call the LLM, run tools, finish with an answer (which the
workflow's output parser then reads), or give up. The agent actor does the I/O and
records each result as an event, so a dispatch interrupted anywhere resumes from the log
exactly where it was, and the same kind runs the same way in a replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgspec

from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    LLMCalled,
    TaskSubmitted,
    ToolCalled,
    ToolUse,
)
from kernelflow.workflows.model import AgentSpec


@dataclass(frozen=True)
class CallLLM:
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] = field(default_factory=list)  # offered natively, if any
    # Sampling parameters the agent asks for (max_tokens, temperature): they win over
    # those the LLM configuration gives the agent.
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunTools:
    calls: tuple[ToolUse, ...]  # in order; each is recorded as one ToolCalled


@dataclass(frozen=True)
class Finish:
    text: str  # the answer, read by the workflow's output parser
    # The text is an explicit final answer (not a raw reply): an agent with one string
    # output field may take all of it as that field when nothing more structured is there.
    whole_answer: bool = False


@dataclass(frozen=True)
class GiveUp:
    error: str  # recorded as AgentFailed; the conductor routes on


Step = CallLLM | RunTools | Finish | GiveUp


@dataclass(frozen=True)
class PlannedTool:
    """The tool that the agent which ran just before chose for this one to run: the
    ``tool`` field of its answer (AgentFlow's planner: docs/workflows.md, "agentflow");
    ``tool`` None when it chose none (its answer did not parse)."""

    agent: str
    tool: str | None


@dataclass(frozen=True)
class Turn:
    """One dispatch of an agent, as the log records it."""

    prompt: list[ChatMessage]  # the task's prompt for this agent (actors.prompts)
    llm_calls: list[LLMCalled]
    tool_calls: list[ToolCalled]
    tools: list[dict[str, Any]] = field(default_factory=list)  # specs of the agent's tools
    # The agent's workspace before this step (coding agents): path -> text.
    files: Mapping[str, str] = field(default_factory=dict)
    # The task as submitted, and the dispatch this turn is of (kinds that run a program
    # of their own take the task's own prompt, not the rendered one).
    task: TaskSubmitted | None = None
    dispatch: AgentDispatched | None = None
    # Set where the agent before chose the tool (``tools`` then offers that one alone).
    planned_tool: PlannedTool | None = None

    def results_of(self, call: LLMCalled) -> list[ToolCalled]:
        """The recorded results of the tool calls ``call`` made (natively, or in its text:
        those ids start with the call's event id), in the order they ran."""
        native = {u.id for u in call.tool_calls}
        prefix = f"{call.event_id}#"
        return [t for t in self.tool_calls if t.call_id in native or t.call_id.startswith(prefix)]


class AgentConfigError(ValueError):
    """An ``agent_config`` a kind cannot use (unknown key, wrong type)."""


class KindConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Settings every kind understands; kinds extend it with their own."""


class AgentKind(ABC):
    name: ClassVar[str]
    config_type: ClassVar[type[KindConfig]] = KindConfig
    # Whether the kind needs tools to be useful (checked when a workflow is submitted).
    uses_tools: ClassVar[bool] = False

    def __init__(self, spec: AgentSpec) -> None:
        self.spec = spec
        try:
            self.config = msgspec.convert(spec.config, type=self.config_type)
        except msgspec.ValidationError as exc:
            raise AgentConfigError(
                f"agent_info.{spec.name}.agent_config: {exc} (agent kind {self.name!r})"
            ) from exc

    @abstractmethod
    def next_step(self, turn: Turn) -> Step:
        """What the agent does next, from its dispatch's recorded history only."""
