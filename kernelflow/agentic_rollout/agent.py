"""``BaseAgent``: an agent written as code, whose ``run_trajectory`` runs a whole
trajectory (docs/agents.md, "AgenticRollout").

Every LLM call (through the ``llm_generate_func`` it is handed) and every tool call
(through its tools) of a run goes through the run's journal: standalone, each is made and
recorded in the agent's in-process log (``kernelflow.agentic_rollout.recording``); in a
daemon, where a registered agent runs as a kind of its own (``as_agent_kind``), each
step replays the run against the dispatch's record (``kernelflow.actors.kinds.durable``).
Subclasses write ``run_trajectory`` as the AgenticRollout library's agents do: the journal
is put around it when the subclass is defined.
"""

from __future__ import annotations

import asyncio
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import jsonschema
import msgspec

from kernelflow.actors.kinds.base import AgentConfigError, AgentKind, Turn
from kernelflow.actors.kinds.durable import DurableKind, Journal
from kernelflow.actors.kinds.formats import (
    FormatError,
    final_answer,
    parse_call,
    tool_catalogue,
)
from kernelflow.agentic_rollout.config import default_tool_timeout
from kernelflow.agentic_rollout.limits import RetryPolicy, ToolLimits, ToolResultCache, cut_output
from kernelflow.agentic_rollout.monitoring import collector_of
from kernelflow.agentic_rollout.recording import RunLog, error_text
from kernelflow.agentic_rollout.session import (
    JournaledTool,
    ModelFunction,
    active_journal,
    journaled_model,
    journaling,
    tool_spec,
)
from kernelflow.agentic_rollout.tools import DaemonTool
from kernelflow.projections.trajectory import (
    StepType,
    Trajectory,
    TrajectoryStep,
    build_trajectory,
    conversation,
)

RunTrajectory = Callable[..., Awaitable[Any]]
# The settings BaseAgent itself reads (the rest are the agent's own).
AGENT_SETTINGS = frozenset({"tool_timeout", "tool_limits", "tool_retry", "llm_retry", "tool_cache"})
# Steps the model produced (not its inputs, not what tools returned): what max_steps counts.
_AGENT_STEPS = frozenset({StepType.THOUGHT, StepType.ACTION, StepType.FINAL_ANSWER})


