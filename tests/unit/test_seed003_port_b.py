"""Seed 003, ported with only the import path changed (issue 52, part B): ``CodingAgent``
with its tools and state (§3.3), the monitoring classes fed from the log (§10), and the
verl integration (§6.1, §6.2). docs/agents.md says what kernelflow chose where the seed
leaves a choice."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from kernelflow.agentic_rollout import (
    AgenticRollout,
    AgenticRolloutConfig,
    CalculatorTool,
    CodebaseState,
    CodingAgent,
    HealthChecker,
    MetricsCollector,
    PerformanceMetrics,
    ReactAgent,
    StepType,
    SWEPhase,
    Trajectory,
    Workspace,
)
from kernelflow.events.model import RewardAssigned

CODE = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n",
}
FIX = (
    "Thought: the plan: make add return a + b.\n"
    "Action: edit_file(path='calc.py', old_str='return a - b', new_str='return a + b')"
)
CODING_REPLIES = [
    "Thought: first the code.\nAction: view_file(path='calc.py')",
    "Thought: which files are there?\nAction: search_files(glob='*.py')",
    "Thought: and its test.\nAction: view_file(path='test_calc.py')",
    FIX,
    "Thought: add is fixed.\nFinal Answer: add returns a + b",
]


def scripted(replies: list[str], seen: list[Any] | None = None, agent: Any = None) -> Any:
    """A model answering by turn; ``seen`` gets the agent's phase at each call."""

    async def llm(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        if seen is not None:
            seen.append(agent.current_phase)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return replies[min(turn, len(replies) - 1)]

    return llm


# ---------------------------------------------------------------------- §3.3 CodingAgent


def test_coding_agent_comes_with_the_tools_3_3_lists() -> None:
    needed = {
        "view_file",
        "edit_file",
        "create_file",
        "search_code",
        "search_files",
        "execute_bash",
        "run_tests",
    }
    assert set(CodingAgent().tools) == needed
    rollout = AgenticRollout(AgenticRolloutConfig(agent_type="coding"), llm_generate_func=None)
    assert set(rollout.tools) == needed and set(rollout.agent.tools) == needed
    # Configured tools are added to them; a ReactAgent still comes with none.
    configured = AgenticRollout(
        AgenticRolloutConfig(
            agent_type="coding",
            tools_config={"tools": [{"class_name": "kernelflow.agentic_rollout.CalculatorTool"}]},
        )
    )
    assert set(configured.tools) == needed | {"calculator"}
    assert ReactAgent().tools == {}
    # The tools say what they take, as the model is shown them.
    assert "old_str" in CodingAgent().tools["edit_file"].parameters_schema["properties"]


def test_codebase_state_is_the_3_3_dataclass() -> None:
    state = CodebaseState(
        viewed_files=set(),
        modified_files=set(),
        test_results={},
        search_cache={},
        current_dir=".",
        errors_encountered=[],
        implementation_plan=[],
    )
    assert dataclasses.asdict(state)["viewed_files"] == set()
    assert [p.value for p in SWEPhase] == [
        "understanding",
        "exploration",
        "planning",
        "implementation",
        "testing",
        "refinement",
        "complete",
    ]


def test_the_phase_follows_what_the_coding_agent_did_in_its_workspace() -> None:
    agent = CodingAgent(workspace=CODE)
    phases: list[SWEPhase] = []
    trajectory = asyncio.run(
        agent.run_trajectory(
            prompt={"content": "Fix add in calc.py"},
            llm_generate_func=scripted(CODING_REPLIES, phases, agent),
            request_id="fix_add",
        )
    )
    # §3.3's transition: UNDERSTANDING becomes EXPLORATION once it viewed or searched files.
    assert phases == [
        SWEPhase.UNDERSTANDING,
        SWEPhase.EXPLORATION,
        SWEPhase.EXPLORATION,
        SWEPhase.PLANNING,
        SWEPhase.IMPLEMENTATION,
    ]
    assert agent.current_phase == SWEPhase.COMPLETE
    assert trajectory.metadata["phase"] == "complete"
    state = agent.codebase_state
    assert state.viewed_files == {"calc.py", "test_calc.py"}
    assert state.modified_files == {"calc.py"}
    assert state.search_cache == {
        "search_files(glob='*.py')": ["calc.py (2 lines)", "test_calc.py (5 lines)"]
    }
    assert state.implementation_plan == ["the plan: make add return a + b."]
    # The edit is the run's: in its result and the trajectory, never in the workspace it
    # started from, nor on any disk.
    results = [s for s in trajectory.steps if s.step_type == StepType.ACTION_RESULT]
    assert "return a + b" in results[-1].content
    assert trajectory.metadata["workspace_changes"] == {
        "calc.py": "def add(a, b):\n    return a + b\n"
    }
    assert agent.workspace.files == CODE


def test_coding_runs_each_work_on_their_own_copy_and_stay_inside_it() -> None:
    agent = CodingAgent(workspace=CODE)

    def run(new: str, request_id: str) -> Any:
        replies = [
            "Thought: edit.\nAction: edit_file(path='calc.py', "
            f"old_str='return a - b', new_str='return {new}')",
            "Thought: escape?\nAction: view_file(path='../etc/passwd')",
            "Final Answer: done",
        ]
        return agent.run_trajectory({"content": "edit"}, scripted(replies), request_id)

    async def both() -> list[Trajectory]:
        return list(await asyncio.gather(run("a * b", "one"), run("b", "two")))

    one, two = asyncio.run(both())
    assert one.metadata["workspace_changes"]["calc.py"].endswith("return a * b\n")
    assert two.metadata["workspace_changes"]["calc.py"].endswith("return b\n")
    escaped = [s for s in one.steps if s.step_type == StepType.ACTION_RESULT][1]
    assert escaped.metadata["execution_successful"] is False
    assert "outside the workspace" in escaped.content


def test_a_prompts_files_join_the_run_and_answer_file_answers_with_one() -> None:
    agent = CodingAgent(answer_file="calc.py")
    replies = [
        "Thought: look.\nAction: view_file(path='calc.py')",
        "Thought: it is right.\nFinal Answer: calc.py is ready",
    ]
    trajectory = asyncio.run(
        agent.run_trajectory(
            {"content": "check calc.py", "files": {"calc.py": CODE["calc.py"]}},
            scripted(replies),
            "answer",
        )
    )
    assert trajectory.get_final_response() == f"```python\n{CODE['calc.py'].rstrip()}\n```\n"


def test_a_workspace_is_read_from_a_directory_once(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("A = 1\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("ref\n")
    (tmp_path / "blob.bin").write_bytes(b"\xff\xfe\x00")
    outside = tmp_path.parent / f"{tmp_path.name}-secret.txt"
    outside.write_text("secret\n")
    (tmp_path / "leak.txt").symlink_to(outside)
    (tmp_path / "same.py").symlink_to(tmp_path / "pkg" / "a.py")
    agent = CodingAgent(workspace=tmp_path)
    assert agent.workspace.files == {"pkg/a.py": "A = 1\n", "same.py": "A = 1\n"}
    with pytest.raises(ValueError, match=r"workspace: .* is not a directory"):
        Workspace.from_directory(tmp_path / "missing")
    with pytest.raises(ValueError, match="outside the workspace"):
        Workspace({"../x.py": ""})


# ---------------------------------------------------------------------- §9.1 example


def test_the_9_1_research_workflow_runs_with_its_offline_tools() -> None:
    from examples.agentic_rollout.research_tools import FactCheckTool
    from examples.agentic_rollout.seed.advanced_integration import research_workflow

    trajectory = asyncio.run(research_workflow())
    calls = [(c.tool_name, c.tool_args) for c in trajectory.get_tool_calls()]
    assert calls == [
        ("web_search", {"query": "quantum computing applications"}),
        ("academic_search", {"query": "quantum chemistry simulation"}),
    ]
    results = [s for s in trajectory.steps if s.step_type == StepType.ACTION_RESULT]
    assert "Quantum computing applications in drug discovery" in results[0].content
    assert "Quantum algorithms for quantum chemistry" in results[1].content
    assert "quantum chemistry simulation" in str(trajectory.get_final_response())
    check = FactCheckTool()
    supported = asyncio.run(check.execute(claim="Shor's algorithm needs fault-tolerant computers"))
    assert supported["verdict"] == "supported"
    refuted = asyncio.run(check.execute(claim="Bananas grow on quantum trees in winter"))
    assert refuted == {
        "claim": "Bananas grow on quantum trees in winter",
        "verdict": "unsupported",
        "sources": [],
    }


# ---------------------------------------------------------------------- §10 monitoring


def math_model() -> Any:
    """q-right uses the calculator and answers 42; q-wrong answers 41; q-broken divides by
    zero until its steps run out; q-raise's model fails."""

    async def llm(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        question = "\n".join(m["content"] for m in messages if m["role"] == "user")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if "raise" in question:
            raise ConnectionError("model unreachable")
        if "wrong" in question:
            return "Thought: I know it.\nFinal Answer: 41"
        if "broken" in question:
            return "Thought: compute.\nAction: calculator(expression='1 / 0')"
        if turn == 0:
            return "Thought: compute.\nAction: calculator(expression='6 * 7')"
        return "Thought: the calculator answered.\nFinal Answer: 42"

    return llm


def run_math(rollout: AgenticRollout) -> list[Trajectory]:
    async def runs() -> list[Trajectory]:
        out = []
        for name in ("right", "wrong", "broken", "raise"):
            with contextlib.suppress(ConnectionError):  # q-raise: recorded as failed
                out.append(
                    await rollout.agent.run_trajectory(
                        {"content": f"q-{name}: 6*7?", "ground_truth": "42"},
                        rollout.llm_generate_func,
                        f"q-{name}",
                    )
                )
        return out

    return asyncio.run(runs())


def without_process_numbers(metrics: PerformanceMetrics) -> dict[str, Any]:
    numbers = dataclasses.asdict(metrics)
    del numbers["memory_usage_mb"], numbers["cpu_usage_percent"]
    return numbers


def test_performance_metrics_is_the_10_1_dataclass() -> None:
    metrics = PerformanceMetrics(
        total_execution_time=1.0,
        avg_step_time=0.1,
        llm_call_time=0.5,
        tool_execution_time=0.2,
        completion_rate=1.0,
        avg_steps_per_trajectory=4.0,
        tool_usage_rate=0.5,
        error_rate=0.0,
        memory_usage_mb=100.0,
        cpu_usage_percent=10.0,
        concurrent_requests=0,
        total_tokens_used=10,
        estimated_cost_usd=0.0,
    )
    assert dataclasses.asdict(metrics)["total_tokens_used"] == 10


def test_metrics_are_folded_from_the_log_and_read_the_same_after_a_restart(
    tmp_path: Path,
) -> None:
    config = AgenticRolloutConfig(agent_type="react", max_steps=3)
    rollout = AgenticRollout(config, llm_generate_func=math_model())
    rollout.tools = {"calculator": CalculatorTool()}
    rollout.agent.set_tools(rollout.tools)
    trajectories = run_math(rollout)

    runs = rollout.agent.metrics
    assert [r["trajectory_id"] for r in runs] == ["q-right", "q-wrong", "q-broken", "q-raise"]
    assert [r["completion_status"] for r in runs] == [True, True, False, False]
    assert [r["final_reward"] for r in runs[:2]] == [1.0, 0.0]
    # The reward a run's trajectory gives is the one its log records.
    recorded = [e for e in rollout.run_log.events("q-right") if isinstance(e, RewardAssigned)]
    assert trajectories[0].final_reward == recorded[0].value == 1.0
    assert runs[2]["tool_performance"] == {
        "calculator": {
            "call_count": 3,
            "success_count": 0,
            "total_time": runs[2]["tool_performance"]["calculator"]["total_time"],
        }
    }
    metrics = rollout.metrics_collector.performance_metrics()
    assert metrics.completion_rate == 0.5  # two of the four ended runs answered
    assert metrics.tool_usage_rate == 0.5 and metrics.error_rate == 0.75
    assert metrics.concurrent_requests == 0
    assert metrics.total_execution_time == pytest.approx(sum(r["execution_time"] for r in runs))
    assert metrics.memory_usage_mb > 0

    # The seed's monitor (§10.2) reads the agent's recent runs.
    agent_metrics = getattr(rollout.agent, "metrics", [])
    recent_trajectories = agent_metrics[-10:] if agent_metrics else []
    assert len(recent_trajectories) == 4

    # Restart: the objects go; a collector of the saved log reads the same numbers.
    saved = rollout.save_log(tmp_path / "events.jsonl")
    assert len(rollout.agent.metrics) == 4  # read before the log was freed
    before = (runs, without_process_numbers(metrics))
    del rollout, trajectories
    again = MetricsCollector.from_log_file(saved)
    assert (again.runs(agent="react"), without_process_numbers(again.performance_metrics())) == (
        before
    )


def test_the_seed_collectors_own_tracking() -> None:
    rollout = AgenticRollout(AgenticRolloutConfig(max_steps=3), llm_generate_func=math_model())
    rollout.tools = {"calculator": CalculatorTool()}
    rollout.agent.set_tools(rollout.tools)
    [trajectory, *_] = run_math(rollout)
    collector = MetricsCollector(rollout.run_log)
    with collector.track_execution("sleep"):
        time.sleep(0.01)
    assert collector.current_session["sleep"]["execution_time"] >= 0.01
    metrics = asyncio.run(collector.track_trajectory(trajectory, "react"))
    assert {
        "trajectory_id",
        "agent_type",
        "total_steps",
        "completion_status",
        "final_reward",
        "step_breakdown",
        "tool_performance",
        "efficiency_metrics",
    } <= set(metrics)
    assert metrics["step_breakdown"]["action_result"] >= 1
    assert collector.metrics_history == [metrics]
    with pytest.raises(ValueError, match="run 'elsewhere' is not in this collector's log"):
        asyncio.run(MetricsCollector().track_trajectory(Trajectory("elsewhere"), "react"))


class FlakyTool(CalculatorTool):
    async def health_check(self) -> dict[str, Any]:
        raise ConnectionError("service down")


def test_health_checks_see_each_component_and_leave_the_log_alone() -> None:
    rollout = AgenticRollout(AgenticRolloutConfig(max_steps=3), llm_generate_func=math_model())
    rollout.tools = {"calculator": CalculatorTool()}
    rollout.agent.set_tools(rollout.tools)
    checker = HealthChecker(rollout)
    status = asyncio.run(checker.perform_health_check())
    assert status["overall"] == "healthy", status
    assert set(status["components"]) == {"agent", "tools", "llm", "memory"}
    assert rollout.agent.metrics == []  # the probe run is recorded elsewhere

    rollout.tools = {"calculator": FlakyTool()}

    async def down(messages: Any, **kwargs: Any) -> str:
        raise ConnectionError("model unreachable")

    rollout.llm_generate_func = down
    status = asyncio.run(HealthChecker(rollout, memory_limit_mb=0.001).perform_health_check())
    components = status["components"]
    assert status["overall"] == "unhealthy"
    assert components["agent"]["healthy"] is True
    assert components["tools"]["healthy"] is False
    assert "service down" in str(components["tools"]["details"])
    assert components["llm"] == {
        "healthy": False,
        "error": "ConnectionError: model unreachable",
        "status": "check_failed",
    }
    assert components["memory"]["healthy"] is False


# ---------------------------------------------------------------------- §6 verl


def verl_rollout_section() -> dict[str, Any]:
    """verl's own ``rollout`` section, as its installed trainer config writes it."""
    yaml = pytest.importorskip("yaml")
    verl = pytest.importorskip("verl")
    path = Path(verl.__file__).parent / "trainer" / "config" / "rollout" / "rollout.yaml"
    section: dict[str, Any] = yaml.safe_load(path.read_text())
    return section


def test_from_dict_takes_a_real_verl_rollout_section_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    section = verl_rollout_section()
    section["name"] = "agentic"
    section["engine_kwargs"]["agentic"] = {"agent_type": "react", "max_steps": 4}
    with caplog.at_level(logging.WARNING, logger="kernelflow.agentic_rollout"):
        config = AgenticRolloutConfig.from_dict({"actor_rollout_ref": {"rollout": section}})
    assert (config.agent_type, config.max_steps) == ("react", 4)
    assert config.temperature == section["temperature"]  # verl's, the same setting
    [warning] = caplog.records
    assert "ignored" in warning.getMessage() and "prompt_length" in warning.getMessage()


def test_the_seed_6_1_yaml_configures_a_rollout() -> None:
    yaml = pytest.importorskip("yaml")
    text = """
actor_rollout_ref:
  rollout:
    name: agentic
    agent_type: react
    max_steps: 10
    max_tokens_per_step: 512
    temperature: 0.7

    # 工具配置
    tools_config:
      tools:
        - class_name: "kernelflow.agentic_rollout.CalculatorTool"
          config:
            precision: 10
          tool_schema:
            type: "function"
            function:
              name: "calculate"
              description: "Perform mathematical calculations"
              parameters:
                type: "object"
                properties:
                  expression:
                    type: "string"
                    description: "Mathematical expression to evaluate"
                required: ["expression"]

    # 性能设置
    batch_size: 1
    concurrent_requests: 4

    # 输出设置
    include_trajectory_in_output: true
    save_trajectories: false
    trajectory_save_path: "./trajectories"
"""
    config = AgenticRolloutConfig.from_dict(yaml.safe_load(text))
    rollout = AgenticRollout(config, llm_generate_func=math_model())
    assert list(rollout.tools) == ["calculate"] and rollout.tools["calculate"].precision == 10
    # §6.2: the rollout chosen in verl's trainer config.
    trainer_config = {
        "actor_rollout_ref": {
            "rollout": {
                "name": "agentic",
                "agent_type": "react",
                # ... 其他配置
            }
        }
    }
    assert AgenticRolloutConfig.from_dict(trainer_config) == AgenticRolloutConfig()


def test_rollout_agentic_resolves_in_verls_registry() -> None:
    pytest.importorskip("verl")
    from importlib.metadata import entry_points

    from verl.workers.rollout import BaseRollout, get_rollout_class

    plugins = {ep.name: ep.value for ep in entry_points(group="verl.plugins")}
    assert plugins["kernelflow_agentic"] == "kernelflow.integrations.verl_rollout"
    rollout_class = get_rollout_class("agentic")
    assert issubclass(rollout_class, BaseRollout)
    assert rollout_class.__name__ == "AgenticVerlRollout"


def test_verls_worker_builds_the_agentic_rollout_and_its_output_joins_the_batch() -> None:
    """As verl's engine worker does: the rollout section as verl's ``RolloutConfig``, the
    class from the registry; the output (no tokenizer) joins the trainer's batch, with the
    rewards the log holds."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.rollout import get_rollout_class

    from tests.unit.test_agentic_rollout_verl import verl_batch

    section = OmegaConf.create(verl_rollout_section())
    section.name = "agentic"
    section.engine_kwargs.agentic = {"agent_type": "react", "max_steps": 3}
    rollout_config = omega_conf_to_dataclass(section)
    rollout_class = get_rollout_class(rollout_config.name, rollout_config.mode)
    engine = rollout_class(
        config=rollout_config,
        model_config=None,
        device_mesh=None,
        llm_generate_func=math_model(),
    )
    engine.rollout.agent.set_tools({"calculator": CalculatorTool()})
    batch, gen = verl_batch(n=2)
    out = engine.generate_sequences(gen)
    merged = batch.union(out)
    assert len(merged) == 4 and list(merged.non_tensor_batch["final_response"]) == ["42"] * 4
    logged = [
        engine.rollout.trajectory(task).final_reward
        for task in out.non_tensor_batch["kernelflow_task_id"]
    ]
    assert list(out.non_tensor_batch["final_reward"]) == logged == [1.0] * 4
    assert [t["final_reward"] for t in out.non_tensor_batch["trajectory"]] == logged
    with pytest.raises(NotImplementedError, match="agent loop"):
        asyncio.run(engine.update_weights(iter(())))
