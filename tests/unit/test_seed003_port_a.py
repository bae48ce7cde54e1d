"""Seed 003's promises on trajectories, tools and ReactAgent, ported with only the import
path changed (issue 52, part A; docs/agents.md, "AgenticRollout"): ``get_messages`` gives
the whole chat (§5.2) and verl's ``MultiTurnSFTDataset`` trains on it; steps and
trajectories are the dataclasses of §5.1 with §5.3's metadata; tools run within
``ToolLimits`` (§4.4), retried (§4.2, §7.1), cached, the calls of one step together
(§3.2); ``ReactAgentConfig`` (§3.1); ``agent.tools`` and ``BaseTool`` (§4.1)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.actors.kinds import Finish, RunTools, Turn
from kernelflow.agentic_rollout import (
    BaseAgent,
    BaseTool,
    CalculatorTool,
    ReactAgent,
    ReactAgentConfig,
    RetryPolicy,
    StepType,
    ToolAgent,
    ToolExecutionError,
    ToolLimits,
    ToolResultCache,
    Trajectory,
    TrajectoryStep,
)
from kernelflow.agentic_rollout.recording import RunLog
from kernelflow.events.model import (
    AgentDispatched,
    Event,
    LLMCalled,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.workflows.model import AgentSpec, OutputField
from tests.verl_tokenizer import tiny_tokenizer


def turns(*replies: str) -> Any:
    """A model that gives its n-th reply on the n-th turn, and the messages it saw."""
    seen: list[list[dict[str, Any]]] = []

    async def model(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        seen.append(messages)
        return replies[min(sum(m["role"] == "assistant" for m in messages), len(replies) - 1)]

    model.seen = seen  # type: ignore[attr-defined]
    return model


def run(agent: Any, model: Any, question: str = "Q", request_id: str = "r") -> Trajectory:
    agent.run_log = agent.run_log or RunLog()
    trajectory = asyncio.run(agent.run_trajectory({"content": question}, model, request_id))
    assert isinstance(trajectory, Trajectory)
    return trajectory


def recorded(agent: Any, trajectory: Trajectory) -> list[Event]:
    return list(agent.run_log.events(trajectory.metadata["task_id"]))


def tool_events(agent: Any, trajectory: Trajectory) -> list[ToolCalled]:
    return [e for e in recorded(agent, trajectory) if isinstance(e, ToolCalled)]


# --------------------------------------------------------------------------- §5.2: the chat


def test_the_seed_trajectory_renders_its_whole_conversation() -> None:
    # §5.2, as printed.
    trajectory = Trajectory(request_id="task_001")
    trajectory.add_step(TrajectoryStep(
        step_type=StepType.OBSERVATION,
        content="What is the capital of France?",
        metadata={"source": "user_input"}
    ))  # fmt: skip
    trajectory.add_step(TrajectoryStep(
        step_type=StepType.THOUGHT,
        content="I need to recall the capital city of France.",
        metadata={"reasoning_type": "knowledge_recall"}
    ))  # fmt: skip
    trajectory.add_step(TrajectoryStep(
        step_type=StepType.FINAL_ANSWER,
        content="The capital of France is Paris.",
        metadata={"confidence": 0.95}
    ))  # fmt: skip
    # §5.2's queries, as printed.
    final_response = trajectory.get_final_response()
    tool_calls = trajectory.get_tool_calls()
    total_reward = trajectory.get_total_reward()
    messages = trajectory.get_messages()
    assert (final_response, tool_calls, total_reward) == (
        "The capital of France is Paris.",
        [],
        0.0,
    )
    assert messages == [
        {"role": "user", "content": "What is the capital of France?"},
        {
            "role": "assistant",
            "content": "Thought: I need to recall the capital city of France.\n"
            "Final Answer: The capital of France is Paris.",
        },
    ]
    # Tool calls and their results: the action in the reply, the result the user's.
    trajectory.steps[2:2] = [
        TrajectoryStep(StepType.ACTION, "atlas(country='France')", {}, tool_name="atlas"),
        TrajectoryStep(StepType.ACTION_RESULT, "Paris", {}, tool_name="atlas"),
    ]
    assert [(m["role"], m["content"]) for m in trajectory.get_messages()[1:]] == [
        (
            "assistant",
            "Thought: I need to recall the capital city of France.\n"
            "Action: atlas(country='France')",
        ),
        ("user", "Observation: Paris"),
        ("assistant", "Final Answer: The capital of France is Paris."),
    ]
    # Two replies are two messages, though nothing came between them.
    two = Trajectory(request_id="two")
    two.add_step(TrajectoryStep(StepType.THOUGHT, "a", {"llm_call": 1}))
    two.add_step(TrajectoryStep(StepType.THOUGHT, "b", {"llm_call": 2}))
    two.add_step(TrajectoryStep(StepType.FINAL_ANSWER, "c", {"llm_call": 2}))
    assert [m["content"] for m in two.get_messages()] == [
        "Thought: a",
        "Thought: b\nFinal Answer: c",
    ]


def react_run() -> tuple[ReactAgent, Any, Trajectory]:
    agent = ReactAgent(max_steps=4)
    agent.set_tools({"calculator": CalculatorTool()})
    model = turns(
        "Thought: multiply.\nAction: calculator(expression='6 * 7')",
        "Thought: the calculator says so.\nFinal Answer: 42",
    )
    return agent, model, run(agent, model, "What is 6 times 7?")


def test_a_react_agents_trajectory_is_the_chat_it_had(tmp_path: Path) -> None:
    _, model, trajectory = react_run()
    messages = trajectory.get_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == model.seen[0][0]["content"]  # the prompt it was given
    assert messages[1]["content"] == "What is 6 times 7?"
    assert messages[2]["content"] == "Thought: multiply.\nAction: calculator(expression='6 * 7')"
    assert messages[3]["content"] == "Observation: 42"
    assert messages[4]["content"] == "Thought: the calculator says so.\nFinal Answer: 42"

    # verl's multi-turn SFT dataset reads it, and trains on the replies only.
    path = tmp_path / "sft.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": messages}]), path)
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    item = MultiTurnSFTDataset(str(path), tokenizer, {"max_length": 2048})[0]
    ids, mask = item["input_ids"], item["loss_mask"].bool()
    trained = tokenizer.decode(ids[mask])
    assert "Final Answer: 42" in trained and "multiply." in trained
    assert "Observation: 42" not in trained and "What is 6 times 7?" not in trained


# --------------------------------------------------------------------------- §5.1, §5.3


SEED_JSON = {
    "request_id": "task_001",
    "steps": [
        {"step_type": "observation", "content": "What is 2+2?",
         "metadata": {"timestamp": "2025-01-21T10:00:00"}, "tool_name": None,
         "tool_args": None, "tool_result": None, "reward_score": None, "is_correct": None},
        {"step_type": "action", "content": "calculator(expression='2+2')",
         "metadata": {"timestamp": "2025-01-21T10:00:01"}, "tool_name": "calculator",
         "tool_args": {"expression": "2+2"}, "tool_result": 4, "reward_score": None,
         "is_correct": None},
        {"step_type": "final_answer", "content": "The answer is 4.",
         "metadata": {"timestamp": "2025-01-21T10:00:02"}, "tool_name": None,
         "tool_args": None, "tool_result": None, "reward_score": 1.0, "is_correct": True},
    ],
    "metadata": {"agent_type": "react", "total_time": 2.1, "llm_calls": 2},
    "is_completed": True,
    "final_reward": 1.0,
    "total_tokens": 45,
}  # fmt: skip


def test_steps_and_trajectories_are_the_seeds_dataclasses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # §5.3, as printed (in a folder of the test's own).
    monkeypatch.chdir(tmp_path)
    trajectory = Trajectory.from_dict(SEED_JSON)
    trajectory_dict = trajectory.to_dict()
    recovered_trajectory = Trajectory.from_dict(trajectory_dict)
    with open("trajectory.json", "w") as f:
        json.dump(trajectory_dict, f, indent=2)
    assert recovered_trajectory == trajectory
    assert Trajectory.from_dict(json.loads(Path("trajectory.json").read_text())) == trajectory

    assert dataclasses.is_dataclass(trajectory) and dataclasses.is_dataclass(trajectory.steps[0])
    step = trajectory.steps[1]
    assert step.step_type is StepType.ACTION and step.tool_result == 4
    assert dataclasses.asdict(step)["tool_args"] == {"expression": "2+2"}
    assert dataclasses.asdict(trajectory)["steps"][2]["is_correct"] is True
    # Attributes of one's own, as on any dataclass; the plain data is the declared fields.
    step.note = "checked"  # type: ignore[attr-defined]
    trajectory.source = "seed"  # type: ignore[attr-defined]
    assert "note" not in step.to_dict() and "source" not in trajectory.to_dict()
    expected = {**SEED_JSON, "steps": [
        {**s, "log_probs": None, "attention_mask": None} for s in SEED_JSON["steps"]  # type: ignore[attr-defined]
    ]}  # fmt: skip
    assert trajectory.to_dict() == expected
    assert dataclasses.replace(step, content="x").tool_name == "calculator"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
STEPS = st.builds(
    TrajectoryStep,
    step_type=st.sampled_from(list(StepType)),
    content=st.text(max_size=20),
    metadata=st.dictionaries(st.text(max_size=5), JSON, max_size=3),
    tool_name=st.none() | st.text(max_size=8),
    tool_args=st.none() | st.dictionaries(st.text(max_size=5), JSON, max_size=3),
    tool_result=JSON,
    reward_score=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    is_correct=st.none() | st.booleans(),
    log_probs=st.none() | st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=4),
    attention_mask=st.none() | st.lists(st.integers(0, 1), max_size=4),
)
TRAJECTORIES = st.builds(
    Trajectory,
    request_id=st.text(max_size=10),
    steps=st.lists(STEPS, max_size=5),
    metadata=st.dictionaries(st.text(max_size=5), JSON, max_size=3),
    is_completed=st.booleans(),
    final_reward=st.none() | st.floats(allow_nan=False, allow_infinity=False),
    total_tokens=st.integers(0, 10**9),
)


@settings(max_examples=200, deadline=None)
@given(TRAJECTORIES)
def test_a_trajectory_round_trips_through_its_plain_data_and_json(t: Trajectory) -> None:
    assert Trajectory.from_dict(t.to_dict()) == t
    assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert msgspec.json.decode(msgspec.json.encode(t), type=Trajectory) == t
    # dataclasses.asdict gives the same plain data as to_dict.
    assert [TrajectoryStep.from_dict(s) for s in dataclasses.asdict(t)["steps"]] == t.steps


def test_a_run_says_its_agent_type_as_the_seed_names_it_and_its_time() -> None:
    _, _, trajectory = react_run()
    assert trajectory.metadata["agent_type"] == "react"
    assert 0 < trajectory.metadata["total_time"] < 60
    assert trajectory.metadata["llm_calls"] == 2


# --------------------------------------------------------------------------- §4.4 limits


class Echo(BaseTool):
    """Returns what it is given, and counts its calls."""

    def __init__(self, size: int = 0, delay: float = 0.0) -> None:
        super().__init__()
        self.size, self.delay, self.calls = size, delay, 0

    async def execute(self, **kwargs: Any) -> Any:
        self.calls += 1
        await asyncio.sleep(self.delay)
        return "x" * self.size if self.size else f"echo {kwargs.get('text', '')}"


def test_a_long_output_reaches_the_model_cut_with_a_marker() -> None:
    agent = ReactAgent(max_steps=3)
    agent.set_tools({"echo": Echo(size=50_000)})
    model = turns("Thought: look.\nAction: echo()", "Final Answer: done")
    trajectory = run(agent, model)
    result = trajectory.steps[3]
    assert result.metadata["output_cut"] is True and len(result.tool_result) == 50_000
    limit = ToolLimits().max_output_size
    assert len(result.content.encode()) < limit + 100
    assert result.content.endswith(f"[... output cut: {50_000 - limit} more bytes]")
    shown = model.seen[1][-1]["content"]  # what the model read next
    assert "output cut" in shown and "x" * (limit + 1) not in shown


def test_a_tool_beyond_its_rate_limit_is_refused_and_a_slow_one_stopped() -> None:
    agent = ReactAgent(max_steps=5, tool_limits=ToolLimits(rate_limit=2))
    echo = Echo()
    agent.set_tools({"echo": echo})
    model = turns(*["Thought: again.\nAction: echo(text='hi')"] * 3, "Final Answer: done")
    trajectory = run(agent, model)
    results = [s for s in trajectory.steps if s.step_type == StepType.ACTION_RESULT]
    assert [r.metadata["execution_successful"] for r in results] == [True, True, False]
    assert "rate limit: echo allows 2 calls per minute" in results[2].content
    assert echo.calls == 2 and "rate limit" in model.seen[3][-1]["content"]
    assert [e.ok for e in tool_events(agent, trajectory)] == [True, True, False]

    # A tool's own limits win over the agent's; a slow call is stopped, and not retried here.
    slow = Echo(delay=5.0)
    slow.limits = ToolLimits(max_execution_time=0.05)  # type: ignore[attr-defined]
    agent = ReactAgent(max_steps=3, tool_retry=RetryPolicy(max_attempts=1))
    agent.set_tools({"slow": slow})
    started = time.monotonic()
    trajectory = run(agent, turns("Thought: wait.\nAction: slow()", "Final Answer: gave up"))
    assert time.monotonic() - started < 3
    assert "slow timed out after 0.05s" in trajectory.steps[3].content


# --------------------------------------------------------------------------- retries, cache


class Flaky(BaseTool):
    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures, self.calls = failures, 0

    async def execute(self, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("connection reset")
        return "fine"


def test_a_transient_tool_failure_is_retried_each_attempt_recorded() -> None:
    agent = ReactAgent(max_steps=3, tool_retry=RetryPolicy(backoff_s=0.01))
    flaky = Flaky(failures=1)
    agent.set_tools({"flaky": flaky})
    trajectory = run(agent, turns("Thought: try.\nAction: flaky()", "Final Answer: fine"))
    assert trajectory.steps[3].content == "fine" and flaky.calls == 2
    events = tool_events(agent, trajectory)
    assert [(e.ok, e.error) for e in events] == [
        (False, "ConnectionError: connection reset"),
        (True, ""),
    ]
    # A tool's own refusal is the model's to read, not retried; nor past max_attempts.
    never = Flaky(failures=10)
    agent = ReactAgent(max_steps=3, tool_retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
    agent.set_tools({"flaky": never, "base": BaseTool()})
    trajectory = run(agent, turns("Thought: try.\nAction: flaky()", "Final Answer: no"))
    assert never.calls == 2 and "connection reset" in trajectory.steps[3].content


def test_a_transient_llm_failure_is_retried_within_its_recorded_call() -> None:
    answers: list[Any] = [ConnectionError("reset"), "Thought: ok.\nFinal Answer: 4"]

    async def model(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    agent = ReactAgent(llm_retry=RetryPolicy(backoff_s=0.01))
    trajectory = run(agent, model)
    assert trajectory.get_final_response() == "4"
    (call,) = [e for e in recorded(agent, trajectory) if isinstance(e, LLMCalled)]
    assert call.retries == 1  # one call, recorded once, with the failure before it
    answers[:] = [ConnectionError("reset"), "Final Answer: 4"]
    with pytest.raises(ConnectionError):
        run(ReactAgent(llm_retry=RetryPolicy(max_attempts=1)), model)


def test_the_result_cache_answers_a_call_asked_again() -> None:
    echo = Echo()
    agent = ReactAgent(max_steps=4, tool_cache=True)
    agent.set_tools({"echo": echo})
    model = turns(*["Thought: again.\nAction: echo(text='hi')"] * 2, "Final Answer: done")
    trajectory = run(agent, model)
    results = [s.content for s in trajectory.steps if s.step_type == StepType.ACTION_RESULT]
    assert results == ["echo hi", "echo hi"] and echo.calls == 1
    assert isinstance(agent.tool_cache, ToolResultCache) and agent.tool_cache.hits == 1
    assert [e.output for e in tool_events(agent, trajectory)] == ["echo hi", "echo hi"]
    assert ReactAgent().tool_cache is None  # optional: off unless asked


# --------------------------------------------------------------------------- §3.2 together


class Meeting(BaseTool):
    """Waits until the other tool of the step has started too, then works ``delay``."""

    def __init__(self, name: str, delay: float, started: dict[str, asyncio.Event]) -> None:
        super().__init__()
        self.name, self.delay, self.started = name, delay, started

    async def execute(self, **kwargs: Any) -> Any:
        self.started[self.name].set()
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in self.started.values())), 5)
        await asyncio.sleep(self.delay)
        return self.name.upper()


def test_the_calls_of_one_step_run_together_results_in_call_order() -> None:
    started: dict[str, asyncio.Event] = {}
    agent = ToolAgent(max_steps=3)
    a, b = Meeting("a", 0.4, started), Meeting("b", 0.3, started)
    agent.set_tools({"a": a, "b": b})

    async def go() -> tuple[Trajectory, float]:
        started.update(a=asyncio.Event(), b=asyncio.Event())  # on the run's loop
        t0 = time.monotonic()
        model = turns("TOOL_CALL: a()\nTOOL_CALL: b()", "Both ran.")
        trajectory = await agent.run_trajectory({"content": "go"}, model, "both")
        return trajectory, time.monotonic() - t0

    agent.run_log = RunLog()
    trajectory, elapsed = asyncio.run(go())
    # One after the other, a would wait 5 s for b to start, and fail.
    results = [s for s in trajectory.steps if s.step_type == StepType.ACTION_RESULT]
    assert [r.content for r in results] == ["A", "B"]
    assert elapsed < 0.7  # about 0.4 s (0.41 here), where one after the other takes 0.7 s
    steps = [(s.step_type, s.tool_name) for s in trajectory.steps[1:5]]
    assert steps == [(StepType.ACTION, "a"), (StepType.ACTION_RESULT, "a"),
                     (StepType.ACTION, "b"), (StepType.ACTION_RESULT, "b")]  # fmt: skip
    # Recorded in the order they were made (b finished first).
    assert [e.tool for e in tool_events(agent, trajectory)] == ["a", "b"]


# --------------------------------------------------------------------------- §3.1, §4.1


def test_react_agent_config_sets_react_agents_settings() -> None:
    acting = "Action: calculator(expression='1+1')"  # no Thought before it

    def results(agent: ReactAgent) -> list[str]:
        agent.set_tools({"calculator": CalculatorTool()})
        t = run(agent, turns(acting, "Thought: done.\nFinal Answer: 2"))
        return [s.content for s in t.steps if s.step_type == StepType.ACTION_RESULT]

    assert results(ReactAgent(max_steps=3)) == []  # the default: think first
    config = ReactAgentConfig(require_thought_before_action=False)
    assert results(ReactAgent(max_steps=3, config=config)) == ["2"]
    assert dataclasses.asdict(ReactAgentConfig()) == {
        "require_thought_before_action": True,
        "max_consecutive_thoughts": 3,
        "enable_self_reflection": True,
    }
    with pytest.raises(TypeError, match="enable_self_reflection: given in config and as a keyword"):
        ReactAgent(config=ReactAgentConfig(), enable_self_reflection=False)


def test_agent_tools_are_the_given_tools_as_the_agent_calls_them() -> None:
    calculator = CalculatorTool()
    agent = ReactAgent()
    agent.set_tools({"calculator": calculator})
    tool = agent.tools["calculator"]
    assert tool.tool is calculator and tool.description == calculator.description

    class SeedStyle(ReactAgent):
        """§4.2's execute_tool_call, as printed: the tool called through self.tools."""

        async def execute_tool_call(
            self, tool_name: str, tool_args: dict[str, Any], trajectory: Trajectory
        ) -> TrajectoryStep:
            tool = self.tools[tool_name]
            result = await asyncio.wait_for(tool.execute(**tool_args), timeout=self.tool_timeout)
            return TrajectoryStep(
                step_type=StepType.ACTION_RESULT,
                content=str(result),
                metadata={"tool_name": tool_name, "execution_successful": True},
                tool_name=tool_name,
                tool_args=tool_args,
                tool_result=result,
            )

    seed_style = SeedStyle(max_steps=3)
    seed_style.set_tools({"calculator": calculator})
    model = turns("Thought: add.\nAction: calculator(expression='2+2')", "Final Answer: 4")
    trajectory = run(seed_style, model)
    assert [(e.tool, e.output) for e in tool_events(seed_style, trajectory)] == [
        ("calculator", "4")
    ]


