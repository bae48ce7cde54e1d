"""The AgenticRollout design document's own examples and tests, run on kernelflow with
only their import lines changed (examples/agentic_rollout/seed; docs/agents.md,
"AgenticRollout"): the research agent and its unit, integration and performance tests
(collected from the example module as they are), the math example, the multi-agent
orchestrator and the monitor."""

from __future__ import annotations

import asyncio
from math import pi
from typing import Any

import pytest

from examples.agentic_rollout.seed import basic_usage
from examples.agentic_rollout.seed.multi_agent import AgenticRolloutMonitor, AgentOrchestrator
from examples.agentic_rollout.seed.research_agent import ResearchAgent
from examples.agentic_rollout.seed.research_agent_tests import (
    TestAgenticRolloutIntegration,
    TestPerformance,
    TestResearchAgent,
)
from examples.agentic_rollout.your_model import WolframAlphaTool
from kernelflow.agentic_rollout import (
    CalculatorTool,
    ReactAgent,
    ToolAgent,
    ToolExecutionError,
    Trajectory,
    TrajectoryAnalyzer,
)

__all__ = ["TestAgenticRolloutIntegration", "TestPerformance", "TestResearchAgent"]


def test_the_math_example_solves_its_integral_with_kernelflows_calculator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    asyncio.run(basic_usage.math_problem_solving())
    # The stand-in model answers with what the calculator observed: 5**3 / 3.
    assert capsys.readouterr().out == f"Solution: {5**3 / 3}\n"


def test_the_math_examples_integrator_integrates_and_refuses_what_is_not_math() -> None:
    wolfram = WolframAlphaTool()
    integral = asyncio.run(wolfram.execute(expression="x**2", lower=0, upper=5))
    assert integral == pytest.approx(125 / 3, rel=1e-12)
    assert asyncio.run(wolfram.execute(expression="sin(t)", variable="t", lower=0, upper=pi)) == (
        pytest.approx(2.0, rel=1e-9)
    )
    assert asyncio.run(wolfram.execute(expression="3*x + 1")) == 1.0  # at x = 0
    with pytest.raises(ToolExecutionError):
        asyncio.run(wolfram.execute(expression="__import__('os').getcwd()"))
    with pytest.raises(ToolExecutionError, match="variable must be a name"):
        asyncio.run(wolfram.execute(expression="x", variable="x)+(1", lower=0, upper=1))


async def team_model(messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """Each member of the team answers in its own format, telling who it is by its
    instructions."""
    system, last = messages[0]["content"], messages[-1]["content"]
    if system.startswith("You are a research agent"):
        return "Final answer: trapped ions and superconducting qubits lead"
    if "TOOL_CALL" in system:
        return "Final Answer: Report: two hardware families lead quantum computing."
    assert "Analyze the following research data" in last
    return "Thought: both are maturing.\nFinal Answer: both approaches are maturing"


class ReportTeam(AgentOrchestrator):
    """The orchestrator with the agents the example leaves to its reader."""

    def _create_research_agent(self) -> ResearchAgent:
        return ResearchAgent(research_depth=1)

    def _create_analysis_agent(self) -> ReactAgent:
        return ReactAgent(max_steps=3)

    def _create_writing_agent(self) -> ToolAgent:
        return ToolAgent(max_steps=3)


def test_the_orchestrator_chains_research_analysis_and_writing() -> None:
    team = ReportTeam(team_model)
    results = asyncio.run(team.collaborative_report("quantum computing"))
    answers = {k: t.get_final_response() for k, t in results.items()}
    assert answers == {
        "research": "Final answer: trapped ions and superconducting qubits lead",
        "analysis": "both approaches are maturing",
        "final_report": "Report: two hardware families lead quantum computing.",
    }
    # Each member's run is a task in its own log (request ids with spaces made safe).
    for member, key in (("researcher", "research"), ("analyst", "analysis")):
        run = results[key]
        recorded = team.agents[member].run_log.trajectory(run.metadata["task_id"])
        assert recorded.metadata["status"] == "success"
    assert results["research"].metadata["task_id"] == "research_quantum-computing"


class Monitor(AgenticRolloutMonitor):
    """The monitor with the alerting and report sections the example leaves to its
    reader."""

    def _check_alerts(self, metrics: dict[str, Any]) -> list[str]:
        errors = metrics["error_count"]
        return [f"{metrics['trajectory_id']}: {errors} failed step(s)"] if errors else []

    async def _send_alerts(self, alerts: list[str]) -> None:
        self.alerts.extend(alerts)

    def _analyze_common_issues(self, trajectories: list[Trajectory]) -> str:
        points = TrajectoryAnalyzer.identify_patterns(trajectories)["failure_points"]
        return "; ".join(f"{p['tool_name']}: {p['count']}" for p in points) or "none"

    def _generate_recommendations(self, trajectories: list[Trajectory]) -> str:
        return "check the calculator's inputs"


def test_the_monitor_reports_on_real_trajectories() -> None:
    def model(divide_by: int) -> Any:
        async def answer(messages: list[dict[str, Any]], **kwargs: Any) -> str:
            if not any(m["role"] == "assistant" for m in messages):
                return f"Thought: divide.\nAction: calculator(expression='84 / {divide_by}')"
            return "Thought: done.\nFinal Answer: 42"

        return answer

    agent = ReactAgent(max_steps=4)
    agent.set_tools({"calculator": CalculatorTool()})
    good, bad = (
        asyncio.run(agent.run_trajectory({"content": "84 / 2?"}, model(n), f"q{n}")) for n in (2, 0)
    )
    monitor = Monitor()
    metrics = asyncio.run(monitor.monitor_trajectory(bad))
    assert metrics["error_count"] == 1 and metrics["tool_calls"] == 1
    assert monitor.alerts == ["q0: 1 failed step(s)"]
    assert asyncio.run(monitor.monitor_trajectory(good))["error_count"] == 0
    report = asyncio.run(monitor.generate_performance_report([good, bad]))
    assert "Total Trajectories: 2" in report and "Completion Rate: 100.0%" in report
    assert "calculator: 1" in report