class BaseAgent(ABC):
    # The name ``register_agent`` gave this class (its recorded tasks carry it).
    registered_as: ClassVar[str | None] = None

    def __init__(
        self,
        max_steps: int = 10,
        max_tokens_per_step: int = 512,
        temperature: float = 0.7,
        **kwargs: Any,
    ) -> None:
        self.max_steps = max_steps
        self.max_tokens_per_step = max_tokens_per_step
        self.temperature = temperature
        # The limits of every tool that has none of its own (docs/agents.md, "Tool
        # limits, retries and the cache"): a call may take ``tool_timeout`` seconds
        # (AGENTIC_DEFAULT_TIMEOUT, else 30), shows the model 10 KiB, and is not
        # rate-limited (one agent serves a whole batch), unless ``tool_limits`` says.
        self.tool_limits: ToolLimits = _setting(kwargs, "tool_limits", ToolLimits, None) or (
            ToolLimits(
                max_execution_time=float(kwargs.get("tool_timeout", default_tool_timeout())),
                rate_limit=None,
            )
        )
        if "tool_timeout" in kwargs and "tool_limits" in kwargs:
            raise TypeError("give tool_timeout or tool_limits (its max_execution_time), not both")
        self.tool_timeout = self.tool_limits.max_execution_time
        self.tool_retry: RetryPolicy = _setting(kwargs, "tool_retry", RetryPolicy, RetryPolicy())
        self.llm_retry: RetryPolicy = _setting(kwargs, "llm_retry", RetryPolicy, RetryPolicy())
        cache = kwargs.get("tool_cache")
        self.tool_cache = ToolResultCache() if cache is True else (cache or None)
        if self.tool_cache is not None and not isinstance(self.tool_cache, ToolResultCache):
            raise TypeError("tool_cache: True, or a ToolResultCache")
        self.tools: dict[str, JournaledTool] = {}
        # Where this agent's standalone runs are recorded: its rollout's log, else its own.
        self.run_log: RunLog | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("run_trajectory")
        if own is not None and not getattr(own, "__isabstractmethod__", False):
            cls.run_trajectory = _journaled(own)  # type: ignore[method-assign,assignment]

    @abstractmethod
    async def run_trajectory(
        self, prompt: dict[str, Any], llm_generate_func: Any, request_id: str, **kwargs: Any
    ) -> Trajectory:
        """Run one trajectory for ``prompt`` (a dict with ``content``), asking
        ``llm_generate_func(messages, max_tokens=..., temperature=...)`` for each reply."""

    # ------------------------------------------------------------------ the library's helpers

    def should_continue(self, trajectory: Trajectory) -> bool:
        """Whether the run goes on: not once it is completed or has its final answer (a
        ``FINAL_ANSWER`` step, or an action that is one: ``Action: Final Answer: ...``),
        nor once the model has taken ``max_steps`` steps (thoughts, actions, answers)."""
        if trajectory.is_completed or _answer_of(trajectory) is not None:
            return False
        taken = sum(1 for s in trajectory.steps if s.step_type in _AGENT_STEPS)
        return taken < self.max_steps

    def create_system_prompt(self) -> str:
        """The system prompt: the reply format (``Thought:``, ``Action:``, ``Final
        Answer:``) and the tools."""
        specs = [tool_spec(name, t) for name, t in self.tools.items()]
        return (
            "You are a careful problem solver. Work in steps. Write `Thought: ...` to reason, "
            "`Action: tool_name(arg='value')` to call a tool (its result comes back as an "
            "Observation), and "
            "`Final Answer: ...` when you are done.\n\n"
            f"## Tools\n{tool_catalogue(specs)}"
        )

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """A record per run of this agent in its log, as the log's events give it (seed
        003 §10.2; ``kernelflow.agentic_rollout.monitoring``)."""
        if self.run_log is None:
            return []
        name = type(self).__dict__.get("registered_as") or type(self).__name__.lower()
        return collector_of(self.run_log).runs(agent=str(name))

    def default_tools(self) -> dict[str, Any]:
        """The tools the agent comes with (``CodingAgent``'s: docs/agents.md, "CodingAgent"); an
        ``AgenticRollout`` adds those its ``tools_config`` names."""
        return {}

    def set_tools(self, tools: dict[str, Any]) -> None:
        """Give the agent its tools: ``self.tools[name]`` is each as the agent calls it
        (a ``JournaledTool``: ``.tool`` is the object given here, whose attributes it
        shows), within its limits (its own ``limits``, a ``ToolLimits``, else the
        agent's ``tool_limits``)."""
        self.tools = {
            name: JournaledTool(
                name, tool, _own_limits(tool) or self.tool_limits, self.tool_retry, self.tool_cache
            )
            for name, tool in tools.items()
        }

    async def execute_tool_call(
        self, tool_name: str, tool_args: dict[str, Any], trajectory: Trajectory
    ) -> TrajectoryStep:
        """Run one tool call, within the tool's limits; its ``ACTION_RESULT`` step (what
        the model reads is cut to ``max_output_size``; ``tool_result`` is what the tool
        returned), or an error step when the tool is unknown, the arguments do not fit
        its ``parameters_schema`` or it fails."""
        start_time = time.time()
        try:
            if tool_name not in self.tools:
                raise ValueError(f"Tool '{tool_name}' not available")
            tool = self.tools[tool_name]
            _check_arguments(tool, tool_args)
            result = await tool.execute(**tool_args)
        except Exception as e:
            return self._create_error_step(tool_name, tool_args, e)
        content, cut = cut_output(str(result), tool.limits.max_output_size)
        return TrajectoryStep(
            step_type=StepType.ACTION_RESULT,
            content=content,
            metadata={
                "tool_name": tool_name,
                "tool_args": tool_args,
                "execution_successful": True,
                "execution_time": time.time() - start_time,
                **({"output_cut": True} if cut else {}),
            },
            tool_name=tool_name,
            tool_args=tool_args,
            tool_result=_plain(result),
        )

    async def execute_tool_calls(
        self, calls: Sequence[tuple[str, dict[str, Any]]], trajectory: Trajectory
    ) -> list[TrajectoryStep]:
        """Run the calls of one step (``(tool_name, tool_args)`` pairs) concurrently
        (docs/agents.md, "Tool limits, retries and the cache"); their ``ACTION_RESULT``
        steps in the order of the calls."""
        return list(
            await asyncio.gather(
                *(self.execute_tool_call(name, args, trajectory) for name, args in calls)
            )
        )

    def _create_error_step(
        self, tool_name: str, tool_args: dict[str, Any], error: BaseException
    ) -> TrajectoryStep:
        message = str(error) or type(error).__name__
        return TrajectoryStep(
            step_type=StepType.ACTION_RESULT,
            content=f"Error executing {tool_name}: {message}",
            metadata={
                "tool_name": tool_name,
                "tool_args": tool_args,
                "execution_successful": False,
                "error": message,
            },
            tool_name=tool_name,
            tool_args=tool_args,
            is_correct=False,
        )

    def format_messages_for_llm(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        """The trajectory as chat messages for the next call: the system prompt, then
        the steps as ``Trajectory.get_messages`` writes them (the observation as the
        user's message, the agent's steps as its replies: ``Thought:``, ``Action:``,
        ``Final Answer:``; tool results as ``Observation:``)."""
        system = {"role": "system", "content": self.create_system_prompt()}
        return [system, *conversation(trajectory.steps)]

    def _parse_tool_call(self, text: str) -> tuple[str | None, dict[str, Any] | None]:
        """The call in ``text`` (``tool(arg='value')``, positional literals mapped to the
        tool's ``parameters_schema``); ``(None, None)`` when it is not one."""
        parameters = {name: tool_spec(name, t)["parameters"] for name, t in self.tools.items()}
        try:
            call, _ = parse_call(text, parameters)
        except FormatError:
            return None, None
        return call.name, call.args

    def finalize_trajectory(self, trajectory: Trajectory) -> None:
        """End the run: ``is_completed``, and a ``FINAL_ANSWER`` step when the last step
        gave the answer in the text format without being one."""
        answer = _answer_of(trajectory)
        if answer is not None and not any(
            s.step_type == StepType.FINAL_ANSWER for s in trajectory.steps
        ):
            trajectory.add_step(
                TrajectoryStep(
                    StepType.FINAL_ANSWER, answer, {"from_step": len(trajectory.steps) - 1}
                )
            )
        trajectory.is_completed = True
        trajectory.metadata.setdefault("agent_type", agent_type_of(type(self)))
        trajectory.metadata.setdefault("system_prompt", self.create_system_prompt())
        trajectory.metadata.setdefault("final_answer_given", answer is not None)

    # ------------------------------------------------------------------ daemons

    @classmethod
    def as_agent_kind(cls, name: str) -> type[AgentKind]:
        """The kind that runs this agent in daemons as ``agent_kind: name``: each step of
        a dispatch replays ``run_trajectory`` on what the log records of it."""
        return _durable_kind(cls, name)


def _journaled(run_trajectory: RunTrajectory) -> RunTrajectory:
    """``run_trajectory`` with its run's journal around it: a standalone run records
    itself in the agent's log; within a run (a daemon's replay, or a subclass calling
    ``super().run_trajectory``) it is called as it is."""

    @functools.wraps(run_trajectory)
    async def run(
        self: BaseAgent, prompt: Any, llm_generate_func: Any = None, request_id: str = "", **kw: Any
    ) -> Any:
        if active_journal() is not None:
            return await run_trajectory(self, prompt, llm_generate_func, request_id, **kw)
        if self.run_log is None:
            self.run_log = RunLog()
        name = agent_type_of(type(self))
        started = time.monotonic()
        recorded = await self.run_log.start(name, self.max_steps, prompt, request_id)
        try:
            trajectory = await run_journaled(
                recorded, self, prompt, llm_generate_func, request_id, **kw
            )
        except BaseException as exc:  # recorded as the run's failure, then raised
            await recorded.end(None, error=error_text(exc))
            raise
        answer = trajectory.get_final_response() if isinstance(trajectory, Trajectory) else None
        await recorded.end(answer)
        if isinstance(trajectory, Trajectory):
            if trajectory.final_reward is None:  # the reward the log records for the run
                trajectory.final_reward = build_trajectory(
                    recorded.task_id, recorded.history.events
                ).final_reward
            calls = recorded.llm_calls
            trajectory.metadata.setdefault("agent_type", name)
            trajectory.metadata.setdefault("total_time", time.monotonic() - started)
            trajectory.metadata.setdefault("task_id", recorded.task_id)
            trajectory.metadata.setdefault("llm_calls", len(calls))
            if not trajectory.total_tokens:
                trajectory.total_tokens = sum(
                    c.usage.input_tokens + c.usage.output_tokens for c in calls
                )
        return trajectory

    return run


async def run_journaled(
    journal: Journal,
    agent: BaseAgent,
    prompt: Any,
    llm_generate_func: ModelFunction | None,
    request_id: str,
    **kwargs: Any,
) -> Any:
    """Run ``agent.run_trajectory`` with every call through ``journal``."""
    with journaling(journal):
        model = journaled_model(journal, llm_generate_func, agent.llm_retry)
        return await agent.run_trajectory(prompt, model, request_id, **kwargs)


_KINDS: dict[tuple[type[BaseAgent], str], type[AgentKind]] = {}


def _durable_kind(agent_class: type[BaseAgent], name: str) -> type[AgentKind]:
    """The kind of ``agent_class`` under ``name`` (one class per pair)."""
    if (agent_class, name) in _KINDS:
        return _KINDS[(agent_class, name)]

    class AgentProgram(DurableKind):
        """``agent_class`` in a daemon: built from the workflow's ``agent_config``, given
        the agent's tools, run on the task's prompt."""

        agent_type: ClassVar[type[BaseAgent]] = agent_class

        def __init__(self, spec: Any) -> None:
            super().__init__(spec)
            settings = dict(spec.config)
            if settings.pop("tool_format", "text") != "text":
                raise AgentConfigError(
                    f"agent_info.{spec.name}.agent_config.tool_format: agent {name!r} calls "
                    "tools from its own code: only 'text' applies"
                )
            try:
                self.agent_type(**settings)
            except TypeError as exc:
                raise AgentConfigError(
                    f"agent_info.{spec.name}.agent_config: {exc} (agent kind {name!r})"
                ) from None
            self.settings = settings

        async def program(self, turn: Turn, journal: Journal) -> str | None:
            agent = self.agent_type(**self.settings)
            agent.set_tools({spec["name"]: DaemonTool(spec) for spec in turn.tools})
            task = turn.task
            question = "" if task is None else task.prompt or task.task_source
            trajectory = await run_journaled(
                journal, agent, {"content": question}, None, journal.task_id
            )
            return trajectory.get_final_response() if isinstance(trajectory, Trajectory) else None

    AgentProgram.__name__ = AgentProgram.__qualname__ = f"{agent_class.__name__}Kind"
    _KINDS[(agent_class, name)] = AgentProgram
    return AgentProgram


def _answer_of(trajectory: Trajectory) -> str | None:
    """The run's final answer, if it has one: its ``FINAL_ANSWER`` step, or the last step
    when that gives one in the text format (``Final Answer: ...``)."""
    for step in trajectory.steps:
        if step.step_type == StepType.FINAL_ANSWER:
            return step.content
    if trajectory.steps and trajectory.steps[-1].step_type in (StepType.ACTION, StepType.THOUGHT):
        return final_answer(trajectory.steps[-1].content)
    return None


def _plain(result: Any) -> Any:
    """A tool's result as a trajectory keeps it: as it is where it is plain data (what
    ``to_dict`` and JSON take), else its text."""
    try:
        msgspec.to_builtins(result)
    except TypeError:
        return str(result)
    return result


def _check_arguments(tool: JournaledTool, args: dict[str, Any]) -> None:
    """Refuse arguments that do not fit the tool's ``parameters_schema`` (if it has one)."""
    schema = tool_spec(tool.name, tool.tool)["parameters"]
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(args)
    )
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise ValueError(
            f"invalid arguments for {tool.name}: {where + ': ' if where else ''}{error.message}"
        )


def agent_type_of(cls: type[BaseAgent]) -> str:
    """The kind name of an agent class (``metadata["agent_type"]``, docs/agents.md,
    "Trajectories"): the name it was registered under (``react``...), else its class name
    in lower case."""
    return str(cls.__dict__.get("registered_as") or cls.__name__.lower())


def _setting(kwargs: dict[str, Any], name: str, kind: type[Any], default: Any) -> Any:
    value = kwargs.get(name, default)
    if value is not default and not isinstance(value, kind):
        raise TypeError(f"{name}: a {kind.__name__}, got {type(value).__name__}")
    return value


def _own_limits(tool: Any) -> ToolLimits | None:
    limits = getattr(tool, "limits", None)
    return limits if isinstance(limits, ToolLimits) else None