def test_base_tool_is_made_as_the_seed_writes_it() -> None:
    tool = BaseTool()
    assert tool.description == "Tool description"
    with pytest.raises(ToolExecutionError, match="BaseTool does not implement execute"):
        asyncio.run(tool.execute(x=1))
    agent = ReactAgent()
    agent.set_tools({"base": tool})
    step = asyncio.run(agent.execute_tool_call("base", {}, Trajectory(request_id="t")))
    assert step.content == "Error executing base: BaseTool does not implement execute"


# --------------------------------------------------------------------------- in a daemon


class Pair(BaseAgent):
    """Calls tools ``a`` and ``b`` together, and answers with what they said."""

    async def run_trajectory(
        self, prompt: Any, llm_generate_func: Any, request_id: str, **kw: Any
    ) -> Trajectory:
        trajectory = Trajectory(request_id=request_id)
        results = await self.execute_tool_calls([("a", {}), ("b", {})], trajectory)
        answer = " | ".join(r.content for r in results)
        trajectory.add_step(TrajectoryStep(StepType.FINAL_ANSWER, answer))
        return trajectory


def pair_turn(tools: list[ToolCalled]) -> Turn:
    task = TaskSubmitted(
        task_id="t", task_name="t", task_source="", workflow_name="w", workflow_yaml="",
        backend="triton", group_id="g", prompt="go",
    )  # fmt: skip
    dispatch = AgentDispatched(task_id="t", seq=3, agent="solver", step=1, dispatch_id="t:d1")
    specs = [{"name": n, "description": "", "parameters": {"type": "object"}} for n in "ab"]
    return Turn(
        prompt=[], llm_calls=[], tool_calls=tools, tools=specs, task=task, dispatch=dispatch
    )


