"""Every predefined workflow and the documented custom ones, run end to end through the
CLI; the lifecycle commands (cancel, deadline) and the workflow tools."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import pytest
import yaml

from kernelflow.events import subjects
from kernelflow.events.model import AgentDispatched, ConductorDecided, TaskCancelled
from tests.conftest import EXAMPLES, REPO, as_user, run_cli
from tests.daemons import (
    slow_script,
    start_daemon,
    stream_messages,
    submit,
    task_events,
    wait_until_over,
)

RELU = "examples/tasks/relu.py"


def relu_script() -> dict:  # type: ignore[type-arg]
    return yaml.safe_load((EXAMPLES / "scripted" / "relu.yaml").read_text())


def good_relu_kernel() -> str:
    text = relu_script()["coder"][1]["text"]
    return re.search(r"```python\n(.*?)```", text, re.DOTALL).group(1)  # type: ignore[union-attr]


def run_json(*args: str, nats_url: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    run = run_cli(
        "run", *args, "--json", *as_user("daemon", nats_url), "--out", str(tmp_path / "out")
    )
    assert run.stdout, run.stderr
    result = json.loads(run.stdout)
    result["exit_code"] = run.returncode
    return result  # type: ignore[no-any-return]


def history(task_id: str, nats_url: str) -> list[str]:
    replay = run_cli("replay", "--task", task_id, "--json", *as_user("reader", nats_url))
    steps = json.loads(replay.stdout)["steps"]
    worked = [s for s in steps if s["step_type"] in ("action", "action_result")]
    return [s["tool_name"] or s["metadata"]["agent"] for s in worked]


def test_coder_only(nats_url: str, tmp_path: Path) -> None:
    result = run_json(
        RELU,
        "--workflow",
        "coder_only",
        "--llm",
        "scripted:examples/scripted/relu.yaml",
        nats_url=nats_url,
        tmp_path=tmp_path,
    )
    assert (result["status"], result["exit_code"]) == ("success", 0)
    assert history(result["task_id"], nats_url) == ["coder", "verifier", "coder", "verifier"]


def test_conductor_connect_all(nats_url: str, tmp_path: Path) -> None:
    script = relu_script()
    # Every hand-over in this workflow has two options, so the conductor's LLM decides each,
    # the pass too: finish, or another round from the designer.
    script["conductor"] = [
        {"text": json.dumps({"decision": d, "error_and_suggestion": "go on"})}
        for d in ("coder", "verifier", "coder", "verifier", "finish")
    ]
    path = tmp_path / "connect_all.yaml"
    path.write_text(yaml.safe_dump(script))
    result = run_json(
        RELU,
        "--workflow",
        "conductor_connect_all",
        "--llm",
        f"scripted:{path}",
        nats_url=nats_url,
        tmp_path=tmp_path,
    )
    assert result["status"] == "success"
    assert history(result["task_id"], nats_url) == [
        "designer",
        "coder",
        "verifier",
        "coder",
        "verifier",
    ]
    decisions = [
        e for e in task_events(nats_url, result["task_id"]) if isinstance(e, ConductorDecided)
    ]
    after_pass = decisions[-1]
    assert (after_pass.mode, after_pass.options, after_pass.chosen) == (
        "llm",
        ["finish", "designer"],
        "finish",
    )
    counters = run_cli(
        "replay",
        "--task",
        result["task_id"],
        "--view",
        "counters",
        "--json",
        *as_user("reader", nats_url),
    )
    view = json.loads(counters.stdout)
    assert view["step"] == 5 and view["max_step"] == 10
    assert view["sequences"]["coder_verifier"] == {
        "pattern": ["coder", "verifier"],
        "repeats": 2,
        "max_repeats": 3,
    }
    assert view["consecutive"]["verifier"]["runs"] == 1
    # ...and as they stood at each decision: the start, then after each of the 5 agents.
    decisions = view["decisions"]
    assert [(d["after_agent"], d["chosen"], d["step"]) for d in decisions] == [
        ("", "designer", 0),
        ("designer", "coder", 1),
        ("coder", "verifier", 2),
        ("verifier", "coder", 3),
        ("coder", "verifier", 4),
        ("verifier", "finish", 5),
    ]
    assert [d["sequences"]["coder_verifier"] for d in decisions] == [0, 0, 0, 1, 0, 2]
    assert decisions[2]["consecutive"]["coder"] == 1 and not decisions[2]["removed"]
    text = run_cli(
        "replay", "--task", result["task_id"], "--view", "counters", *as_user("reader", nats_url)
    )
    assert "after coder" in text.stdout and "coder_verifier 2/3" in text.stdout


def test_verifier_only_checks_existing_code(nats_url: str, tmp_path: Path) -> None:
    candidate = tmp_path / "kernel.py"
    candidate.write_text(good_relu_kernel())
    result = run_json(
        RELU,
        "--workflow",
        "verifier_only",
        "--candidate",
        str(candidate),
        nats_url=nats_url,
        tmp_path=tmp_path,
    )
    assert (result["status"], result["steps"]) == ("success", 1)
    assert result["final_code"] == candidate.read_text()


def test_custom_agent_workflow(nats_url: str, tmp_path: Path) -> None:
    result = run_json(
        RELU,
        "--workflow",
        "examples/workflows/custom_optimizer.yaml",
        "--llm",
        "scripted:examples/scripted/relu_optimizer.yaml",
        nats_url=nats_url,
        tmp_path=tmp_path,
    )
    assert result["status"] == "success"
    assert history(result["task_id"], nats_url) == ["coder", "optimizer", "verifier"]
    assert "BLOCK_SIZE = 4096" in result["final_code"]  # the optimizer's rewrite was verified


def test_the_seed_optimizer_example_hands_a_verified_kernel_to_the_optimizer(
    nats_url: str, tmp_path: Path
) -> None:
    """Seed 001's extension example (verifier → [finish, coder, optimizer]), the verifier
    under mandatory analysis: the conductor sends the kernel the coder got right on to the
    optimizer, whose faster rewrite is verified and kept."""
    result = run_json(
        RELU,
        "--workflow",
        "examples/workflows/default_with_optimizer.yaml",
        "--llm",
        "scripted:examples/scripted/relu_default_with_optimizer.yaml",
        nats_url=nats_url,
        tmp_path=tmp_path,
    )
    assert (result["status"], result["verifications"]) == ("success", ["pass", "pass"])
    assert history(result["task_id"], nats_url) == [
        "designer",
        "coder",
        "verifier",
        "optimizer",
        "verifier",
    ]
    assert "BLOCK_SIZE = 4096" in result["final_code"]
    decided = [
        (e.options, e.chosen, e.mode)
        for e in task_events(nats_url, result["task_id"])
        if isinstance(e, ConductorDecided) and e.after_agent == "verifier"
    ]
    assert decided == [
        (["finish", "optimizer"], "optimizer", "llm"),
        (["finish", "coder"], "finish", "llm"),  # never back to the agent that wrote it
    ]


def test_an_unparseable_coder_answer_reruns_the_coder(nats_url: str, tmp_path: Path) -> None:
    """In default the coder does not list itself; its answer with no code reruns it with
    the conductor's suggestion, and the verifier only ever sees code."""
    script = relu_script()
    buggy, fixed = script["coder"]
    script["coder"] = [buggy, {"text": "The grid needs `triton.cdiv`; I will fix it."}, fixed]
    path = tmp_path / "no_code_once.yaml"
    path.write_text(yaml.safe_dump(script))
    result = run_json(RELU, "--llm", f"scripted:{path}", nats_url=nats_url, tmp_path=tmp_path)
    assert (result["status"], result["verifications"]) == ("success", ["mismatch", "pass"])
    events = task_events(nats_url, result["task_id"])
    coders = [e for e in events if isinstance(e, AgentDispatched) and e.agent == "coder"]
    assert [e.step for e in coders] == [2, 4, 5]
    suggestion = json.loads(script["conductor"][0]["text"])["error_and_suggestion"]
    assert [e.suggestion for e in coders] == ["", suggestion, suggestion]
    [retry] = [e for e in events if isinstance(e, ConductorDecided) and e.mode == "retry"]
    assert (retry.after_agent, retry.chosen) == ("coder", "coder")


