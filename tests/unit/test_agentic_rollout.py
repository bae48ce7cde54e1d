"""The AgenticRollout library on kernelflow (docs/agents.md, "AgenticRollout"): standalone
runs recorded in an in-process log and exported like any task's, a user's own model
function recorded like a provider, kernelflow's kinds as BaseAgents, and registered
agents run by the agent actor as durable kinds that replay their record (on the memory
bridge: tests/integration/test_agentic_rollout_daemon.py runs real daemons)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from examples.agentic_rollout.seed.research_agent import ResearchAgent
from kernelflow.actors.agents import LLMAgent
from kernelflow.actors.conductor import Conductor
from kernelflow.actors.kinds import (
    CallLLM,
    DivergenceError,
    Finish,
    GiveUp,
    RunTools,
    Turn,
    agent_kind,
)
from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.agentic_rollout import (
    AgenticRollout,
    AgenticRolloutConfig,
    BaseAgent,
    CalculatorTool,
    ReactAgent,
    StepType,
    ToolAgent,
    ToolConfigError,
    Trajectory,
    TrajectoryAnalyzer,
    TrajectoryStep,
    get_agent_class,
    list_agents,
    register_agent,
    tools_from_config,
)
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    Event,
    LLMCalled,
    OutputParsed,
    RewardAssigned,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.llm import make_provider
from kernelflow.llm.base import LLMRequest, LLMResponse
from kernelflow.offline.grpo import export_grpo
from kernelflow.offline.sources import EventFilter, FileSource
from kernelflow.projections.flow_grpo import GrpoOptions
from kernelflow.projections.task_state import fold
from kernelflow.rollout import RolloutConfig
from kernelflow.workflows.model import AgentSpec, OutputField
from tests.daemons import assert_each_step_once, trigger_message
from tests.memory import running_bridge
from tests.unit.test_agent_kinds import CALC

RESEARCH_SCRIPT = [
    "Thought: I will plan the computation.",
    "Action: calculator(expression='6 * 7')",
    "Action: calculator(expression='42 / 1')",
    "Final Answer: the conclusion is 42",
]


def turns(*replies: str | dict[str, Any]) -> Any:
    """A model that gives its n-th reply on the n-th turn of a conversation."""

    async def model(messages: list[dict[str, Any]], **kwargs: Any) -> str | dict[str, Any]:
        return replies[min(sum(m["role"] == "assistant" for m in messages), len(replies) - 1)]

    return model


def calculator_rollout(*replies: str | dict[str, Any], **settings: Any) -> AgenticRollout:
    rollout = AgenticRollout(AgenticRolloutConfig(**settings), llm_generate_func=turns(*replies))
    rollout.tools = {"calculator": CalculatorTool()}
    rollout.agent.set_tools(rollout.tools)
    return rollout


def run(rollout: AgenticRollout, question: str, request_id: str, **prompt: Any) -> Trajectory:
    trajectory = asyncio.run(
        rollout.agent.run_trajectory(
            {"content": question, **prompt}, rollout.llm_generate_func, request_id
        )
    )
    assert isinstance(trajectory, Trajectory)
    return trajectory


# --------------------------------------------------------------------------- standalone


def test_a_standalone_run_is_a_recorded_task_whose_fold_is_its_trajectory() -> None:
    rollout = calculator_rollout(
        {
            "text": "Thought: multiply.\nAction: calculator(expression='6 * 7')",
            "token_ids": [11, 12, 13],
            "logprobs": [-0.5, -0.25, -0.125],
        },
        "Thought: the calculator says so.\nFinal Answer: 42",
    )
    own = run(rollout, "What is 6 times 7?", "q 1", ground_truth="42", uid="g1")
    assert [s.step_type for s in own.steps] == [
        StepType.OBSERVATION, StepType.THOUGHT, StepType.ACTION, StepType.ACTION_RESULT,
        StepType.THOUGHT, StepType.FINAL_ANSWER,
    ]  # fmt: skip
    assert own.steps[3].tool_result == 42 and own.get_final_response() == "42"
    assert own.is_completed and own.total_tokens == 3 and own.metadata["llm_calls"] == 2

    task_id = own.metadata["task_id"]
    assert task_id == "q-1"
    events = rollout.run_log.events(task_id)
    assert_each_step_once(events)
    kinds = [e.kind for e in events]
    assert kinds == [
        "task_submitted", "conductor_decided", "agent_dispatched", "llm_called", "tool_called",
        "llm_called", "output_parsed", "conductor_decided", "task_finished",
        "reward_assigned", "reward_assigned",
    ]  # fmt: skip
    first, tool = events[3], events[4]
    assert isinstance(first, LLMCalled) and isinstance(tool, ToolCalled)
    assert first.provider == "function" and first.token_ids == [11, 12, 13]
    assert first.logprobs == [-0.5, -0.25, -0.125]
    assert first.params == {"max_tokens": 512, "temperature": 0.7}
    assert (tool.tool, tool.args, tool.ok, tool.output) == (
        "calculator", {"expression": "6 * 7"}, True, "42",
    )  # fmt: skip
    submitted = events[0]
    assert isinstance(submitted, TaskSubmitted)
    assert (submitted.prompt, submitted.reference_answer, submitted.group_id) == (
        "What is 6 times 7?", "42", "g1",
    )  # fmt: skip

    folded = rollout.trajectory(task_id)
    assert folded.final_reward == 1.0 and folded.metadata["status"] == "success"
    assert folded.get_final_response() == "42"
    assert [(c.tool_name, c.tool_args) for c in folded.get_tool_calls()] == [
        ("calculator", {"expression": "6 * 7"})
    ]
    # A second run of the same request is a task of its own.
    again = run(rollout, "What is 6 times 7?", "q 1")
    assert again.metadata["task_id"] == "q-1-2"
    assert rollout.run_log.task_id_for("q-1-2") == "q-1-2-2"


def test_react_agent_sends_what_the_react_kind_sends() -> None:
    """Same prompts and formats as the kind a daemon runs: the first call's messages are
    the kind's for the task's rendered prompt, and a tool's result comes back as the
    kind's Observation."""
    rollout = calculator_rollout(
        "Thought: multiply.\nAction: calculator(expression='6 * 7')",
        "Thought: done.\nFinal Answer: 42",
    )
    own = run(rollout, "What is 6 times 7?", "q")
    calls = [e for e in rollout.run_log.events(own.metadata["task_id"]) if isinstance(e, LLMCalled)]
    spec = AgentSpec(
        name="solver",
        possible_next=("finish",),
        output_fields=(OutputField("answer", "str", True),),
        kind="react",
        config={"max_steps": 10},
    )
    prompt = calls[0].messages[-1:]  # the rendered task (the system prompt is the kind's + it)
    expected = agent_kind("react")(spec).next_step(
        Turn(prompt=prompt, llm_calls=[], tool_calls=[], tools=[CALC])
    )
    assert isinstance(expected, CallLLM)
    assert "Thought:" in calls[0].messages[0].content
    assert "calculator(" in calls[0].messages[0].content
    assert calls[0].messages[-1] == expected.messages[-1]
    assert "What is 6 times 7?" in calls[0].messages[-1].content
    assert calls[1].messages[-1].content == "Observation (calculator): 42"


