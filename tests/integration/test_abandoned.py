"""A command that runs its own tasks (``kernelflow run``, ``kernelflow rollout``) cancels
the ones it leaves unfinished, when interrupted or out of time. Left running, the next
daemon on the same store (the next ``kernelflow run``) would resume them in the
background, LLM calls and all, for a result nobody waits for."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, KERNELFLOW, REPO, as_user, cli_env, run_cli
from tests.daemons import slow_script

RELU = str(EXAMPLES / "tasks" / "relu.py")


def start(args: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    """A kernelflow command in a session of its own: a process group, as in a terminal."""
    with out.open("wb") as stdout:
        return subprocess.Popen(
            [*KERNELFLOW, *args],
            cwd=REPO,
            env=env,
            stdout=stdout,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )


def interrupt_once(
    proc: subprocess.Popen[bytes], ready: Callable[[], bool], sig: int = signal.SIGINT
) -> tuple[int, str]:
    """Ctrl-C as a terminal sends it (to the whole foreground process group) once
    ``ready()``, or ``sig`` likewise; the exit code and stderr."""
    deadline = time.monotonic() + 60
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, "never got ready"
        time.sleep(0.2)
    os.killpg(proc.pid, sig)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr.decode()


def status_of(task_id: str, env: dict[str, str]) -> dict[str, object]:
    result = run_cli("status", task_id, "--json", env=env)
    assert result.returncode == 0, result.stderr
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


# SIGTERM: what `timeout` or a cancelled CI job sends.
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_a_run_cancels_its_task(sig: int, tmp_path: Path) -> None:
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    out = tmp_path / "out.txt"
    script = slow_script(tmp_path, 600, "designer")
    proc = start(["run", RELU, "--llm", f"scripted:{script}", "--task-id", "t1"], env, out)
    interrupted = [0.0]

    def ready() -> bool:
        interrupted[0] = time.monotonic()
        return "step 1: designer" in out.read_text()

    code, stderr = interrupt_once(proc, ready, sig)
    assert code == 130
    # The interrupt reaches kernelflow, not the embedded server it still needs to record
    # the cancel (before, the server died with it, in a burst of connection warnings);
    # stopping said nothing more (a stop that timed out would).
    assert stderr == "kernelflow: cancelled t1: kernelflow run interrupted\n"
    # Not the designer's ten minutes: the command did not wait for the step to end.
    assert time.monotonic() - interrupted[0] < 120
    status = status_of("t1", env)
    assert (status["status"], status["reason"], status["steps"]) == (
        "cancelled",
        "kernelflow run interrupted",
        1,
    )
    assert not (tmp_path / "data" / "server.json").exists()  # the server was stopped


def test_a_run_out_of_time_cancels_its_task(tmp_path: Path) -> None:
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    script = slow_script(tmp_path, 60, "designer")
    # Long enough for a waiting step to be explained, were run to do that (its own daemon
    # hosts every role: nothing to explain).
    run = run_cli(
        "run", RELU, "--llm", f"scripted:{script}", "--task-id", "t1", "--timeout", "7", env=env
    )
    assert run.returncode == 3
    assert run.stderr == (
        "kernelflow: cancelled t1: kernelflow run --timeout 7s passed\n"
        "kernelflow: task t1 did not finish within 7s\n"
    )
    assert status_of("t1", env)["status"] == "cancelled"


def test_interrupting_a_rollout_cancels_the_rollouts_it_started(
    private_nats: str, tmp_path: Path
) -> None:
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1?"}) + "\n" for i in range(3)))
    script = slow_script(tmp_path, 60, "solver")
    args = ["rollout", "--dataset", str(data), "--llm", f"scripted:{script}"]
    args += ["--concurrency", "2", *as_user("daemon", private_nats)]
    proc = start(args, cli_env(), tmp_path / "out.txt")

    def tasks() -> list[dict[str, object]]:
        result = run_cli("status", "--json", *as_user("publisher", private_nats))
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, object]] = json.loads(result.stdout)
        return rows

    code, stderr = interrupt_once(proc, lambda: sum(t["steps"] == 1 for t in tasks()) == 2)
    assert code == 130
    started = sorted(str(t["task_id"]) for t in tasks())  # the third was never submitted
    assert len(started) == 2
    assert f"kernelflow: cancelled {', '.join(started)}: rollout interrupted\n" in stderr
    assert {(t["status"], t["reason"]) for t in tasks()} == {("cancelled", "rollout interrupted")}


def test_a_rollout_resumed_after_ctrl_c_runs_what_it_cut_off_and_exports_as_if_never_cut(
    private_nats: str, tmp_path: Path
) -> None:
    """Ctrl-C cancels the rollouts in flight and says how to continue; ``--resume RUN``
    keeps what finished and runs each cancelled rollout again in its group: the summary
    and the Flow-GRPO samples are those of a run never interrupted (issue 49)."""
    script = yaml.safe_load((REPO / "examples/scripted/arithmetic_react.yaml").read_text())
    for entry in script["solver"]:  # each answer a while away: Ctrl-C lands mid-run
        for choice in entry.get("choices", [entry]):
            choice["latency_s"] = 1.5
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(script))
    args = [
        "rollout", "--dataset", str(EXAMPLES / "datasets" / "arithmetic.jsonl"),
        "--agent", "react", "--tools", "calculator", "--n", "2", "--concurrency", "2",
        "--llm", f"scripted:{slow}", *as_user("daemon", private_nats), "--json",
    ]  # fmt: skip
    whole = run_cli(*args)
    assert whole.returncode == 0, whole.stderr
    whole_run = json.loads(whole.stdout)["run_id"]

    def rows(run: str) -> list[dict[str, object]]:
        result = run_cli("status", "--json", *as_user("publisher", private_nats))
        assert result.returncode == 0, result.stderr
        found: list[dict[str, object]] = json.loads(result.stdout)
        return [t for t in found if str(t["task_id"]).startswith(f"ro-{run}")]

    proc = start(args, cli_env(), tmp_path / "out.txt")

    def cut_midway() -> bool:
        runs = [t for t in rows("") if not str(t["task_id"]).startswith(f"ro-{whole_run}-")]
        done = sum(t["status"] == "success" for t in runs)
        # Not over yet: "queued" too, as status calls a command's own daemon's tasks.
        return done >= 1 and any(t["status"] in ("running", "queued") for t in runs)

    code, said = interrupt_once(proc, cut_midway)
    assert code == 130, said
    match = re.search(r"rollout (\w+) interrupted: .* --resume (\w+)", said)
    assert match and match[1] == match[2], said
    cut_run = match[1]
    cancelled = [t for t in rows(cut_run) if t["status"] == "cancelled"]
    assert cancelled and any(t["status"] == "success" for t in rows(cut_run))

    resumed = run_cli(*args, "--resume", cut_run)
    assert resumed.returncode == 0, resumed.stderr
    after, before = json.loads(resumed.stdout), json.loads(whole.stdout)
    assert after["run_id"] == cut_run
    for key in ("rollouts", "statuses", "mean_reward", "tokens"):
        assert after[key] == before[key], key
    redone = {re.sub(r"-(\d+)$", r"-r1-\1", str(t["task_id"])) for t in cancelled}
    assert redone <= {str(t["task_id"]) for t in rows(cut_run)}  # a new attempt each

    out = tmp_path / "grpo.jsonl"
    exported = run_cli("export", "grpo", "--out", str(out), *as_user("reader", private_nats))
    assert exported.returncode == 0, exported.stderr
    samples = [json.loads(line) for line in out.read_text().splitlines()]

    def of_run(run: str) -> list[tuple[object, ...]]:
        return sorted(
            (str(s["group_id"]).removeprefix(run), s["reward"], round(float(s["advantage"]), 6))
            for s in samples
            if str(s["group_id"]).startswith(run)
        )

    assert of_run(cut_run) == of_run(whole_run) != []


def test_resume_refuses_a_run_the_log_does_not_hold(private_nats: str) -> None:
    result = run_cli(
        "rollout", "--dataset", str(EXAMPLES / "datasets" / "arithmetic.jsonl"),
        "--llm", "scripted:examples/scripted/arithmetic_react.yaml",
        "--resume", "nosuchrun", *as_user("daemon", private_nats),
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "kernelflow: --resume nosuchrun: the log holds no rollout of this run (its tasks "
        "are ro-nosuchrun-<prompt>-<sample>)"
    )