@pytest.mark.parametrize("workflow", ["custom_optimizer.yaml", "default_with_optimizer.yaml"])
def test_documented_workflows_validate_and_show(workflow: str) -> None:
    path = f"examples/workflows/{workflow}"
    assert run_cli("workflow", "validate", path).returncode == 0
    shown = run_cli("workflow", "show", path)
    assert shown.returncode == 0 and "optimizer" in shown.stdout and "verifier" in shown.stdout


def test_invalid_workflow_is_refused_before_anything_runs(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        (REPO / "workflows" / "default.yaml")
        .read_text()
        .replace("[finish, coder]", "[finish, codr]")
    )
    for args in (
        ["workflow", "validate", str(bad)],
        ["run", RELU, "--workflow", str(bad), "--llm", "scripted:x"],
    ):
        result = run_cli(*args, "--data-dir", str(tmp_path)) if args[0] == "run" else run_cli(*args)
        assert result.returncode == 2
        assert (
            f"{bad}: agent_info.verifier.possible_next_agent[1]: unknown agent 'codr'"
            in result.stderr
        )


@pytest.mark.parametrize(
    "args, problem",
    [
        (["submit", RELU, "--task-id", "a.b"], "task_id: expected 1 to 64 letters, digits"),
        (["cancel", "a.b"], "task_id: expected 1 to 64 letters, digits"),
        (
            ["submit", RELU, "--samples", "10", "--task-id", "x" * 62],
            "task_id: expected 1 to 64 letters, digits",
        ),
    ],
    ids=["task-id", "cancel-task-id", "sample-ids"],
)
def test_a_command_a_daemon_would_refuse_is_refused_before_it_is_published(
    args: list[str], problem: str, private_nats: str
) -> None:
    role = "daemon" if args[0] in ("run", "rollout") else "publisher"  # as docs/security.md
    result = run_cli(*args, *as_user(role, private_nats))
    assert result.returncode == 2, result.stderr
    assert re.search(r"^kernelflow: cannot (submit|cancel) th", result.stderr, re.MULTILINE)
    assert problem in result.stderr
    assert stream_messages(private_nats, subjects.COMMANDS_STREAM) == 0