def test_kind_agents_keep_their_kinds_behaviour_and_settings() -> None:
    # A reply without the format is told so, and the agent gives up at max_steps.
    rollout = calculator_rollout("Done", max_steps=3)
    own = run(rollout, "2+2?", "fmt")
    assert own.is_completed and own.get_final_response() == ""
    assert "no final answer after 3 LLM calls" in own.metadata["error"]
    folded = rollout.trajectory(own.metadata["task_id"])
    assert folded.metadata["status"] == "failed"
    # The tool kind runs several calls of one reply, and takes the library's setting names.
    tool = ToolAgent(max_steps=3, max_tool_calls_per_step=2)
    tool.set_tools({"calculator": CalculatorTool()})
    reply = "TOOL_CALL: calculator(expression='1+1')\n" * 3
    result = asyncio.run(
        tool.run_trajectory({"content": "x"}, turns(reply, "Final Answer: 2"), "t")
    )
    assert [s.content for s in result.steps if s.step_type == StepType.ACTION_RESULT] == ["2", "2"]
    with pytest.raises(TypeError, match="max_files_to_explore"):
        ReactAgent(max_files_to_explore=3)


def test_a_model_function_that_answers_wrongly_is_refused_clearly() -> None:
    rollout = calculator_rollout({"txt": "no"})
    with pytest.raises(TypeError, match="dict with it under 'text'"):
        run(rollout, "x", "bad")
    rollout = calculator_rollout({"text": "hi", "tokens": [1]})
    with pytest.raises(TypeError, match="unknown key 'tokens'; known: text, token_ids"):
        run(rollout, "x", "bad")
    # The failed run is recorded as the agent's failure, and its task ends.
    state = fold("bad", rollout.run_log.events("bad"))
    assert state.finished is not None and state.finished.status == "failed"


