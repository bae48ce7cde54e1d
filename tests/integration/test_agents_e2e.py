"""Agent kinds and tools end to end: real daemons on a real nats-server, the scripted LLM,
real sandboxes and the real verifier (Triton interpreted)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from kernelflow.events.model import (
    LLMCalled,
    OutputParsed,
    RewardAssigned,
    TaskFinished,
    ToolCalled,
)
from kernelflow.host.settings import Settings
from kernelflow.projections.task_state import fold
from kernelflow.projections.trajectory import StepType, build_trajectory
from kernelflow.prompt_datasets import PromptItem, load_dataset
from kernelflow.rollout import Rollout, RolloutConfig
from kernelflow.tools import workspace_files
from tests.conftest import EXAMPLES, REPO, as_user, cli_env, creds, run_cli
from tests.daemons import assert_each_step_once, task_events
from tests.plugins import plugin_site

ARITHMETIC = EXAMPLES / "datasets" / "arithmetic.jsonl"


def settings_for(url: str, tmp_path: Path) -> Settings:
    """An in-process rollout's settings: a daemon's (it hosts one), on the test server."""
    settings = Settings()
    settings.nats_url, settings.nats_creds = url, creds(url, "daemon")
    settings.data_dir = tmp_path
    return settings


def test_react_coder_checks_and_fixes_its_kernel_before_the_verifier(
    nats_url: str, tmp_path: Path
) -> None:
    result = run_cli(
        "run",
        "examples/tasks/relu.py",
        "--workflow",
        "examples/workflows/react_coder.yaml",
        "--llm",
        "scripted:examples/scripted/relu_react.yaml",
        *as_user("daemon", nats_url),
        "--out",
        str(tmp_path),
        "--json",
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "success"
    assert summary["verifications"] == ["pass"]  # the coder's own checks caught the bug
    events = task_events(nats_url, summary["task_id"])
    assert_each_step_once(events)
    checks = [e for e in events if isinstance(e, ToolCalled)]
    assert [c.tool for c in checks] == ["check_kernel", "check_kernel"]
    assert not checks[0].ok and "mismatch" in checks[0].output
    assert checks[1].ok and "pass" in checks[1].output
    coder_calls = [e for e in events if isinstance(e, LLMCalled) and e.agent == "coder"]
    assert len(coder_calls) == 3
    assert "Observation (check_kernel)" in coder_calls[1].messages[-1].content
    trajectory = build_trajectory(summary["task_id"], events)
    tool_steps = [s for s in trajectory.steps if s.tool_name == "check_kernel"]
    assert [s.step_type for s in tool_steps] == [StepType.ACTION, StepType.ACTION_RESULT] * 2
    # A check that finds a bug is a failed call: the coder sees it as an error.
    assert [s.is_correct for s in tool_steps[1::2]] == [False, True]
    assert tool_steps[3].tool_result == checks[1].output and tool_steps[3].metadata["ok"]


def test_rollout_scores_a_dataset_and_exports_flow_grpo_samples(
    private_nats: str, tmp_path: Path
) -> None:
    prompts = load_dataset(ARITHMETIC)
    out = tmp_path / "rollouts.jsonl"
    config = RolloutConfig(
        agent_type="react",
        tools=("calculator",),
        llm="scripted:examples/scripted/arithmetic_react.yaml",
        max_concurrency=3,
        save_trajectories=out,
    )
    seen = []
    trajectories = Rollout(config, settings_for(private_nats, tmp_path)).run(
        prompts, n=2, on_progress=lambda p: seen.append(p.done)
    )
    assert len(trajectories) == 8 and seen[-1] == 8
    # The scripted model's samples take turns: the first of each group uses the calculator
    # and answers 42 (right for three prompts, wrong for 2**10), the second guesses 41.
    rewards = [t.final_reward for t in trajectories]
    assert rewards == [1.0, 0.0] * 3 + [0.0] * 2
    assert all(t.metadata["rewards"]["numeric_match"] == t.final_reward for t in trajectories)
    first = trajectories[0]
    assert first.steps[0].content == "What is 6 times 7?"
    assert first.get_final_response() == "42"
    calls = [(c.tool_name, c.tool_args) for c in first.get_tool_calls()]
    assert calls == [("calculator", {"expression": "6 * 7"})]  # the solver's turns are not
    assert [json.loads(line)["request_id"] for line in out.read_text().splitlines()] == [
        t.request_id for t in trajectories
    ]
    groups = {t.metadata["group_id"] for t in trajectories}
    assert len(groups) == 4

    dataset = tmp_path / "grpo.parquet"
    exported = run_cli(
        "export", "grpo", "--reward", "exact_match", "--out", str(dataset),
        *as_user("reader", private_nats),
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    table = pq.read_table(dataset).to_pylist()
    assert {row["agent"] for row in table} == {"solver"}
    assert len(table) == 12  # two LLM turns per rollout that used the calculator, one else
    by_group: dict[str, set[float]] = {}
    for row in table:
        by_group.setdefault(row["group_id"], set()).add(row["reward"])
    assert sorted(max(v) for v in by_group.values()) == [0.0, 1.0, 1.0, 1.0]


def test_rollout_cli_with_native_tool_calls_and_an_llm_judge(
    private_nats: str, tmp_path: Path
) -> None:
    script = tmp_path / "native.yaml"
    script.write_text(
        yaml.safe_dump(
            {
                "solver": [
                    {"tool_calls": [{"name": "calculator", "args": {"expression": "6*7"}}]},
                    {"text": "Final Answer: forty-two"},
                ],
                "judge": [{"text": '{"analysis": "42 in words", "true_false": true}'}],
            }
        )
    )
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"prompt": "6*7?", "answer": "42"}) + "\n")
    result = run_cli(
        "rollout",
        "--dataset",
        str(data),
        "--agent",
        "tool",
        "--tools",
        "calculator",
        "--tool-format",
        "native",
        "--reward",
        "judge,exact_match",
        "--llm",
        f"scripted:{script}",
        *as_user("daemon", private_nats),
        "--json",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["mean_reward"] == {"exact_match": 0.0, "judge": 1.0}
    assert summary["statuses"] == {"success": 1}


def test_coding_agent_fixes_a_project_inside_its_workspace(
    private_nats: str, tmp_path: Path
) -> None:
    files = {
        "stats.py": "def mean(xs):\n    return sum(xs) / (len(xs) - 1)\n",
        "test_stats.py": (
            "from stats import mean\n\n\ndef test_mean():\n    assert mean([1, 2, 3]) == 2\n"
        ),
    }
    answers = [
        "Thought: What is in the project?\nAction: search_files(glob='*.py')",
        "Thought: Read the code.\nAction: view_file(path='stats.py')",
        "Thought: Run the tests first.\nAction: run_tests()",
        "Thought: Can I reach outside?\nAction: create_file(path='../escape.py', content='x')",
        "Thought: Divide by len(xs).\n"
        "Action: edit_file(path='stats.py', old_str='(len(xs) - 1)', new_str='len(xs)')",
        "Thought: Check the fix.\nAction: run_tests()",
        "Thought: The tests pass.\nFinal Answer: fixed",
    ]
    script = tmp_path / "coding.yaml"
    script.write_text(yaml.safe_dump({"solver": [{"text": a} for a in answers]}))
    config = RolloutConfig(
        agent_type="coding",
        tools=("search_files", "view_file", "create_file", "edit_file", "run_tests"),
        llm=f"scripted:{script}",
        rewards=("exact_match",),
    )
    (trajectory,) = Rollout(config, settings_for(private_nats, tmp_path)).run(
        [PromptItem("Make the tests pass.", reference="fixed", files=files)]
    )
    assert trajectory.final_reward == 1.0
    events = task_events(private_nats, trajectory.request_id)
    assert_each_step_once(events)
    tools = [e for e in events if isinstance(e, ToolCalled)]
    assert [t.tool for t in tools] == [
        "search_files", "view_file", "run_tests", "create_file", "edit_file", "run_tests"
    ]  # fmt: skip
    assert "stats.py" in tools[0].output and "test_stats.py" in tools[0].output
    assert not tools[2].ok and "assert" in tools[2].output  # the failing test, as observed
    assert not tools[3].ok and "escape.py" in tools[3].error
    assert tools[5].ok
    state = fold(trajectory.request_id, events)
    assert workspace_files(state)["stats.py"] == "def mean(xs):\n    return sum(xs) / len(xs)\n"
    assert not (tmp_path.parent / "escape.py").exists()
    last_call = [e for e in events if isinstance(e, LLMCalled)][-1]
    assert "[phase: testing]" in last_call.messages[-1].content
    answer = [e for e in events if isinstance(e, OutputParsed)][-1]
    assert answer.fields == {"answer": "fixed"}
    finished = next(e for e in events if isinstance(e, TaskFinished))
    assert finished.final_answer == "fixed"
    assert [e.reward_fn for e in events if isinstance(e, RewardAssigned)] == ["exact_match"]


def test_bad_agent_kinds_tools_and_settings_are_refused_with_the_key_path(
    nats_url: str, tmp_path: Path
) -> None:
    base = yaml.safe_load((EXAMPLES / "workflows" / "react_coder.yaml").read_text())
    cases = [
        ("agent_kind", "reactt", "agent_info.coder.agent_kind: unknown agent kind 'reactt'"),
        ("tools", ["check_kernal"], "agent_info.coder.tools[0]: unknown tool 'check_kernal'"),
        ("agent_config", {"max_stepz": 3}, "max_stepz"),
    ]
    for key, value, message in cases:
        doc = json.loads(json.dumps(base))
        doc["agent_info"]["coder"][key] = value
        path = tmp_path / f"bad_{key}.yaml"
        path.write_text(yaml.safe_dump(doc))
        result = run_cli(
            "submit", "examples/tasks/relu.py", "--workflow", str(path),
            *as_user("publisher", nats_url), "--wait", "--timeout", "60",
        )  # fmt: skip
        assert result.returncode == 2, result.stdout + result.stderr
        assert message in result.stdout + result.stderr


def install_kind_plugin(site: Path, name: str, source: str) -> dict[str, str]:
    """A distribution in ``site`` whose entry point registers ``source``'s ``Kind`` as
    agent kind ``name``; the environment that sees it."""
    modules = {f"{name}_kind": textwrap.dedent(source)}
    plugin_site(site, f"{name}-kind", "kernelflow.agents", f"{name} = {name}_kind:Kind", modules)
    return cli_env(PYTHONPATH=f"{site}:{REPO}")


def test_agent_kind_plugins_register_through_an_entry_point(tmp_path: Path) -> None:
    env = install_kind_plugin(
        tmp_path,
        "echo",
        """
        from kernelflow.actors.kinds import AgentKind, CallLLM, Finish

        class Kind(AgentKind):
            def next_step(self, turn):
                if not turn.llm_calls:
                    return CallLLM(turn.prompt)
                return Finish(turn.llm_calls[-1].response_text.upper())
        """,
    )
    probe = (
        "from kernelflow.actors.kinds import agent_kind, agent_kinds; "
        "print(agent_kinds()); print(agent_kind('echo').__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "'echo'" in out.stdout and "echo_kind" in out.stdout
    listed = run_cli("agents", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "echo" in json.loads(listed.stdout)["agent_kinds"]


def test_a_failing_agent_kind_fails_its_dispatch_at_once(tmp_path: Path) -> None:
    """A bug in a kind's code is recorded as the agent's failure and the task goes on (here
    to its end), instead of the dispatch being redelivered every ack_wait (30 s) until
    JetStream gives up on it, the run waiting all the while."""
    env = install_kind_plugin(
        tmp_path,
        "buggy",
        """
        from kernelflow.actors.kinds import AgentKind

        class Kind(AgentKind):
            def next_step(self, turn):
                return turn.no_such_field
        """,
    )
    env["KF_DATA_DIR"] = str(tmp_path / "data")  # its own store: no other run's tasks
    workflow = yaml.safe_load((REPO / "workflows" / "coder_only.yaml").read_text())
    workflow["agent_info"]["coder"]["agent_kind"] = "buggy"
    (tmp_path / "buggy.yaml").write_text(yaml.safe_dump(workflow))
    result = run_cli(
        "run", str(EXAMPLES / "tasks" / "relu.py"),
        "--workflow", str(tmp_path / "buggy.yaml"),
        "--llm", f"scripted:{EXAMPLES / 'scripted' / 'relu.yaml'}",
        "--out", str(tmp_path / "out"), "--timeout", "25",
        env=env,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    failure = "agent kind 'buggy' failed: AttributeError: 'Turn' object has no attribute"
    assert f"coder failed: {failure}" in result.stdout
    assert "finished: failed" in result.stdout
    # Logged once, with its traceback, for the kind's author: not retried.
    assert result.stderr.count("agent kind 'buggy' failed on task") == 1, result.stderr


@pytest.mark.parametrize("bad", ["nope.jsonl", "empty.jsonl", "noprompt.jsonl"])
def test_rollout_refuses_unusable_datasets(bad: str, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "noprompt.jsonl").write_text('{"question": "x"}\n')
    result = run_cli("rollout", "--dataset", str(tmp_path / bad), "--tools", "calculator")
    assert result.returncode == 2
    assert bad in result.stderr and result.stderr.count("\n") == 1


def test_react_dispatch_resumes_after_kills_between_its_steps(
    private_nats: str, tmp_path: Path
) -> None:
    """SIGKILL right after a tool result is recorded (seq 9) and right after the next LLM
    call is recorded (seq 10): each restart resumes the ReAct loop at that step."""
    from tests.daemons import start_daemon, submit, wait_until_over

    task_id = "react-crash"
    log = tmp_path / "daemon.log"
    env = {"KF_ACK_WAIT": "2", "KF_FAULT_CRASH_AFTER": f"{task_id}:9,{task_id}:10"}
    script = "examples/scripted/relu_react.yaml"
    submit(private_nats, task_id, "--workflow", "examples/workflows/react_coder.yaml")
    for expected_crash in (9, 10):
        daemon = start_daemon(private_nats, log, script=script, **env)
        assert daemon.wait(timeout=300) == -9, log.read_text()[-3000:]
        assert len(task_events(private_nats, task_id)) == expected_crash
    daemon = start_daemon(private_nats, log, script=script, KF_ACK_WAIT="2")
    try:
        events = wait_until_over(private_nats, task_id, timeout_s=300)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert_each_step_once(events)
    state = fold(task_id, events)
    assert state.finished is not None and state.finished.status == "success"
    assert [e.tool for e in events if isinstance(e, ToolCalled)] == ["check_kernel"] * 2


def test_datasets_load_from_verl_style_parquet(tmp_path: Path) -> None:
    import pyarrow as pa

    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 6*7?"},
            ],
            "reward_model": {"style": "rule", "ground_truth": "42"},
            "uid": "q1",
        }
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    (item,) = load_dataset(path)
    assert (item.prompt, item.reference, item.id) == ("What is 6*7?", "42", "q1")
    commands = Rollout(RolloutConfig(tools=("calculator",))).commands([item], n=3)
    assert len({c.group_id for c in commands}) == 1 and len({c.task_id for c in commands}) == 3
    assert all(c.reference_answer == "42" and c.task_name == "q1" for c in commands)
