"""A registered imperative agent in real daemons on a real nats-server (docs/agents.md,
"AgenticRollout"): the research agent of the AgenticRollout examples, registered through
the ``kernelflow.agents`` entry point, survives a daemon killed between two of its LLM
calls; ``kernelflow rollout --agent research`` runs it; a standalone run's saved log
exports with ``kernelflow export grpo --from``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kernelflow.agentic_rollout import AgenticRollout, AgenticRolloutConfig, CalculatorTool
from kernelflow.events.model import LLMCalled, OutputParsed, SubmitTask, ToolCalled
from kernelflow.projections.task_state import fold
from kernelflow.rollout import RolloutConfig
from tests.conftest import EXAMPLES, REPO, as_user, cli_env, run_cli
from tests.daemons import (
    assert_each_step_once,
    publish,
    start_daemon,
    task_events,
    wait_until_settled,
)
from tests.plugins import plugin_site
from tests.unit.test_agentic_rollout import RESEARCH_SCRIPT, research_script_in


def research_plugin(site: Path) -> dict[str, str]:
    """An installed distribution whose ``kernelflow.agents`` entry point is the example's
    research agent (a BaseAgent subclass); the environment that sees it."""
    plugin_site(
        site,
        "research-agent",
        "kernelflow.agents",
        "research = examples.agentic_rollout.seed.research_agent:ResearchAgent",
    )
    return {"PYTHONPATH": f"{site}:{REPO}"}


@pytest.fixture
def script(tmp_path: Path) -> Path:
    return research_script_in(tmp_path)


def test_a_research_agent_killed_between_llm_calls_finishes_on_another_daemon(
    private_nats: str, tmp_path: Path, script: Path
) -> None:
    """SIGKILL right after its first LLM call is recorded (seq 4): the next daemon replays
    run_trajectory on that record and goes on, each LLM and tool call recorded once."""
    task_id = "research-crash"
    plugin = research_plugin(tmp_path / "site")
    log = tmp_path / "daemon.log"
    workflow = RolloutConfig(agent_type="research", tools=("calculator",)).workflow_yaml()
    publish(
        private_nats,
        SubmitTask(
            task_id=task_id, task_source="", prompt="What is 6 times 7?",
            reference_answer="42", workflow_name="research", workflow_yaml=workflow,
        ),
    )  # fmt: skip
    roles = ("--roles", "conductor,solver")
    crashing = start_daemon(
        private_nats, log, *roles, script=script,
        KF_ACK_WAIT="2", KF_FAULT_CRASH_AFTER=f"{task_id}:4", **plugin,
    )  # fmt: skip
    assert crashing.wait(timeout=120) == -9, log.read_text()[-3000:]
    assert [e.kind for e in task_events(private_nats, task_id)][-1] == "llm_called"
    daemon = start_daemon(private_nats, log, *roles, script=script, KF_ACK_WAIT="2", **plugin)
    try:
        events = wait_until_settled(private_nats, task_id, timeout_s=120)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert_each_step_once(events)
    calls = [e for e in events if isinstance(e, LLMCalled)]
    assert [c.response_text for c in calls] == RESEARCH_SCRIPT
    assert [e.output for e in events if isinstance(e, ToolCalled)] == ["42", "42"]
    [parsed] = [e for e in events if isinstance(e, OutputParsed)]
    assert parsed.fields == {"answer": "the conclusion is 42"}
    state = fold(task_id, events)
    assert state.finished is not None and state.finished.status == "success"


def test_rollout_runs_a_registered_agent_and_a_standalone_log_exports(
    private_nats: str, tmp_path: Path, script: Path
) -> None:
    env = cli_env(**research_plugin(tmp_path / "site"))
    out = tmp_path / "rollouts.jsonl"
    result = run_cli(
        "rollout", "--dataset", str(EXAMPLES / "datasets" / "arithmetic.jsonl"), "--limit", "1",
        "--agent", "research", "--tools", "calculator", "--llm", f"scripted:{script}",
        "--reward", "numeric_match", "--out", str(out), "--json",
        *as_user("daemon", private_nats),
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["statuses"] == {"success": 1} and summary["mean_reward"] == {
        "numeric_match": 1.0
    }
    [trajectory] = [json.loads(line) for line in out.read_text().splitlines()]
    tools = [
        s["tool_name"] for s in trajectory["steps"] if s["step_type"] == "action" and s["tool_name"]
    ]
    assert tools == ["calculator", "calculator"]

    # A standalone run, saved, is exported by the command like any log file.
    async def model(messages: list[dict[str, str]], **kwargs: object) -> str:
        if any(m["role"] == "assistant" for m in messages):
            return "Thought: done.\nFinal Answer: 42"
        return "Thought: multiply.\nAction: calculator(expression='6 * 7')"

    rollout = AgenticRollout(AgenticRolloutConfig(), llm_generate_func=model)
    rollout.agent.set_tools({"calculator": CalculatorTool()})
    asyncio.run(rollout.agent.run_trajectory({"content": "6*7?", "ground_truth": "42"}, model, "q"))
    saved = rollout.save_log(tmp_path / "standalone.jsonl")
    dataset = tmp_path / "grpo.parquet"
    exported = run_cli("export", "grpo", "--from", str(saved), "--out", str(dataset))
    assert exported.returncode == 0, exported.stderr
    rows = pq.read_table(dataset).to_pylist()
    assert [(r["rollout_id"], r["turn_index"], r["reward"]) for r in rows] == [
        ("q", 0, 1.0),
        ("q", 1, 1.0),
    ]