def test_a_batch_goes_on_past_a_run_that_raises(caplog: pytest.LogCaptureFixture) -> None:
    async def model(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        if "boom" in messages[-1]["content"]:
            raise ConnectionError("model unreachable")
        return "Thought: easy.\nFinal Answer: 4"

    rollout = AgenticRollout(AgenticRolloutConfig(concurrent_requests=2), llm_generate_func=model)
    prompts = [{"content": "boom", "request_id": "a"}, {"content": "2+2?", "request_id": "b"}]
    failed, fine = asyncio.run(rollout._generate_trajectories_batch(prompts))
    assert failed.metadata == {"error": "ConnectionError: model unreachable"}
    assert "trajectory a failed: ConnectionError: model unreachable" in caplog.text
    assert fine.get_final_response() == "4"
    [ended] = [e for e in rollout.run_log.events("a") if e.kind == "agent_failed"]
    assert ended.error == "ConnectionError: model unreachable"  # type: ignore[attr-defined]


def test_a_provider_spec_works_where_a_function_does(tmp_path: Path) -> None:
    script = tmp_path / "answers.yaml"
    script.write_text(
        "solver:\n  - \"Thought: add.\\nAction: calculator(expression='2+2')\"\n"
        '  - "Thought: done.\\nFinal Answer: 4"\n'
    )
    rollout = AgenticRollout(AgenticRolloutConfig(llm=f"scripted:{script}"))
    rollout.agent.set_tools({"calculator": CalculatorTool()})
    own = run(rollout, "2+2?", "p")
    assert own.get_final_response() == "4"
    calls = [e for e in rollout.run_log.events("p") if isinstance(e, LLMCalled)]
    assert [c.provider for c in calls] == ["scripted", "scripted"]
    # Called directly, outside any run, it answers with the text.
    direct = asyncio.run(rollout.llm_generate_func([{"role": "user", "content": "2+2?"}]))
    assert direct == "Thought: add.\nAction: calculator(expression='2+2')"


def test_a_saved_standalone_log_exports_as_training_data(tmp_path: Path) -> None:
    rollout = calculator_rollout(
        "Thought: multiply.\nAction: calculator(expression='6 * 7')",
        "Thought: done.\nFinal Answer: 42",
    )
    for k, answer in enumerate(("42", "41")):
        run(rollout, "What is 6 times 7?", f"s{k}", ground_truth=answer, uid="group")
    log = rollout.save_log(tmp_path / "run.jsonl")
    assert rollout.run_log.events("s0") == []  # saved and freed
    meta = export_grpo(FileSource(log, EventFilter()), tmp_path / "grpo.parquet", GrpoOptions())
    rows = pq.read_table(tmp_path / "grpo.parquet").to_pylist()
    assert meta["rows"] == 4 and {r["agent"] for r in rows} == {"solver"}
    by_run = {r["rollout_id"]: (r["reward"], r["advantage"]) for r in rows}
    assert by_run["s0"][0] == 1.0 and by_run["s1"][0] == 0.0
    assert by_run["s0"][1] > 0 > by_run["s1"][1]


# --------------------------------------------------------------------------- registry, tools


def test_registered_agents_are_agent_kinds_too() -> None:
    assert {"react", "tool", "coding", "research"} <= set(list_agents())
    assert get_agent_class("research") is ResearchAgent and get_agent_class("nope") is None
    assert agent_kind("react") is ReactAgent.as_agent_kind("react")  # the kind itself
    assert agent_kind("research").agent_type is ResearchAgent  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="'research' is already registered"):
        register_agent("research")(type("Other", (ResearchAgent,), {}))
    with pytest.raises(ValueError, match="agent kind 'llm' is already registered"):
        register_agent("llm")(type("Other", (ResearchAgent,), {}))
    with pytest.raises(ValueError, match="agent_type 'nope': unknown agent; known: coding"):
        AgenticRollout(AgenticRolloutConfig(agent_type="nope"), turns("x"))


