"""``ReactAgent`` and ``ToolAgent``: kernelflow's kinds ``react`` and ``tool`` (docs/agents.md,
"Kinds") as ``BaseAgent``s (``CodingAgent``, the ``coding`` kind: ``coding.py``).

Each runs its kind's step function in ``run_trajectory``: the kind says what comes next
from the calls made so far, the agent makes it (the LLM through ``llm_generate_func``,
tools through ``execute_tool_call``), until the kind finishes or gives up. So the prompts,
the formats (``Thought:`` / ``Action: tool(args)`` / ``Final Answer:``, ``TOOL_CALL:``),
the notes the model is told and the limits are the kind's own, as in a daemon; and a
daemon runs these agents as their kinds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from kernelflow.actors.kinds import (
    AgentConfigError,
    AgentKind,
    CallLLM,
    Finish,
    RunTools,
    Step,
    Turn,
    agent_kind,
)
from kernelflow.actors.kinds.formats import format_call, parse_react
from kernelflow.actors.kinds.react import ReactConfig
from kernelflow.agentic_rollout.agent import AGENT_SETTINGS, BaseAgent
from kernelflow.agentic_rollout.recording import prompt_text
from kernelflow.agentic_rollout.registry import register_agent
from kernelflow.agentic_rollout.session import active_journal, message_dicts, tool_spec
from kernelflow.events.model import LLMCalled, ToolCalled
from kernelflow.projections.trajectory import StepType, Trajectory, TrajectoryStep
from kernelflow.rollout import SOLVER
from kernelflow.workflows.model import FINISH, AgentSpec, OutputField

# What the kind's calls are called while it runs here (ids only: what is recorded is the
# run's journal's).
_LOCAL = "local"


class KindAgent(BaseAgent):
    kind_name: ClassVar[str]
    # The library's names of settings the kind calls otherwise.
    aliases: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        max_steps: int = 10,
        max_tokens_per_step: int = 512,
        temperature: float = 0.7,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps, max_tokens_per_step, temperature, **kwargs)
        settings = {self.aliases.get(k, k): v for k, v in kwargs.items() if k not in AGENT_SETTINGS}
        if settings.get("tool_format", "text") != "text":
            raise TypeError(
                f"{type(self).__name__}: tool_format: only 'text' (the model writes its calls)"
            )
        spec = AgentSpec(
            name=SOLVER,
            possible_next=(FINISH,),
            output_fields=(OutputField("answer", "str", True),),
            kind=self.kind_name,
            config={"max_steps": max_steps, **settings},
        )
        try:
            self.kind = agent_kind(self.kind_name)(spec)
        except AgentConfigError as exc:
            raise TypeError(f"{type(self).__name__}: {exc}") from None

    @classmethod
    def as_agent_kind(cls, name: str) -> type[AgentKind]:
        """The kind itself, for the class that stands for it under its own name; a
        subclass is a program of its own."""
        if cls.__dict__.get("kind_name") == name:
            return agent_kind(name)
        return super().as_agent_kind(name)

    def create_system_prompt(self) -> str:
        """The kind's instructions: how it works, its format, the tools."""
        first = self.kind.next_step(
            Turn(prompt=[], llm_calls=[], tool_calls=[], tools=self._specs())
        )
        assert isinstance(first, CallLLM)
        return first.messages[0].content if first.messages else ""

    def thought_of(self, reply: str) -> str | None:
        """The thought a reply states, if the kind's format has one."""
        return None

    def next_step(self, turn: Turn, trajectory: Trajectory) -> Step:
        """What the run does next: the kind's step on ``turn`` (``trajectory``: the run's
        so far, for agents that keep state of their own: ``CodingAgent``)."""
        return self.kind.next_step(turn)

    def _specs(self) -> list[dict[str, Any]]:
        return [tool_spec(name, t) for name, t in self.tools.items()]

    async def run_trajectory(
        self, prompt: dict[str, Any], llm_generate_func: Any, request_id: str, **kwargs: Any
    ) -> Trajectory:
        journal = active_journal()
        assert journal is not None  # BaseAgent runs every run_trajectory in one
        trajectory = Trajectory(request_id=request_id)
        trajectory.add_step(
            TrajectoryStep(StepType.OBSERVATION, prompt_text(prompt), {"source": "user_input"})
        )
        calls: list[LLMCalled] = []
        results: list[ToolCalled] = []
        specs = self._specs()
        while True:
            turn = Turn(prompt=journal.prompt, llm_calls=calls, tool_calls=results, tools=specs)
            step = self.next_step(turn, trajectory)
            seq = len(calls) + len(results) + 1
            if isinstance(step, CallLLM):
                if step.messages and step.messages[0].role == "system":
                    # The system prompt as the model was given it (get_messages' head).
                    trajectory.metadata.setdefault("system_prompt", step.messages[0].content)
                reply = await llm_generate_func(
                    message_dicts(step.messages),
                    max_tokens=self.max_tokens_per_step,
                    temperature=self.temperature,
                )
                calls.append(_llm_call(seq, step, reply))
                if (thought := self.thought_of(reply)) is not None:
                    trajectory.add_step(
                        TrajectoryStep(StepType.THOUGHT, thought, {"llm_call": len(calls)})
                    )
            elif isinstance(step, RunTools):
                # The calls of one step run together; their steps follow in call order.
                outcomes = await self.execute_tool_calls(
                    [(use.name, dict(use.args)) for use in step.calls], trajectory
                )
                for n, (use, outcome) in enumerate(zip(step.calls, outcomes, strict=True)):
                    trajectory.add_step(
                        TrajectoryStep(
                            StepType.ACTION,
                            format_call(use.name, use.args),
                            {"llm_call": len(calls)},
                            tool_name=use.name,
                            tool_args=dict(use.args),
                        )
                    )
                    trajectory.add_step(outcome)
                    results.append(_tool_call(seq + n, use.id, use.name, use.args, outcome))
            elif isinstance(step, Finish):
                trajectory.add_step(
                    TrajectoryStep(StepType.FINAL_ANSWER, step.text, {"llm_call": len(calls)})
                )
                break
            else:
                trajectory.metadata["error"] = step.error
                break
        self.finalize_trajectory(trajectory)
        return trajectory


