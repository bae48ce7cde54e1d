"""End to end, as a user runs it: the real CLI, the embedded nats-server, the real
verifier running interpreted Triton, and the trajectory replayed from the log."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.actors.bridge import Bridge, NatsUnreachable
from kernelflow.actors.daemon import Daemon, DaemonConfig
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import Event, SubmitTask, TaskRejected
from kernelflow.host.nats_server import find_nats_server
from kernelflow.host.runtime import follow_task
from kernelflow.llm.scripted import ScriptedProvider
from kernelflow.projections.task_state import fold
from kernelflow.verification.engine import VerifierConfig
from tests.conftest import EXAMPLES, KERNELFLOW, REPO, as_user, cli_env, connect, role_auth, run_cli
from tests.daemons import wait_for_line

NOWHERE = "nats://127.0.0.1:9"  # nothing listens there
EXAMPLE_NAMES = ["relu", "row_softmax", "sum_rows"]


@pytest.mark.parametrize("example", EXAMPLE_NAMES)
def test_example_succeeds_after_one_failed_attempt(example: str, tmp_path: Path) -> None:
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    run = run_cli(
        "run",
        f"examples/tasks/{example}.py",
        "--llm",
        f"scripted:examples/scripted/{example}.yaml",
        "--json",
        "--out",
        str(tmp_path / "out"),
        env=env,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["status"] == "success"
    assert result["verifications"] == ["mismatch", "pass"]
    assert result["steps"] == 5
    assert "class ModelNew" in result["final_code"]
    assert Path(result["kernel_path"]).read_text() == result["final_code"]

    replay = run_cli("replay", "--task", result["task_id"], "--json", env=env)
    assert replay.returncode == 0, replay.stderr
    trajectory = json.loads(replay.stdout)
    worked = [s for s in trajectory["steps"] if s["step_type"] in ("action", "action_result")]
    assert [s["tool_name"] or s["metadata"]["agent"] for s in worked] == [
        "designer",
        "coder",
        "verifier",
        "coder",
        "verifier",
    ]
    assert [s["is_correct"] for s in worked if s["step_type"] == "action_result"] == [False, True]
    assert trajectory["is_completed"] and trajectory["metadata"]["status"] == "success"
    # What the run wrote at the time is what the log replays later.
    assert trajectory == json.loads(Path(result["trajectory_path"]).read_text())

    text = run_cli("replay", "--task", result["task_id"], env=env)
    assert "final_answer" in text.stdout and "✗" in text.stdout and "✓" in text.stdout

    # `status TASK_ID` shows the kernel it ended with, not only with --json.
    status = run_cli("status", result["task_id"], env=env)
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[1:4] == [
        "verifications: mismatch → pass",
        "speedup: not timed",  # Triton runs interpreted on this CPU
        f"final code ({len(result['final_code'].splitlines())} lines):",
    ]
    assert status.stdout.endswith(result["final_code"].rstrip() + "\n")


def test_task_file_that_is_not_python_is_refused_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "broken_task.py"
    bad.write_text("import torch\ndef get_inputs(:\n")
    data = tmp_path / "data"
    run = run_cli(
        "run", str(bad), "--llm", "scripted:examples/scripted/relu.yaml", "--task-id", "bad-1",
        "--json", "--out", str(tmp_path / "out"), env=cli_env(KF_DATA_DIR=str(data)),
    )  # fmt: skip
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        f"kernelflow: task file {bad}: not valid Python (invalid syntax at line 2, column 16: "
        "'def get_inputs(:')\n"
    )
    # Nothing started, nothing written: no server's store, no trajectory.
    assert not data.exists() and not (tmp_path / "out").exists()


def test_task_file_missing_pieces_names_them(tmp_path: Path) -> None:
    task = tmp_path / "incomplete.py"
    task.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    for command in (["run", "--json", "--llm", "scripted:examples/scripted/relu.yaml"], ["submit"]):
        run = run_cli(*command, str(task), env=env)
        assert (run.returncode, run.stdout) == (2, ""), run.stderr
        [line] = run.stderr.splitlines()
        assert "incomplete" in line and "get_inputs" in line and "get_init_inputs" in line


def test_unknown_workflow_lists_the_available_ones(tmp_path: Path) -> None:
    run = run_cli(
        "run",
        "examples/tasks/relu.py",
        "--workflow",
        "fastest",
        "--llm",
        "scripted:examples/scripted/relu.yaml",
        env=cli_env(KF_DATA_DIR=str(tmp_path)),
    )
    assert run.returncode == 2
    assert "fastest" in run.stderr
    for name in ("default", "coder_only", "conductor_connect_all", "verifier_only"):
        assert name in run.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["run", "no/such/task.py", "--llm", "scripted:examples/scripted/relu.yaml"],
            "no/such/task.py",
        ),
        (["run", "examples/tasks/relu.py", "--llm", "scripted:missing.yaml"], "missing.yaml"),
        (["run", "examples/tasks/relu.py", "--llm", "telepathy:x"], "telepathy"),
        (["run", "examples/tasks/relu.py"], "--llm"),
        # Refused before anything is published: no server needed, none reached.
        (["submit", "README.md", "--nats-url", NOWHERE], "not valid Python"),
        (
            ["submit", "examples/tasks/relu.py", "--workflow", "x", "--nats-url", NOWHERE],
            "unknown workflow",
        ),
        (["cancel", "t1", "--timeout", "0", "--nats-url", NOWHERE], "--timeout 0"),
        (["connection", "--role", "reader", "--nats-url", NOWHERE], "with a URL, use --creds"),
    ],
)
def test_bad_invocations_say_what_is_wrong(args: list[str], message: str, tmp_path: Path) -> None:
    run = run_cli(*args, env=cli_env(KF_DATA_DIR=str(tmp_path)))
    assert run.returncode == 2
    assert message in run.stderr
    assert "Traceback" not in run.stderr


def test_a_nats_server_without_jetstream_is_named(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    core_only = subprocess.Popen(
        [find_nats_server(), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run = run_cli("report", "--nats-url", f"nats://127.0.0.1:{port}")
    finally:
        core_only.terminate()
        core_only.wait(30)
    assert run.returncode == 1
    assert "JetStream is not available on this NATS server" in run.stderr
    assert "Traceback" not in run.stderr


def test_output_into_a_closed_pipe_ends_quietly() -> None:
    """``kernelflow schema | head -c 10``: the reader goes away, the command stops with
    SIGPIPE's status and no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        run = subprocess.run(
            [*KERNELFLOW, "schema", "--events"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            cwd=REPO,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert run.returncode == 141
    assert run.stderr == ""


def test_tasks_no_daemon_takes_are_explained_and_said_to_wait(private_nats: str) -> None:
    """With no daemon: ``submit --wait`` says why nothing moves (once for all its samples),
    ``status`` says a task not in the log may be queued, and ``cancel`` gives up when told."""
    unknown = run_cli("status", "queued-1", *as_user("publisher", private_nats))
    assert unknown.returncode == 2
    assert unknown.stderr == (
        "kernelflow: no task queued-1: not in the log, and no submit waits in the queue\n"
    )

    run = run_cli(
        "submit", "examples/tasks/relu.py", "--samples", "2", "--task-id", "queued", "--wait",
        "--timeout", "8", *as_user("publisher", private_nats),
    )  # fmt: skip
    assert run.returncode == 3  # still waited until --timeout: a daemon may start meanwhile
    assert [line for line in run.stderr.splitlines() if "not taken" in line] == [
        "kernelflow: tasks queued-1, queued-2 not taken after 5s: no daemon answered. It waits "
        "in the queue until one does (start one: kernelflow daemon); still waiting…"
    ]
    assert run.stderr.endswith("kernelflow: tasks queued-1, queued-2 did not finish within 8s\n")
    assert "Traceback" not in run.stderr

    queued = run_cli("status", "queued-2", *as_user("publisher", private_nats))
    assert queued.returncode == 3, queued.stderr
    assert queued.stderr == (
        "kernelflow: task queued-2 is not in the log yet: 2 submit(s) wait in the queue for a "
        "conductor (no daemon answered); if it is one of them, it starts when a daemon takes it\n"
    )

    started = time.monotonic()
    run_cli("cancel", "--help")  # what starting the command costs on this machine right now
    startup = time.monotonic() - started
    started = time.monotonic()
    cancel = run_cli("cancel", "queued-1", "--timeout", "2", *as_user("publisher", private_nats))
    assert cancel.returncode == 3
    assert cancel.stderr == (
        "kernelflow: cancel of queued-1 queued: no daemon answered; it applies when a daemon "
        "starts (kernelflow daemon)\n"
    ), cancel
    # Its start and a 1 s look for daemons (the --timeout is not waited out: waiting
    # cannot help), with room for a loaded machine, and short of the 5 s more it once waited.
    assert time.monotonic() - started < startup + 2 + 1 + 3.5


@pytest.fixture
def daemon(nats_url: str):  # type: ignore[no-untyped-def]
    bridge = Bridge(nats_url, auth=role_auth(nats_url, "daemon")).start()
    config = DaemonConfig(
        llm=ScriptedProvider(EXAMPLES / "scripted" / "relu.yaml"),
        verifier=VerifierConfig(timeout_s=120),
        ack_wait_s=5,
    )
    daemon = Daemon(bridge, config).start()
    yield bridge
    daemon.stop()
    bridge.stop()


async def _request(nats_url: str, payload: bytes, subject: str = subjects.SUBMIT) -> dict:  # type: ignore[type-arg]
    """A publisher's command, as a program of one's own sends it; the daemon's answer."""
    nc = await connect(nats_url, "publisher")
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.jetstream().publish(subject, payload, headers={subjects.REPLY_HEADER: inbox})
        msg = await sub.next_msg(timeout=30)
        return json.loads(msg.data)  # type: ignore[no-any-return]
    finally:
        await nc.close()


def _wait_until_over(bridge: Bridge, task_id: str, timeout_s: float = 120):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = fold(task_id, bridge.call(bridge.log.read_task(task_id)).events)
        if state.terminal is not None:
            return state
        time.sleep(0.2)
    raise AssertionError(f"task {task_id} did not finish")


def test_malformed_command_is_answered_and_daemon_keeps_working(
    daemon: Bridge, nats_url: str
) -> None:
    reply = daemon.call(_request(nats_url, b'{"kind": "submit_task", "task_sauce": 1}'))
    assert reply["ok"] is False and "task_source" in reply["error"]

    task_id = f"t-{uuid.uuid4().hex[:12]}"
    command = SubmitTask(
        task_id=task_id,
        task_source=(EXAMPLES / "tasks" / "relu.py").read_text(),
        workflow_name="verifier_only",
        candidate_code="this is not python",
    )
    reply = daemon.call(_request(nats_url, encode(command)))
    assert reply == {"ok": True, "task_id": task_id}
    state = _wait_until_over(daemon, task_id)
    assert state.finished is not None and state.finished.status == "failed"
    assert state.verifications[0].report.verdict == "compile_error"


@pytest.fixture
def embedded_daemon(tmp_path: Path) -> Iterator[dict[str, str]]:
    """``kernelflow daemon`` on the embedded server of a fresh data dir, as a user starts
    it; yields the environment that names that data dir."""
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen(
            [*KERNELFLOW, "daemon", "--llm", "scripted:examples/scripted/relu.yaml"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_line(log, "daemon started")
        yield env
    finally:
        daemon.send_signal(signal.SIGINT)
        daemon.wait(timeout=60)


def test_the_readme_publisher_example_runs_as_written(embedded_daemon: dict[str, str]) -> None:
    """The README's way of publishing a task from one's own program, run as it is printed
    there: its shell line (``kernelflow connection``), then its Python program, against the
    embedded server, which lets in only holders of the data dir's keys."""
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Publishing tasks from your own program", 1)[1]
    shell = section.split("```sh\n", 1)[1].split("```", 1)[0]
    example = section.split("```python\n", 1)[1].split("```", 1)[0]
    bin_dir = str(Path(sys.executable).parent)  # where `kernelflow` and `python` are
    env = embedded_daemon | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "EXAMPLE": example}
    run = subprocess.run(
        ["bash", "-ec", shell + 'python -c "$EXAMPLE"'],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    answer = json.loads(ast.literal_eval(run.stdout.strip()))
    assert answer == {"ok": True, "task_id": "my-relu-1"}

    deadline = time.monotonic() + 120
    while True:  # the task is in the log once a conductor took it, and over a little later
        status = run_cli("status", "my-relu-1", "--json", env=embedded_daemon)
        if status.returncode == 0 and json.loads(status.stdout)["status"] != "running":
            break
        assert time.monotonic() < deadline, status.stdout + status.stderr
        time.sleep(0.5)
    assert json.loads(status.stdout)["status"] == "success"

    # What the shell line set: the publisher's key, the only one the program was given.
    connection = run_cli("connection", "--json", env=embedded_daemon)
    publisher = Path(embedded_daemon["KF_DATA_DIR"]) / "nats" / "auth" / "publisher.nk"
    assert json.loads(connection.stdout)["creds"] == str(publisher)


def test_connection_without_a_running_server_says_so(tmp_path: Path) -> None:
    run = run_cli("connection", env=cli_env(KF_DATA_DIR=str(tmp_path)))
    assert run.returncode == 1
    assert run.stderr.startswith("kernelflow: no embedded NATS server runs for the data dir")
    assert len(run.stderr.splitlines()) == 1 and run.stdout == ""


def test_samples_are_followed_side_by_side_and_summed_up(daemon: Bridge, nats_url: str) -> None:
    task_id = f"s-{uuid.uuid4().hex[:8]}"
    run = run_cli(
        "submit", "examples/tasks/relu.py", "--samples", "2", "--task-id", task_id, "--wait",
        "--group", f"g-{task_id}", "--timeout", "120", *as_user("publisher", nats_url),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ids = [f"{task_id}-1", f"{task_id}-2"]
    lines = run.stdout.splitlines()
    assert lines[:2] == ids
    blank = lines.index("")
    followed = lines[2:blank]
    for sample in ids:  # every line says whose it is, and each sample ran to its end
        assert f"[{sample}] finished: success — verification passed" in followed
    assert all(line.startswith((f"[{ids[0]}] ", f"[{ids[1]}] ")) for line in followed)
    assert [line.split() for line in lines[blank + 1 :]] == [
        ["task", "status", "steps", "verifications", "reason"],
        *(
            [sample, "success", "5", "mismatch", "→", "pass", "verification", "passed"]
            for sample in ids
        ),
        ["group", f"g-{task_id}:", "2", "of", "2", "samples", "succeeded"],
    ]


def test_resubmitting_a_task_id_is_a_no_op(daemon: Bridge, nats_url: str) -> None:
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    command = SubmitTask(task_id=task_id, task_source="import torch\n", workflow_name="default")
    first = daemon.call(_request(nats_url, encode(command)))
    second = daemon.call(_request(nats_url, encode(command)))
    assert first["ok"] is False  # rejected: no Model / get_inputs
    assert second.get("duplicate") is True
    assert len(daemon.call(daemon.log.read_task(task_id)).events) == 1


def test_unreachable_nats_is_a_clear_error_not_a_hang(caplog: pytest.LogCaptureFixture) -> None:
    # A short wait (a command's): one error that says why, nothing logged before it.
    started = time.monotonic()
    with pytest.raises(NatsUnreachable) as raised:
        Bridge("nats://kf:hunter2@127.0.0.1:9").start(timeout_s=2)
    assert time.monotonic() - started < 10
    assert str(raised.value) == (
        "no NATS server answered at nats://127.0.0.1:9 within 2s (connection refused)"
    )
    assert not [r for r in caplog.records if r.name == "kernelflow.bridge"]
    # A long one (a daemon's): the client retries every 0.5 s; the same failure is logged
    # once, not per attempt, saying for how long it is tried, without the URL's credentials.
    with pytest.raises(NatsUnreachable):
        Bridge("nats://kf:hunter2@127.0.0.1:9").start(timeout_s=7)
    failures = [r.getMessage() for r in caplog.records if r.name == "kernelflow.bridge"]
    assert failures == [
        "no NATS server at nats://127.0.0.1:9 yet (connection refused); trying for 7s"
    ]


def _following(bridge: Bridge, subject: str) -> list[str]:
    """The bridge's subscriptions to ``subject``: a following read wakes on one."""

    async def subscribed() -> list[str]:
        return [sub.subject for sub in bridge._nc._subs.values() if sub.subject == subject]

    return bridge.call(subscribed())


def test_following_a_task_leaves_no_reader_behind(nats_url: str) -> None:
    """``submit --wait`` and ``run`` follow a task woken by a subscription to its events: it
    is gone when the follow returns, not whenever the garbage collector gets to it."""
    bridge = Bridge(nats_url, auth=role_auth(nats_url, "daemon")).start()  # it appends
    try:
        task_id = f"t-{uuid.uuid4().hex[:12]}"
        bridge.call(
            bridge.log.append(TaskHistory(task_id), [TaskRejected(task_id=task_id, reason="no")])
        )
        following_at_the_end: list[list[str]] = []

        def on_event(event: Event) -> None:
            assert isinstance(event, TaskRejected)
            following_at_the_end.append(_following(bridge, subjects.task_events(task_id)))

        state = follow_task(bridge, task_id, on_event, timeout_s=30)
        assert isinstance(state.terminal, TaskRejected)
        assert following_at_the_end == [[]]
    finally:
        bridge.stop()


def test_stopping_the_bridge_ends_what_still_runs_on_its_loop(nats_url: str) -> None:
    """A read nobody waits for any more (a follow given up on) is cancelled and cleaned up
    by ``stop``: nothing is left pending to be reported as destroyed at exit."""
    bridge = Bridge(nats_url, auth=role_auth(nats_url, "reader")).start()

    async def follow_forever() -> None:
        async for _ in bridge.log.read(subject=subjects.task_events("nobody"), follow=True):
            pass

    reading = bridge.spawn(follow_forever())
    deadline = time.monotonic() + 10
    while not _following(bridge, subjects.task_events("nobody")):
        assert time.monotonic() < deadline, "the read never started"
        time.sleep(0.05)
    bridge.stop()
    assert reading.cancelled()
    assert [t for t in asyncio.all_tasks(bridge.loop) if not t.done()] == []