def test_tools_come_from_a_verl_style_tools_config() -> None:
    tools = tools_from_config(
        {
            "tools": [
                {
                    "class_name": "kernelflow.agentic_rollout.CalculatorTool",
                    "config": {"precision": 2},
                    "tool_schema": {
                        "type": "function",
                        "function": {
                            "name": "calculate",
                            "description": "Perform mathematical calculations",
                            "parameters": {
                                "type": "object",
                                "properties": {"expression": {"type": "string"}},
                                "required": ["expression"],
                            },
                        },
                    },
                }
            ]
        }
    )
    calculate = tools["calculate"]
    assert calculate.description == "Perform mathematical calculations"
    assert asyncio.run(calculate.execute(expression="2/3")) == 0.67
    assert asyncio.run(calculate.execute(operation="factorial", n=5)) == 120
    with pytest.raises(ToolConfigError, match=r"tools\[0\].class_name: cannot import 'nope.Tool'"):
        tools_from_config({"tools": [{"class_name": "nope.Tool"}]})
    with pytest.raises(ToolConfigError, match=r"tools\[0\].config: .*unexpected keyword"):
        tools_from_config(
            {
                "tools": [
                    {
                        "class_name": "kernelflow.agentic_rollout.CalculatorTool",
                        "config": {"digits": 1},
                    }
                ]
            }
        )


def test_bad_tool_calls_are_error_steps_for_the_model() -> None:
    agent = ReactAgent()
    agent.set_tools({"calculator": CalculatorTool()})

    def call(name: str, args: dict[str, Any]) -> TrajectoryStep:
        return asyncio.run(agent.execute_tool_call(name, args, Trajectory(request_id="t")))

    assert call("calculator", {"expression": "1/0"}).content.startswith(
        "Error executing calculator: division by zero"
    )
    assert "Tool 'search' not available" in call("search", {}).content
    bad = call("calculator", {"expresion": "1"})
    assert bad.metadata["execution_successful"] is False
    assert "invalid arguments for calculator" in bad.content and "expresion" in bad.content


def test_config_reads_verl_yaml_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    section = {
        "name": "agentic",
        "agent_type": "react",
        "max_steps": 6,
        "tools_config": {"tools": []},
        "trajectory_save_path": "./trajectories",
    }
    config = AgenticRolloutConfig.from_dict({"actor_rollout_ref": {"rollout": section}})
    assert (config.max_steps, config.trajectory_save_path) == (6, "./trajectories")
    # A key of verl's section that is not a setting here is ignored (with a warning:
    # tests/unit/test_seed003_port_b.py); one under engine_kwargs.agentic is refused.
    assert AgenticRolloutConfig.from_dict({"max_stepz": 3}).max_steps == 10
    with pytest.raises(ValueError, match=r"rollout\.engine_kwargs\.agentic\.max_stepz: unknown"):
        AgenticRolloutConfig.from_dict({"engine_kwargs": {"agentic": {"max_stepz": 3}}})
    with pytest.raises(ValueError, match="interactions_config: not supported"):
        AgenticRolloutConfig(interactions_config={"x": 1})
    monkeypatch.setenv("AGENTIC_MAX_CONCURRENT_REQUESTS", "8")
    monkeypatch.setenv("AGENTIC_SAVE_TRAJECTORIES", "true")
    monkeypatch.setenv("AGENTIC_DEFAULT_TIMEOUT", "5")
    from_env = AgenticRolloutConfig()
    assert (from_env.concurrent_requests, from_env.save_trajectories) == (8, True)
    assert AgenticRolloutConfig(concurrent_requests=2).concurrent_requests == 2  # given wins
    assert ReactAgent().tool_timeout == 5.0
    monkeypatch.setenv("AGENTIC_LOG_LEVEL", "debug")
    library = logging.getLogger("kernelflow.agentic_rollout")
    try:
        AgenticRollout(AgenticRolloutConfig(), llm_generate_func=turns("x"))
        assert library.level == logging.DEBUG
    finally:
        library.setLevel(logging.NOTSET)
    monkeypatch.setenv("AGENTIC_LOG_LEVEL", "chatty")
    with pytest.raises(ValueError, match="AGENTIC_LOG_LEVEL: 'chatty' is not a log level"):
        AgenticRollout(AgenticRolloutConfig(), llm_generate_func=turns("x"))
    monkeypatch.setenv("AGENTIC_MAX_CONCURRENT_REQUESTS", "many")
    with pytest.raises(ValueError, match="AGENTIC_MAX_CONCURRENT_REQUESTS='many': expected"):
        AgenticRolloutConfig()


