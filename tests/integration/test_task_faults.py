"""Faults that are not the candidate's (a task whose reference fails, a backend the node
cannot run) are said as such, cost no LLM call, and are refused before publishing where
they can be known then; the strictness policy reaches the verdict from every command."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kernelflow.events.model import AgentDispatched, LLMCalled, RewardAssigned, SubmitTask
from kernelflow.projections.task_state import fold
from kernelflow.rollout import rollout_complete
from tests.conftest import EXAMPLES, as_user, cli_env, run_cli
from tests.daemons import publish, start_daemon, task_events, wait_for_line, wait_until_over

RELU = (EXAMPLES / "tasks" / "relu.py").read_text()
# A reference that fails on every input: its matmul's sizes never agree.
BROKEN = RELU.replace("return torch.relu(x)", "return torch.relu(x) @ torch.ones(3, 3)")


def test_run_refuses_a_task_whose_reference_fails_before_any_llm_call(tmp_path: Path) -> None:
    task = tmp_path / "broken.py"
    task.write_text(BROKEN)
    started = time.monotonic()
    result = run_cli(
        "run",
        str(task),
        "--llm",
        "scripted:examples/scripted/relu.yaml",
        "--out",
        str(tmp_path / "out"),
        env=cli_env(KF_DATA_DIR=str(tmp_path / "data")),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "reference model fails" in lines[0], result.stderr
    assert "LLM call" not in result.stdout  # nothing was published
    assert time.monotonic() - started < 60


def test_run_refuses_a_backend_this_machine_cannot_run(tmp_path: Path) -> None:
    result = run_cli(
        "run",
        "examples/tasks/relu.py",
        "--backend",
        "cuda",
        "--llm",
        "scripted:examples/scripted/relu.yaml",
        "--out",
        str(tmp_path / "out"),
        env=cli_env(KF_DATA_DIR=str(tmp_path / "data")),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "offers: cpp, triton" in result.stderr and "cuda" in result.stderr
    assert "LLM call" not in result.stdout


def test_a_reference_checked_once_is_not_checked_again(tmp_path: Path) -> None:
    """`submit` remembers a task whose reference ran: the same task published again costs
    no sandbox (a data dir shared by both submits; the task waits for a daemon)."""
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    checked = tmp_path / "data" / "checked-references"
    first = run_cli("submit", "examples/tasks/relu.py", env=env)
    assert first.returncode == 0, first.stderr
    assert len(list(checked.iterdir())) == 1
    again = run_cli("submit", "examples/tasks/relu.py", env=env)
    assert again.returncode == 0 and len(list(checked.iterdir())) == 1


def test_a_published_broken_task_ends_rejected_without_a_second_coder(
    private_nats: str, tmp_path: Path
) -> None:
    """A publisher that skips the CLI's checks: the first verification finds the task's
    fault, and one decision ends the task (no coder retry, no reward)."""
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log)
    try:
        wait_for_line(log, "verifier warm-up done")
        command = SubmitTask(task_id="broken-1", task_source=BROKEN, task_name="broken")
        publish(private_nats, command)
        events = wait_until_over(private_nats, "broken-1")
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    state = fold("broken-1", events)
    assert state.finished is not None and state.finished.status == "rejected"
    assert state.finished.reason.startswith("the task is broken")
    assert [v.report.verdict for v in state.verifications] == ["task_error"]
    coders = [e for e in events if isinstance(e, AgentDispatched) and e.agent == "coder"]
    assert len(coders) == 1
    verified = next(i for i, e in enumerate(events) if e.kind == "verification_completed")
    assert not [e for e in events[verified:] if isinstance(e, LLMCalled | RewardAssigned)]


def test_submit_refuses_a_backend_no_running_verifier_offers(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log)
    try:
        wait_for_line(log, "verifier warm-up done")
        result = run_cli(
            "submit",
            "examples/tasks/relu.py",
            "--backend",
            "cuda",
            *as_user("publisher", private_nats),
        )
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert result.returncode == 2, result.stderr
    assert "no running verifier offers backend 'cuda' (offered: cpp, triton)" in result.stderr


@pytest.mark.parametrize(
    ("policy", "verdict", "code"), [("strict", "rejected_static", 1), ("kernelbench", "pass", 0)]
)
def test_verify_judges_under_the_policy_it_is_given(policy: str, verdict: str, code: int) -> None:
    cheat = EXAMPLES / "candidates" / "cheats" / "torch_compute.py"
    result = run_cli(
        "verify",
        "--task",
        "examples/tasks/relu.py",
        "--candidate",
        str(cheat),
        "--policy",
        policy,
        "--json",
    )
    assert result.returncode == code, result.stderr
    report = json.loads(result.stdout)
    assert (report["verdict"], report["policy"]) == (verdict, policy)
    if policy == "kernelbench":
        assert any(w.startswith("torch_compute:") for w in report["warnings"])


def test_every_event_of_a_published_task_names_its_policy(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log)
    try:
        result = run_cli(
            "submit",
            "examples/tasks/relu.py",
            "--task-id",
            "kb-1",
            "--policy",
            "kernelbench",
            *as_user("publisher", private_nats),
            "--wait",
        )
        assert result.returncode == 0, result.stdout + result.stderr
        # --wait returns on the finish; its rewards are appended with it, and a read
        # right then may come between the finish and the last of them.
        deadline = time.monotonic() + 30
        while not rollout_complete(state := fold("kb-1", task_events(private_nats, "kb-1"))):
            assert time.monotonic() < deadline, state.rewards
            time.sleep(0.2)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert state.submitted is not None and state.submitted.policy == "kernelbench"
    assert {v.report.policy for v in state.verifications} == {"kernelbench"}
    assert "clean" in state.rewards  # the reward that tells a warned pass from a clean one
