"""The second hour of a user (issue 49), row by row, with the real CLI on the default
configuration (the embedded NATS, a scripted model): what a resumed ``bench`` does with
the candidates its Ctrl-C cancelled, what ``status`` says of a task no daemon advances,
what a long command shows while it works. Rows tested elsewhere: a run that leaves
others' tasks queued, and a cancel with no daemon (tests/integration/test_workflow_runs.py); a task
file with a syntax error (tests/integration/test_e2e.py); every documented snippet
(tests/integration/test_docs_snippets.py); a search interrupted anywhere, as a property
(tests/unit/test_search_strategies.py)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from kernelflow.actors.bridge import Bridge
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import TaskCancelled
from kernelflow.projections.search import INTERRUPTED
from tests.conftest import (
    EXAMPLES,
    KERNELFLOW,
    REPO,
    as_user,
    cli_env,
    connect,
    role_auth,
    run_cli,
)
from tests.daemons import RELU_SCRIPT, slow_script, submitted_on_default
from tests.integration.test_bench import bench_process, evolve_script, search_of


def test_a_task_no_daemon_advances_shows_as_queued_not_running(private_nats: str) -> None:
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    try:  # a task recorded, then left: the daemon that took it is gone
        bridge.call(bridge.log.append(TaskHistory("left"), [submitted_on_default("left")]))
    finally:
        bridge.stop()
    one = run_cli("status", "left", "--json", *as_user("publisher", private_nats))
    assert one.returncode == 0, one.stderr
    row = json.loads(one.stdout)
    assert row["status"] == "queued"
    assert row["reason"] == "no daemon answered: it waits for one (kernelflow daemon)"
    every = run_cli("status", *as_user("publisher", private_nats))
    assert every.returncode == 0, every.stderr
    (line,) = [line for line in every.stdout.splitlines() if line.startswith("left ")]
    assert line.split()[1] == "queued"


def test_a_task_a_run_works_on_shows_as_running_while_others_stay_queued(
    private_nats: str, tmp_path: Path
) -> None:
    """A command's own daemon serves its own task alone: ``status`` in another terminal
    shows that task running and others queued, and ``health`` lists the command apart
    from the daemons (before: its task too was "queued: no daemon answered")."""
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    try:
        bridge.call(bridge.log.append(TaskHistory("left"), [submitted_on_default("left")]))
    finally:
        bridge.stop()
    slow = slow_script(tmp_path, 60, "designer")  # the run stays on its first step
    args = ["run", str(EXAMPLES / "tasks" / "relu.py"), "--llm", f"scripted:{slow}"]
    args += ["--task-id", "mine", *as_user("daemon", private_nats)]
    with (tmp_path / "run.out").open("wb") as out:
        run = subprocess.Popen(
            [*KERNELFLOW, *args], cwd=REPO, env=cli_env(), stdout=out, stderr=out,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            shown = run_cli("status", "--json", *as_user("publisher", private_nats))
            assert shown.returncode == 0, shown.stderr
            rows = {row["task_id"]: row for row in json.loads(shown.stdout)}
            if "mine" in rows and rows["mine"]["steps"] >= 1:
                break
            assert run.poll() is None and time.monotonic() < deadline, (
                tmp_path / "run.out"
            ).read_text()
            time.sleep(0.3)
        assert rows["mine"]["status"] == "running"
        assert rows["left"]["status"] == "queued"
        assert rows["left"]["reason"] == (
            "only commands host the conductor role, each for its own tasks: it waits for "
            "one (kernelflow daemon)"
        )
        health = run_cli("health", "--json", *as_user("publisher", private_nats))
        report = json.loads(health.stdout)
        assert report["daemons"] == [] and len(report["commands"]) == 1
        assert "conductor" in report["commands"][0]["roles"]
    finally:
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)


def interrupted_tasks(nats_url: str, prefix: str) -> list[str]:
    """The tasks of the log whose ids start with ``prefix`` that Ctrl-C cancelled."""

    async def read() -> list[str]:
        nc = await connect(nats_url, "reader")
        found = []
        async for _, event in EventLog(nc).read():
            if (
                isinstance(event, TaskCancelled)
                and event.task_id.startswith(prefix)
                and event.reason == INTERRUPTED
            ):
                found.append(event.task_id)
        await nc.close()
        return found

    return asyncio.run(read())


def test_a_bench_resumed_after_ctrl_c_redoes_what_it_cut_off_and_reports_as_if_never_cut(
    tmp_path: Path, private_nats: str
) -> None:
    """Ctrl-C cancels the candidates in flight; the same command again submits them anew
    and its report is the one of a run never interrupted (before: they stayed cancelled,
    and their problem's line said so)."""
    script = yaml.safe_load(evolve_script(tmp_path).read_text())
    for entry in script["coder"]:  # every coder answer a while away: Ctrl-C lands mid-call
        for choice in entry["choices"]:
            choice["latency_s"] = 1.5
    slow = tmp_path / "slow_evolve.yaml"
    slow.write_text(yaml.safe_dump(script))
    env = cli_env(KF_ACK_WAIT="1")
    common = [
        "bench", str(EXAMPLES / "tasks" / "relu.py"), "--strategy", "evolve",
        "--islands", "2", "--samples", "1", "--generations", "2", "--seed", "7",
        "--workflow", "coder_only", "--llm", f"scripted:{slow}",
        *as_user("daemon", private_nats), "--json",
    ]  # fmt: skip
    whole = run_cli(*common, "--run", "whole", env=env)
    assert whole.returncode == 0, whole.stderr

    first = bench_process([*common, "--run", "cut"], env, tmp_path / "first.out")
    deadline = time.monotonic() + 120
    while not [c for c in search_of(private_nats, "cut-relu").candidates.values() if c.llm_calls]:
        assert first.poll() is None and time.monotonic() < deadline, (
            tmp_path / "first.out"
        ).read_text()
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it
    assert first.wait(timeout=60) == 130, (tmp_path / "first.out").read_text()
    cut = interrupted_tasks(private_nats, "cut-relu-")
    assert cut, (tmp_path / "first.out").read_text()  # a candidate was cut off mid-run

    resumed = run_cli(*common, "--run", "cut", env=env)
    assert resumed.returncode == 0, resumed.stderr
    report, whole_report = json.loads(resumed.stdout), json.loads(whole.stdout)
    for key in ("fast_p", "solved", "correctness", "problem_count"):
        assert report[key] == whole_report[key], key
    assert named_alike(report["problems"], "cut") == named_alike(whole_report["problems"], "whole")
    assert all(p["candidates"] == 4 for p in report["problems"])

    def lineage(run: str) -> str:
        return named_alike(search_of(private_nats, f"{run}-relu").lineage(), run)

    assert lineage("cut") == lineage("whole")
    assert "cancelled" not in lineage("cut")


def named_alike(data: object, run: str) -> str:
    """``data`` as JSON, the run's name left out and a redone candidate's task id read as
    its first's (``<search>-r<attempt>-<n>`` as ``<search>-<n>``)."""
    text = re.sub(r"-r\d+(-\d+)", r"\1", json.dumps(data, sort_keys=True))
    return text.replace(f"{run}-relu", "RUN-relu")


def on_a_terminal(*args: str, env: dict[str, str], out: Path) -> tuple[int, str]:
    """Run the CLI with its stderr on a terminal (a pseudo-terminal), as a user sees it;
    stdout goes to ``out``. The exit status and all stderr said."""
    master, slave = pty.openpty()
    with out.open("wb") as stdout:
        process = subprocess.Popen(
            [*KERNELFLOW, *args], cwd=REPO, env=env, stdout=stdout, stderr=slave
        )
    os.close(slave)
    said = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the terminal's other end closed: the command is over
            break
        if not chunk:
            break
        said += chunk
    os.close(master)
    return process.wait(timeout=120), said.decode()


def ticks(said: str, label: str) -> set[int]:
    """The elapsed seconds a terminal's status line showed while waiting on ``label``."""
    return {int(s) for s in re.findall(re.escape(label) + r"… (\d+)s", said)}


def test_a_run_says_what_it_prepares_and_its_line_ticks_while_a_step_works(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    env = cli_env(KF_DATA_DIR=str(data))
    slow = slow_script(tmp_path, 5, "coder")  # each coder answer five seconds away
    args = ["run", str(EXAMPLES / "tasks" / "relu.py"), "--llm", f"scripted:{slow}"]
    code, said = on_a_terminal(*args, "--out", str(tmp_path / "o"), env=env, out=tmp_path / "1")
    assert code == 0, said
    # A fresh data dir: what the first seconds go to is said, not silent.
    assert f"starting the embedded NATS server (first use of {data})… 0s" in said
    assert "checking that the task's reference runs here… " in said
    # While the coder's call takes five seconds, the line counts them.
    assert len(ticks(said, "step 2: coder at work") - {0}) >= 2, said
    # The status line is the terminal's only: stdout holds the run's own lines.
    printed = (tmp_path / "1").read_text()
    assert "\x1b" not in printed and "status:   success" in printed


def test_a_benchs_progress_line_ticks_while_no_candidate_ends(tmp_path: Path) -> None:
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    slow = slow_script(tmp_path, 5, "coder")
    args = [
        "bench", str(EXAMPLES / "tasks" / "relu.py"), "--samples", "1",
        "--workflow", "coder_only", "--llm", f"scripted:{slow}",
    ]  # fmt: skip
    code, said = on_a_terminal(*args, env=env, out=tmp_path / "report")
    assert code == 0, said
    waiting = re.findall(r"0/1 searched, 0 solved; 0 candidates done, 1 running, (\d+)s", said)
    assert len(set(waiting)) >= 3, said  # redrawn every second, not only at an event


def test_verify_says_it_builds_a_cpp_extension_once_and_not_when_built(tmp_path: Path) -> None:
    """A first C++ build takes a minute, which ``verify`` says as it begins; the same
    source checked again is found built, and nothing is said."""
    env = cli_env(
        KF_DATA_DIR=str(tmp_path / "data"),
        KF_EXTENSION_CACHE=str(tmp_path / "extensions"),  # nothing built yet
        KF_VERIFY_THREADS="1",
    )
    args = (
        "verify", "--backend", "cpp", "--trials", "1",
        "--task", str(EXAMPLES / "kernelbench" / "level1" / "12_tanh_gelu.py"),
        "--candidate", str(EXAMPLES / "candidates" / "cpp" / "tanh_gelu_scalar.py"),
    )  # fmt: skip
    first = run_cli(*args, env=env, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.stderr.startswith(
        "kernelflow verify: building the extension tanh_gelu_scalar (the first build here: 30 to "
        "60 s of compiling torch's headers; a source built once is not built again)…\n"
    ), first.stderr
    again = run_cli(*args, env=env, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "building" not in again.stderr


def test_a_task_of_the_python_api_leaves_others_queued_tasks_to_their_daemon(
    tmp_path: Path,
) -> None:
    """``Task`` hosts a daemon for its own task only: a submit left in the store (for
    another model, say) is said once and stays queued; ``serve_others=True`` does it."""
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"), KF_LLM=f"scripted:{RELU_SCRIPT}")
    relu = str(EXAMPLES / "tasks" / "relu.py")
    assert run_cli("submit", relu, "--task-id", "earlier", env=env).returncode == 0
    program = (
        "import sys\nfrom kernelflow import Task\n"
        f"task = Task(op_name='relu', task_desc=open({relu!r}).read(), "
        "serve_others=sys.argv[1] == 'yes')\n"
        "print(task.run_sync().success)\n"
    )
    # Given back as the first stops, the submit is taken again some seconds later
    # (actors/daemon.py): the second's own task takes longer than that.
    slow = f"scripted:{slow_script(tmp_path, 10, 'designer')}"
    for serve_others, note, llm in (
        ("no", "note: task earlier (conductor) waits in the queue", env["KF_LLM"]),
        ("yes", "note: Task relu's daemon also works on task earlier (conductor)", slow),
    ):
        ran = subprocess.run(
            [sys.executable, "-c", program, serve_others],
            capture_output=True, text=True, env=env | {"KF_LLM": llm}, cwd=REPO, timeout=240,
        )  # fmt: skip
        assert (ran.returncode, ran.stdout) == (0, "True\n"), ran.stderr
        assert [line for line in ran.stderr.splitlines() if line.startswith(note)], ran.stderr
        status = run_cli("status", "earlier", env=env)
        # Left alone: still a submit in the queue (exit 3); served: a task in the log.
        assert status.returncode == (3 if serve_others == "no" else 0), status.stderr