@pytest.mark.parametrize(
    "args, problem",
    [
        (["--roles", "conductor,a.b"], "--roles: 'a.b' cannot name a role"),  # a subject token
        (["--roles", " , "], "--roles: name at least one role"),
        (["--pool", "coder=0"], "--pool 'coder=0': expected ROLE=N with N ≥ 1"),
        (
            ["--roles", "conductor,coder", "--pool", "codr=4"],
            "--pool 'codr=4': this daemon does not host 'codr' (--roles conductor,coder)",
        ),
    ],
)
def test_a_daemon_refuses_roles_it_cannot_host(args: list[str], problem: str) -> None:
    result = run_cli("daemon", "--nats-url", "nats://127.0.0.1:9", *args)
    assert result.returncode == 2 and problem in result.stderr, result.stderr


def test_deadline_ends_a_task_with_its_own_status(nats_url: str, tmp_path: Path) -> None:
    script = slow_script(tmp_path, 2.0)
    result = run_json(
        RELU, "--llm", f"scripted:{script}", "--deadline", "1", nats_url=nats_url, tmp_path=tmp_path
    )
    assert (result["status"], result["exit_code"]) == ("timeout", 1)
    assert "deadline of 1s" in result["reason"]
    assert result["steps"] == 2  # designer, then the slow coder; nothing after the deadline


def test_cancel_a_running_task(nats_url: str, tmp_path: Path) -> None:
    script = slow_script(tmp_path, 3.0)
    daemon = start_daemon(nats_url, tmp_path / "daemon.log", script=script)
    try:
        submit(nats_url, "to-cancel")
        time.sleep(1.5)  # the coder is inside its 3 s call
        cancel = run_cli(
            "cancel", "to-cancel", "--reason", "changed my mind", *as_user("publisher", nats_url)
        )
        assert cancel.returncode == 0, cancel.stderr
        again = run_cli("cancel", "to-cancel", *as_user("publisher", nats_url))
        assert again.returncode == 1 and "already over" in again.stderr
        time.sleep(3)  # the coder's answer arrives after the cancellation...
        status = json.loads(
            run_cli("status", "to-cancel", "--json", *as_user("publisher", nats_url)).stdout
        )
        assert status["status"] == "cancelled" and status["reason"] == "changed my mind"
        replay = json.loads(
            run_cli("replay", "--task", "to-cancel", "--json", *as_user("reader", nats_url)).stdout
        )
        assert replay["steps"][-1]["step_type"] == "final_answer"  # ...and is not recorded
        missing = run_cli("cancel", "no-such-task", *as_user("publisher", nats_url))
        assert missing.returncode == 2 and "no task" in missing.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)


