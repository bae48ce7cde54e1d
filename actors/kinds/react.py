"""The ``react`` kind: Thought / Action / Observation until a Final Answer
(docs/agents.md, "Kinds").

Settings (``agent_config``): ``require_thought_before_action`` (an Action without a
Thought is not run; the model is asked to think first), ``max_consecutive_thoughts`` (after
that many replies with only a Thought the model is told to act), ``enable_self_reflection``
(after a failed action the model is asked to reflect on why), ``max_steps`` and
``tool_format`` (see ``kernelflow.actors.kinds.loop``). In ``native`` format the tool calls
come from the provider's tool-use API and the reply's text is the thought.
"""

from __future__ import annotations

from typing import ClassVar

from kernelflow.actors.kinds.base import KindConfig, Turn
from kernelflow.actors.kinds.formats import final_answer, parse_react
from kernelflow.actors.kinds.loop import (
    LoopConfig,
    Reading,
    ToolLoopKind,
    native_calls,
    text_call_id,
    tool_parameters,
)
from kernelflow.actors.kinds.registry import register_kind
from kernelflow.events.model import ToolCalled, ToolUse


class ReactConfig(LoopConfig, frozen=True, forbid_unknown_fields=True):
    require_thought_before_action: bool = True
    max_consecutive_thoughts: int = 3
    enable_self_reflection: bool = True


@register_kind("react")
class ReactKind(ToolLoopKind):
    config_type: ClassVar[type[KindConfig]] = ReactConfig
    config: ReactConfig
    instructions = "kind_react.txt"

    def read(self, turn: Turn, index: int) -> Reading:
        call = turn.llm_calls[index]
        if self.native:
            uses = native_calls(call)
            if uses:
                return Reading(calls=uses[:1], notes=_extra_calls_note(len(uses)))
            answer = final_answer(call.response_text)
            return Reading(answer=call.response_text.strip() if answer is None else answer)
        reply = parse_react(call.response_text, tool_parameters(turn))
        if reply.final_answer is not None:
            return Reading(answer=reply.final_answer)
        if reply.action_error is not None:
            return Reading(notes=[f"Your Action could not be read: {reply.action_error}"])
        if reply.action is not None:
            if self.config.require_thought_before_action and not reply.thought:
                return Reading(
                    notes=["Your Action was not run: write a Thought: line before each Action."]
                )
            use = ToolUse(id=text_call_id(call, 0), name=reply.action.name, args=reply.action.args)
            return Reading(calls=[use])
        thoughts = self._consecutive_thoughts(turn, index)
        if thoughts >= self.config.max_consecutive_thoughts:
            return Reading(
                notes=[
                    f"You have only thought for {thoughts} replies in a row. Act now: "
                    "call a tool with Action: or give the Final Answer:."
                ]
            )
        if reply.thought is None:
            return Reading(
                notes=["Follow the format: Thought: ..., then Action: tool(...) or Final Answer:."]
            )
        return Reading()

    def _consecutive_thoughts(self, turn: Turn, index: int) -> int:
        count = 0
        params = tool_parameters(turn)
        for call in reversed(turn.llm_calls[: index + 1]):
            reply = parse_react(call.response_text, params)
            if reply.action or reply.action_error or reply.final_answer is not None:
                break
            count += 1
        return count

    def after_result(self, turn: Turn, result: ToolCalled) -> list[str]:
        if self.config.enable_self_reflection and not result.ok:
            return ["The action failed. Reflect on why before you choose the next step."]
        return []


def _extra_calls_note(n: int) -> list[str]:
    if n <= 1:
        return []
    return [f"Only your first tool call was run ({n - 1} ignored): one action per step."]
