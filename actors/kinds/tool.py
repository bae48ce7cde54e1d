"""The ``tool`` kind: each reply may make one or several tool calls, whose results come
back together; a reply without calls is the answer (docs/agents.md, "Kinds").

Settings: ``allow_multiple`` (more than one call per reply), ``max_calls_per_step`` (calls
beyond it are not run, and the model is told), ``require_tool_usage`` (an answer before any
tool was used is refused once per reply with a reminder), ``max_steps``, ``tool_format``.
Text format: ``TOOL_CALL: name(args)`` lines; an explicit ``Final Answer:`` marks the
answer, otherwise the whole reply is.
"""

from __future__ import annotations

from typing import ClassVar

from kernelflow.actors.kinds.base import KindConfig, Turn
from kernelflow.actors.kinds.formats import final_answer, parse_tool_calls
from kernelflow.actors.kinds.loop import (
    LoopConfig,
    Reading,
    ToolLoopKind,
    native_calls,
    text_call_id,
    tool_parameters,
)
from kernelflow.actors.kinds.registry import register_kind
from kernelflow.events.model import ToolUse


class ToolAgentConfig(LoopConfig, frozen=True, forbid_unknown_fields=True):
    allow_multiple: bool = True
    max_calls_per_step: int = 5
    require_tool_usage: bool = False


@register_kind("tool")
class ToolKind(ToolLoopKind):
    config_type: ClassVar[type[KindConfig]] = ToolAgentConfig
    config: ToolAgentConfig
    instructions = "kind_tool.txt"

    def read(self, turn: Turn, index: int) -> Reading:
        call = turn.llm_calls[index]
        notes: list[str] = []
        if self.native:
            uses = native_calls(call)
        else:
            parsed, errors = parse_tool_calls(call.response_text, tool_parameters(turn))
            notes += [f"A TOOL_CALL could not be read: {e}" for e in errors]
            uses = [
                ToolUse(id=text_call_id(call, n), name=p.name, args=p.args)
                for n, p in enumerate(parsed)
            ]
        limit = self.config.max_calls_per_step if self.config.allow_multiple else 1
        if len(uses) > limit:
            notes.append(
                f"Only the first {limit} tool calls were run ({len(uses) - limit} ignored)."
            )
            uses = uses[:limit]
        if uses or notes:
            return Reading(calls=uses, notes=notes)
        # Only replies before this one count: an old reply must read the same way on every
        # later step, or the conversation shown to the model would change under it.
        used_tools = any(turn.results_of(c) for c in turn.llm_calls[:index])
        if self.config.require_tool_usage and not used_tools:
            return Reading(notes=["Use at least one tool before you answer."])
        answer = final_answer(call.response_text)
        return Reading(answer=call.response_text.strip() if answer is None else answer)