def test_a_cancel_no_daemon_takes_says_at_once_it_is_queued_and_applies_when_one_starts(
    private_nats: str, tmp_path: Path
) -> None:
    submit(private_nats, "queued")  # no daemon either: the submit waits in the queue too
    cancel = run_cli(
        "cancel", "queued", "--reason", "not needed", *as_user("publisher", private_nats)
    )
    assert cancel.returncode == 3
    # One line, said once a look for daemons found none (before: after 5 s of waiting).
    assert cancel.stderr == (
        "kernelflow: cancel of queued queued: no daemon answered; it applies when a daemon "
        "starts (kernelflow daemon)\n"
    )
    daemon = start_daemon(private_nats, tmp_path / "daemon.log")
    try:
        events = wait_until_over(private_nats, "queued", timeout_s=60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    assert isinstance(events[-1], TaskCancelled) and events[-1].reason == "not needed"


def test_a_run_leaves_tasks_others_queued_to_their_daemon_unless_asked(
    private_nats: str, tmp_path: Path
) -> None:
    """Work queued in the store before a run (here a submit no daemon took, perhaps for
    another model) is not done by the run's in-process daemon: the user hears of it once,
    and it stays queued; ``--serve-others`` has the run do it too, and says so."""
    submit(private_nats, "earlier")
    args = (
        RELU, *as_user("daemon", private_nats), "--out", str(tmp_path / "out"),
        "--llm", "scripted:examples/scripted/relu.yaml",
    )  # fmt: skip
    run = run_cli("run", *args)
    assert run.returncode == 0, run.stderr
    notes = [line for line in run.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: task earlier (conductor) waits in the queue, left there by another command or "
        "publisher; this run leaves it to a daemon (`kernelflow daemon` runs it, "
        "--serve-others lets this run work on it, `kernelflow cancel earlier` ends it)"
    ]
    status = run_cli("status", "earlier", *as_user("publisher", private_nats))
    assert status.returncode == 3, status.stderr  # still queued: not in the log yet
    assert "task earlier is not in the log yet" in status.stderr

    # Given back as the first run stopped, the submit is taken again some seconds later
    # (actors/daemon.py): this run's own task takes longer than that.
    slow = slow_script(tmp_path, 10, "designer")
    served = run_cli("run", *args, "--serve-others", "--llm", f"scripted:{slow}")
    assert served.returncode == 0, served.stderr
    notes = [line for line in served.stderr.splitlines() if line.startswith("note:")]
    assert notes == [
        "note: this run's daemon also works on task earlier (conductor), queued before this "
        "run or by another publisher; `kernelflow cancel earlier` ends it"
    ]
    # The run's daemon took the submit: the task is in the log.
    status = run_cli("status", "earlier", "--json", *as_user("publisher", private_nats))
    assert status.returncode == 0, status.stderr


def test_a_step_for_an_agent_no_daemon_hosts_says_so_while_waiting(
    private_nats: str, tmp_path: Path
) -> None:
    """A custom agent runs only where a daemon names it in --roles: a task reaching it
    under daemons that do not says why it stopped moving, instead of waiting in silence."""
    daemon = start_daemon(
        private_nats, tmp_path / "daemon.log", script="examples/scripted/relu_optimizer.yaml"
    )
    try:
        waited = run_cli(
            "submit", RELU, "--wait", "--timeout", "10", *as_user("publisher", private_nats),
            "--workflow", "examples/workflows/custom_optimizer.yaml",
        )  # fmt: skip
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
    assert waited.returncode == 3, waited.stderr
    assert "step 1: coder" in waited.stdout and "step 2: optimizer" in waited.stdout
    assert re.search(
        r"step 2 \(optimizer\) not started after \d+s: 1 daemon\(s\) answered, none hosts "
        r"the optimizer role\. .*kernelflow daemon --roles …,optimizer",
        waited.stderr,
    ), waited.stderr


def test_samples_form_one_group(nats_url: str, tmp_path: Path) -> None:
    candidate = tmp_path / "kernel.py"
    candidate.write_text(good_relu_kernel())
    daemon = start_daemon(nats_url, tmp_path / "daemon.log", "--pool", "verifier=2")
    try:
        result = run_cli(
            "submit",
            RELU,
            "--workflow",
            "verifier_only",
            "--candidate",
            str(candidate),
            "--samples",
            "3",
            "--task-id",
            "sampled",
            "--wait",
            *as_user("publisher", nats_url),
        )
        assert result.returncode == 0, result.stderr
        # Following the tasks leaves nothing running behind it when the command exits.
        assert "ERROR" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
    ids = result.stdout.split()[:3]
    assert ids == ["sampled-1", "sampled-2", "sampled-3"]
    groups = {
        json.loads(run_cli("replay", "--task", t, "--json", *as_user("reader", nats_url)).stdout)[
            "metadata"
        ]["group_id"]
        for t in ids
    }
    assert len(groups) == 1
    assert (
        run_cli("submit", RELU, "--samples", "0", *as_user("publisher", nats_url)).returncode == 2
    )
