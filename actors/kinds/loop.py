"""What the tool-using kinds share: the act-observe loop and the conversation it builds.

Each LLM reply is *read* (which tool calls it makes, whether it is a final answer, what the
model must be told about it); the conversation for the next call is the task prompt plus,
for every earlier reply, the reply itself and an observation with its tool results and
notes. Both are recomputed from the recorded calls on every step, so nothing but the log
carries the loop's state.

Tool calls are made natively (``tool_format: native``: the provider's tool-use API) or in
the reply's text (``text``, the default: works with any model, including a policy being
trained, whose exact tokens are then the training data).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from kernelflow.actors.kinds.base import (
    AgentKind,
    CallLLM,
    Finish,
    GiveUp,
    KindConfig,
    RunTools,
    Step,
    Turn,
)
from kernelflow.actors.kinds.formats import tool_catalogue
from kernelflow.events.model import ChatMessage, LLMCalled, ToolCalled, ToolUse


class LoopConfig(KindConfig, frozen=True, forbid_unknown_fields=True):
    max_steps: int = 10  # LLM calls per dispatch before the agent gives up
    tool_format: Literal["text", "native"] = "text"


@dataclass(frozen=True)
class Reading:
    """What one reply amounts to."""

    calls: list[ToolUse] = field(default_factory=list)
    answer: str | None = None
    notes: list[str] = field(default_factory=list)  # told to the model with the results


class ToolLoopKind(AgentKind):
    config_type: ClassVar[type[KindConfig]] = LoopConfig
    uses_tools = True
    config: LoopConfig
    # The kind's instructions (actors/prompt_templates), added to the system prompt.
    instructions: ClassVar[str]

    @property
    def native(self) -> bool:
        return self.config.tool_format == "native"

    @abstractmethod
    def read(self, turn: Turn, index: int) -> Reading:
        """Read reply ``index`` of ``turn.llm_calls`` (earlier replies give context)."""

    def next_step(self, turn: Turn) -> Step:
        if turn.llm_calls:
            reading = self.read(turn, len(turn.llm_calls) - 1)
            done = {t.call_id for t in turn.tool_calls}
            pending = tuple(c for c in reading.calls if c.id not in done)
            if pending:
                return RunTools(pending)
            if reading.answer is not None and not reading.calls:
                return self.finish(turn, reading.answer)
            if len(turn.llm_calls) >= self.config.max_steps:
                return GiveUp(
                    f"{self.spec.name}: no final answer after {self.config.max_steps} "
                    f"LLM calls (agent_config.max_steps)"
                )
        return CallLLM(self.conversation(turn), tools=turn.tools if self.native else [])

    def finish(self, turn: Turn, answer: str) -> Step:
        return Finish(answer, whole_answer=True)

    # ------------------------------------------------------------------ conversation

    def conversation(self, turn: Turn) -> list[ChatMessage]:
        from kernelflow.actors.prompts import kind_instructions

        guide = kind_instructions(
            self.instructions,
            tools=tool_catalogue(turn.tools),
            tool_format=self.config.tool_format,
            max_steps=self.config.max_steps,
        )
        messages = _with_system(turn.prompt, guide)
        for index, call in enumerate(turn.llm_calls):
            reading = self.read(turn, index)
            messages.append(
                ChatMessage(
                    role="assistant",
                    content=call.response_text,
                    tool_calls=list(call.tool_calls) or None,
                )
            )
            messages += self.observation(turn, call, reading)
        return messages

    def observation(self, turn: Turn, call: LLMCalled, reading: Reading) -> list[ChatMessage]:
        results = {t.call_id: t for t in turn.tool_calls}
        messages: list[ChatMessage] = []
        lines: list[str] = []
        for use in reading.calls:
            result = results.get(use.id)
            if result is None:
                continue
            if self.native:
                messages.append(
                    ChatMessage(role="tool", content=result.output, tool_call_id=use.id)
                )
            else:
                lines.append(f"Observation ({use.name}): {result.output}")
            lines += self.after_result(turn, result)
        lines += reading.notes
        lines += self.status_lines(turn, call)
        if lines:
            messages.append(ChatMessage(role="user", content="\n".join(lines)))
        return messages

    def after_result(self, turn: Turn, result: ToolCalled) -> list[str]:
        """Extra lines after a tool result (e.g. self-reflection after a failure)."""
        return []

    def status_lines(self, turn: Turn, call: LLMCalled) -> list[str]:
        """Lines after the observation of ``call`` (e.g. the coding agent's state)."""
        return []


def text_call_id(call: LLMCalled, n: int) -> str:
    """The id of the n-th call written in a reply's text: stable across replays."""
    return f"{call.event_id}#{n}"


def native_calls(call: LLMCalled) -> list[ToolUse]:
    return list(call.tool_calls)


def tool_parameters(turn: Turn) -> dict[str, dict[str, Any]]:
    return {spec["name"]: spec.get("parameters", {}) for spec in turn.tools}


def _with_system(prompt: list[ChatMessage], guide: str) -> list[ChatMessage]:
    if not guide:
        return list(prompt)
    if prompt and prompt[0].role == "system":
        head = ChatMessage(role="system", content=f"{prompt[0].content}\n\n{guide}")
        return [head, *prompt[1:]]
    return [ChatMessage(role="system", content=guide), *prompt]