def test_the_analyzer_measures_efficiency_and_finds_patterns() -> None:
    rollout = calculator_rollout(
        "Thought: a.\nAction: calculator(expression='1/0')",
        "Thought: b.\nAction: calculator(expression='6*7')",
        "Thought: c.\nFinal Answer: 42",
    )
    runs = [run(rollout, "q", f"r{i}") for i in range(2)]
    efficiency = TrajectoryAnalyzer.analyze_efficiency(runs[0])
    assert efficiency["tool_ratio"] == pytest.approx(2 / 9)
    assert efficiency["steps_per_tool"] == pytest.approx(4.5)
    patterns = TrajectoryAnalyzer.identify_patterns(runs)
    assert patterns["success_rate"] == 1.0 and patterns["average_steps"] == 9
    assert patterns["common_tool_sequences"] == [{"tools": ["calculator"] * 2, "count": 2}]
    [failure] = patterns["failure_points"]
    assert (failure["tool_name"], failure["count"]) == ("calculator", 2)
    assert TrajectoryAnalyzer.identify_patterns([])["average_steps"] == 0.0


# --------------------------------------------------------------------------- durable kinds


def research_spec(**config: Any) -> AgentSpec:
    return AgentSpec(
        name="solver",
        possible_next=("finish",),
        output_fields=(OutputField("answer", "str", True),),
        kind="research",
        tools=("calculator",),
        config=config,
    )


def research_turn(llm: list[LLMCalled], tools: list[ToolCalled] | None = None) -> Turn:
    task = TaskSubmitted(
        task_id="t", task_name="t", task_source="", workflow_name="w", workflow_yaml="",
        backend="triton", group_id="g", prompt="What is 6 times 7?",
    )  # fmt: skip
    dispatch = AgentDispatched(task_id="t", seq=3, agent="solver", step=1, dispatch_id="t:d1")
    return Turn(
        prompt=[], llm_calls=llm, tool_calls=tools or [], tools=[CALC], task=task, dispatch=dispatch
    )


def answered(seq: int, step: CallLLM, text: str) -> LLMCalled:
    return LLMCalled(
        task_id="t", seq=seq, agent="solver", dispatch_id="t:d1", provider="scripted",
        model="m", messages=step.messages, response_text=text,
    )  # fmt: skip


def test_a_durable_kind_replays_its_program_one_call_at_a_time() -> None:
    kind = agent_kind("research")(research_spec(research_depth=2))
    first = kind.next_step(research_turn([]))
    assert isinstance(first, CallLLM)
    assert first.messages[1] == ChatMessage(role="user", content="What is 6 times 7?")
    assert first.params == {"max_tokens": 512, "temperature": 0.7}
    c1 = answered(4, first, "Action: calculator(expression='6 * 7')")
    tools = kind.next_step(research_turn([c1]))
    assert tools == RunTools(calls=(tools.calls[0],)) and tools.calls[0].id == "t:d1#1"  # type: ignore[union-attr]
    result = ToolCalled(
        task_id="t", seq=5, agent="solver", dispatch_id="t:d1", call_id="t:d1#1",
        tool="calculator", args={"expression": "6 * 7"}, ok=True, output="42",
    )  # fmt: skip
    second = kind.next_step(research_turn([c1], [result]))
    assert isinstance(second, CallLLM) and "Observation: 42" in second.messages[-2].content
    c2 = answered(6, second, "In conclusion:\nFinal Answer: 42")
    # The answer is the text after its marker.
    assert kind.next_step(research_turn([c1, c2], [result])) == Finish("42", whole_answer=True)