def test_in_a_daemon_calls_made_together_are_made_in_order_and_none_made_twice() -> None:
    answer = (OutputField("answer", "str", True),)
    spec = AgentSpec(name="solver", possible_next=("finish",), output_fields=answer, kind="pair")
    kind = BaseAgent.as_agent_kind.__func__(Pair, "pair")(spec)  # type: ignore[attr-defined]

    def called(n: int, tool: str, ok: bool, output: str) -> ToolCalled:
        return ToolCalled(
            task_id="t", seq=4 + n, agent="solver", dispatch_id="t:d1", call_id=f"t:d1#{n}",
            tool=tool, ok=ok, output=output, error="" if ok else output,
        )  # fmt: skip

    first = kind.next_step(pair_turn([]))
    assert isinstance(first, RunTools) and [(c.id, c.name) for c in first.calls] == [
        ("t:d1#0", "a")
    ]
    failed = called(0, "a", False, "ConnectionError: reset")
    second = kind.next_step(pair_turn([failed]))
    assert isinstance(second, RunTools) and [(c.id, c.name) for c in second.calls] == [
        ("t:d1#1", "b")
    ]
    # The failure the log holds is read back, not retried: the run goes on to its answer.
    end = kind.next_step(pair_turn([failed, called(1, "b", True, "B")]))
    assert end == Finish("Error executing a: ConnectionError: reset | B", whole_answer=True)
