"""The ``llm`` kind: one LLM call whose reply the workflow's output parser reads. This is
what the designer and coder of the predefined workflows are."""

from __future__ import annotations

from kernelflow.actors.kinds.base import AgentKind, CallLLM, Finish, Step, Turn
from kernelflow.actors.kinds.formats import final_answer
from kernelflow.actors.kinds.registry import register_kind


@register_kind("llm")
class SingleCallKind(AgentKind):
    def next_step(self, turn: Turn) -> Step:
        if not turn.llm_calls:
            return CallLLM(turn.prompt)
        reply = turn.llm_calls[-1].response_text
        answer = final_answer(reply)
        return Finish(reply) if answer is None else Finish(answer, whole_answer=True)