def test_a_run_that_asks_for_other_calls_than_recorded_is_stopped_naming_the_call() -> None:
    kind = agent_kind("research")(research_spec())
    first = kind.next_step(research_turn([]))
    assert isinstance(first, CallLLM)
    changed = CallLLM([ChatMessage(role="system", content="an older prompt"), *first.messages[1:]])
    asked = r"call 1 of the run asked the LLM with other messages than LLM call t:4"
    with pytest.raises(DivergenceError, match=asked + r".*message 0 differs"):
        kind.next_step(research_turn([answered(4, changed, "Thought: x")]))
    c1 = answered(4, first, "Action: calculator(expression='6 * 7')")
    other_tool = ToolCalled(
        task_id="t", seq=5, agent="solver", dispatch_id="t:d1", call_id="t:d1#1",
        tool="calculator", args={"expression": "7 * 6"}, ok=True, output="42",
    )  # fmt: skip
    called = r"call 2 of the run called calculator\(expression='6 \* 7'\), but the log records "
    with pytest.raises(DivergenceError, match=called + r"calculator\(expression='7 \* 6'\)"):
        kind.next_step(research_turn([c1], [other_tool]))


class Stubborn(BaseAgent):
    """Catches everything, our stop included, and answers anyway."""

    async def run_trajectory(
        self, prompt: Any, llm_generate_func: Any, request_id: str, **kw: Any
    ) -> Trajectory:
        trajectory = Trajectory(request_id=request_id)
        try:
            await self.tools["calculator"].execute(expression="1+1")  # before any LLM call
            await llm_generate_func([{"role": "user", "content": "hi"}])
        except BaseException:  # what a careless agent does
            pass
        trajectory.add_step(TrajectoryStep(StepType.FINAL_ANSWER, "made up"))
        return trajectory


def test_a_program_cannot_swallow_its_stop_and_may_call_tools_first() -> None:
    kind = BaseAgent.as_agent_kind.__func__(Stubborn, "stubborn")(research_spec())  # type: ignore[attr-defined]
    step = kind.next_step(research_turn([]))
    assert isinstance(step, RunTools) and step.calls[0].id == "t:d1#0"
    assert isinstance(kind.next_step(research_turn([])), RunTools)  # the same on replay


def test_an_agent_without_an_answer_gives_up_and_bad_settings_are_refused() -> None:
    kind = agent_kind("research")(research_spec(research_depth=0))
    assert kind.next_step(research_turn([])) == GiveUp(
        "solver: the run ended without a final answer"
    )
    with pytest.raises(
        Exception, match="tool_format: agent 'research' calls tools from its own code"
    ):
        agent_kind("research")(research_spec(tool_format="native"))


class Counting:
    """A provider that counts the calls it answers."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.calls = inner, "counting", 0

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls += 1
        return await self.inner.complete(request)


class Crash(Exception):
    """Stands for a daemon killed right after it recorded an event."""


def research_script_in(folder: Path) -> Path:
    """A scripted provider's answers for the research agent: ``RESEARCH_SCRIPT``."""
    path = folder / "research.yaml"
    path.write_text(json.dumps({"solver": RESEARCH_SCRIPT}))
    return path


@pytest.fixture
def research_script(tmp_path: Path) -> Path:
    return research_script_in(tmp_path)


