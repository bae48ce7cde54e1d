"""The ``executor`` kind: AgentFlow's tool executor (docs/workflows.md, "agentflow").

One reply writes the tool calls that carry out the step the planner chose; the tools run,
and that is the dispatch: their results are recorded (``tool_called``), the memory shows
them to the agents that follow, and no LLM call is spent reading them back. A reply
without a call is the answer as it is; one whose calls cannot be read is answered with
what was wrong and asked again, up to ``max_steps`` replies. The settings are the ``tool``
kind's.

Where the planner chose the tool (a ``tool`` field: ``Turn.planned_tool``), that tool alone
is offered and run (a call of another is recorded as failed); a planner that chose none,
or one the executor does not have, ends the turn at once with no tool run, saying why:
the memory shows the turn failed, and the planner's action and its execution never
disagree unseen.
"""

from __future__ import annotations

from kernelflow.actors.kinds.base import CallLLM, Finish, GiveUp, Step, Turn
from kernelflow.actors.kinds.registry import register_kind
from kernelflow.actors.kinds.tool import ToolKind


@register_kind("executor")
class ExecutorKind(ToolKind):
    instructions = "kind_executor.txt"

    def next_step(self, turn: Turn) -> Step:
        choice = turn.planned_tool
        if choice is not None and not turn.tools:
            if choice.tool is None:
                return Finish(f"no tool run: {choice.agent} chose none (its answer did not parse)")
            return Finish(
                f"no tool run: {choice.agent} chose {choice.tool}, which {self.spec.name} "
                "does not have"
            )
        step = super().next_step(turn)
        if isinstance(step, CallLLM | GiveUp) and turn.tool_calls:
            ran = ", ".join(f"{t.tool} {'ok' if t.ok else 'failed'}" for t in turn.tool_calls)
            return Finish(f"{len(turn.tool_calls)} tool call(s) run: {ran}")
        return step