def _llm_call(seq: int, step: CallLLM, reply: str) -> LLMCalled:
    return LLMCalled(
        task_id=_LOCAL,
        seq=seq,
        agent=SOLVER,
        dispatch_id=_LOCAL,
        provider="",
        model="",
        messages=step.messages,
        response_text=reply,
    )


def _tool_call(
    seq: int, call_id: str, tool: str, args: dict[str, Any], outcome: TrajectoryStep
) -> ToolCalled:
    return ToolCalled(
        task_id=_LOCAL,
        seq=seq,
        agent=SOLVER,
        dispatch_id=_LOCAL,
        call_id=call_id,
        tool=tool,
        args=dict(args),
        ok=bool(outcome.metadata.get("execution_successful")),
        output=outcome.content,
        error=str(outcome.metadata.get("error", "")),
    )


_REACT = ReactConfig()


@dataclass
class ReactAgentConfig:
    """ReactAgent's own settings (docs/agents.md, "The API"; the ``react`` kind's,
    defaults and all):
    ``ReactAgent(config=ReactAgentConfig(...))``, or the same names as keywords."""

    require_thought_before_action: bool = _REACT.require_thought_before_action
    max_consecutive_thoughts: int = _REACT.max_consecutive_thoughts
    enable_self_reflection: bool = _REACT.enable_self_reflection


@register_agent("react")
class ReactAgent(KindAgent):
    """``Thought:`` / ``Action: tool(args)`` / ``Observation:`` until ``Final Answer:``.
    Settings: ``require_thought_before_action``, ``max_consecutive_thoughts``,
    ``enable_self_reflection`` (as keywords, or together as ``config``, a
    ``ReactAgentConfig``)."""

    kind_name = "react"

    def __init__(
        self,
        max_steps: int = 10,
        max_tokens_per_step: int = 512,
        temperature: float = 0.7,
        config: ReactAgentConfig | None = None,
        **kwargs: Any,
    ) -> None:
        if config is not None:
            if not isinstance(config, ReactAgentConfig):
                raise TypeError(f"config: a ReactAgentConfig, got {type(config).__name__}")
            given = asdict(config)
            if twice := sorted(given.keys() & kwargs.keys()):
                raise TypeError(f"{twice[0]}: given in config and as a keyword")
            kwargs = {**given, **kwargs}
        super().__init__(max_steps, max_tokens_per_step, temperature, **kwargs)

    def thought_of(self, reply: str) -> str | None:
        return parse_react(reply, {}).thought


@register_agent("tool")
class ToolAgent(KindAgent):
    """``TOOL_CALL: tool(args)`` lines, several per reply, run together; a reply without
    calls is the answer. Settings: ``allow_multiple_tool_calls``, ``max_tool_calls_per_step``,
    ``require_tool_usage``."""

    kind_name = "tool"
    aliases: ClassVar[dict[str, str]] = {
        "allow_multiple_tool_calls": "allow_multiple",
        "max_tool_calls_per_step": "max_calls_per_step",
    }