def test_the_agent_actor_resumes_a_research_dispatch_after_a_crash_without_repeating_a_call(
    research_script: Path,
) -> None:
    """The agent actor runs the research agent as a kind: each LLM and tool call is an
    event. Its process 'dies' right after the second LLM call is recorded; the dispatch,
    delivered again to another process, replays the record and goes on from there."""
    server, task_id = MemoryServer(), "research-1"
    workflow = RolloutConfig(agent_type="research", tools=("calculator",)).workflow_yaml()
    submitted = TaskSubmitted(
        task_id=task_id, task_name="r", task_source="", workflow_name="research",
        workflow_yaml=workflow, backend="triton", group_id="g",
        prompt="What is 6 times 7?", reference_answer="42",
    )  # fmt: skip
    provider = Counting(make_provider(f"scripted:{research_script}"))

    def crash_after_second_call(event: Event, history: TaskHistory) -> None:
        if isinstance(event, LLMCalled) and event.seq == 5:
            raise Crash

    first = server.bridge(after_append=crash_after_second_call).start()
    try:
        history = first.call(first.log.append(TaskHistory(task_id), [submitted]))
        Conductor(first, llm=None).advance(history)
        dispatch_job = trigger_message(first.call(first.log.read_task(task_id)))
        with pytest.raises(Crash):
            LLMAgent(first, "solver", provider).handle(dispatch_job)
    finally:
        first.stop()
    assert provider.calls == 2

    with running_bridge(server) as second:
        assert LLMAgent(second, "solver", provider).handle(dispatch_job) == "ack"
        Conductor(second, llm=None).advance(second.call(second.log.read_task(task_id)))
        events = list(second.call(second.log.read_task(task_id)).events)
    assert provider.calls == len(RESEARCH_SCRIPT)  # none made twice
    assert_each_step_once(events)
    calls = [e for e in events if isinstance(e, LLMCalled)]
    assert [c.response_text for c in calls] == RESEARCH_SCRIPT
    assert [e.output for e in events if isinstance(e, ToolCalled)] == ["42", "42"]
    parsed = next(e for e in events if isinstance(e, OutputParsed))
    assert parsed.fields == {"answer": "the conclusion is 42"}
    state = fold(task_id, events)
    assert state.finished is not None and state.finished.status == "success"
    assert [e.value for e in events if isinstance(e, RewardAssigned)] == [0.0, 1.0]


@register_agent("timed")
class Timed(BaseAgent):
    """Puts how many agents of its class were made into its first question: every replay
    of it asks something new (as an agent that reads a clock would)."""

    made = 0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        Timed.made += 1
        self.attempt = Timed.made

    async def run_trajectory(
        self, prompt: Any, llm_generate_func: Any, request_id: str, **kw: Any
    ) -> Trajectory:
        trajectory = Trajectory(request_id=request_id)
        question = f"attempt {self.attempt}: {prompt['content']}"
        await llm_generate_func([{"role": "user", "content": question}])
        reply = await llm_generate_func([{"role": "user", "content": "go on"}])
        trajectory.add_step(TrajectoryStep(StepType.FINAL_ANSWER, reply))
        return trajectory


def test_a_dispatch_whose_replay_diverges_fails_naming_the_call(research_script: Path) -> None:
    """In the agent actor: the first LLM call is made and recorded; the replay that would
    make the next one asks the first differently, so the dispatch fails with the
    divergence, and the call it diverged on is not made again."""
    server, task_id = MemoryServer(), "timed-1"
    submitted = TaskSubmitted(
        task_id=task_id, task_name="c", task_source="", workflow_name="timed",
        workflow_yaml=RolloutConfig(agent_type="timed").workflow_yaml(), backend="triton",
        group_id="g", prompt="What is 6 times 7?",
    )  # fmt: skip
    provider = Counting(make_provider(f"scripted:{research_script}"))
    with running_bridge(server) as bridge:
        history = bridge.call(bridge.log.append(TaskHistory(task_id), [submitted]))
        Conductor(bridge, llm=None).advance(history)
        job = trigger_message(bridge.call(bridge.log.read_task(task_id)))
        LLMAgent(bridge, "solver", provider).handle(job)
        events = list(bridge.call(bridge.log.read_task(task_id)).events)
    assert provider.calls == 1
    [call] = [e for e in events if isinstance(e, LLMCalled)]
    assert call.messages[0].content.endswith(": What is 6 times 7?")
    [failed] = [e for e in events if e.kind == "agent_failed"]
    assert "DivergenceError: call 1 of the run asked the LLM with other messages than " in (
        failed.error  # type: ignore[attr-defined]
    )
    assert f"LLM call {call.event_id}" in failed.error  # type: ignore[attr-defined]
    assert "message 0 differs: user 'attempt" in failed.error  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _no_agentic_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (
        "AGENTIC_MAX_CONCURRENT_REQUESTS",
        "AGENTIC_SAVE_TRAJECTORIES",
        "AGENTIC_DEFAULT_TIMEOUT",
        "AGENTIC_LOG_LEVEL",
    ):
        monkeypatch.delenv(name, raising=False)
    yield
