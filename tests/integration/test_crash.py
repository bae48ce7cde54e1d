"""Fault tests: a daemon killed with SIGKILL mid-task is replaced, and the task completes
with every step exactly once in the log."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kernelflow.cli.commands.run import read_back
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import AgentDispatched, Event, TaskFinished
from kernelflow.events.replies import TIMEOUT_S as REQUEST_TIMEOUT_S
from kernelflow.host.runtime import connected
from kernelflow.host.settings import Settings
from kernelflow.projections.rewards import pending_reward_events
from kernelflow.projections.task_state import fold
from kernelflow.sandbox.workdirs import remove_abandoned_workdirs
from tests.conftest import KERNELFLOW, REPO, alive, cli_env, creds, keyed_nats_server, run_cli
from tests.daemons import (
    RELU_SCRIPT,
    assert_each_step_once,
    slow_script,
    start_daemon,
    submit,
    submitted_on_default,
    task_events,
    wait_for,
    wait_for_line,
    wait_until_over,
)


@pytest.fixture
def slowed(tmp_path: Path) -> Path:
    """The relu script with a model latency, so a kill lands in the middle of a call."""
    return slow_script(tmp_path, 1.5)


def _all_threads_stopped(pid: int) -> bool:
    states = [
        (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        for task in Path(f"/proc/{pid}/task").iterdir()
    ]
    return all(state in ("T", "t") for state in states)


def _wait_until_untouched(path: Path, quiet_s: float = 1.0, within_s: float = 30) -> None:
    """Wait until nothing in the tree at ``path`` has changed for ``quiet_s``: a killed
    daemon's sandboxes die a moment after it (each with its parent) and may still write
    their work dir meanwhile, which makes it look fresh again."""

    def last_change() -> float:
        times = [path.stat().st_mtime]
        for entry in path.rglob("*"):
            with contextlib.suppress(OSError):  # removed meanwhile
                times.append(entry.lstat().st_mtime)
        return max(times)

    deadline = time.monotonic() + within_s
    seen, since = last_change(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.1)
        if (now := last_change()) != seen:
            seen, since = now, time.monotonic()


@pytest.mark.parametrize("agent", ["coder", "verifier"], ids=["mid-LLM-call", "mid-verification"])
def test_killed_daemon_is_replaced_and_task_completes(
    agent: str, private_nats: str, slowed: Path, tmp_path: Path
) -> None:
    task_id = f"crash-{agent}"
    log = tmp_path / "daemon.log"
    temp = tmp_path / "temp"  # the daemons' temp dir, where verifications work
    temp.mkdir()
    first = start_daemon(private_nats, log, script=slowed, KF_ACK_WAIT="2", TMPDIR=str(temp))
    try:
        submit(private_nats, task_id)

        def agent_busy(events: list[Event]) -> bool:
            return any(isinstance(e, AgentDispatched) and e.agent == agent for e in events)

        wait_for(private_nats, task_id, agent_busy, timeout_s=60)
        if agent == "verifier":  # past its warm-up, into the check (a fraction of a second)
            deadline = time.monotonic() + 60
            while not list(temp.glob("kf-verify-*/job.json")):
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.01)
        else:
            time.sleep(0.5)  # inside the LLM call
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    before = task_events(private_nats, task_id)
    assert fold(task_id, before).terminal is None, "the kill must land mid-task"
    # A verification killed with its daemon leaves its work dir; the next daemon removes it
    # once it is clearly abandoned (a minute old: made to look so here).
    left = list(temp.glob("kf-verify-*"))
    assert len(left) == (agent == "verifier")
    for path in left:
        _wait_until_untouched(path)
        os.utime(path, (time.time() - 120, time.time() - 120))

    second = start_daemon(private_nats, log, script=slowed, KF_ACK_WAIT="2", TMPDIR=str(temp))
    try:
        events = wait_until_over(private_nats, task_id)
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, log.read_text()

    state = fold(task_id, events)
    assert state.finished is not None and state.finished.status == "success"
    assert [v.report.verdict for v in state.verifications][-1] == "pass"
    assert len(state.verifications) == 2
    assert state.history == ["designer", "coder", "verifier", "coder", "verifier"]
    assert events[: len(before)] == before  # history is only ever appended to
    assert_each_step_once(events)
    assert not list(temp.glob("kf-verify-*"))
    assert ("removed 1 sandbox work dir(s) a stopped daemon left" in log.read_text()) == (
        agent == "verifier"
    )


def submit_and_wait_for_the_coder(url: str, task_id: str) -> None:
    """Submit a task and return once its coder is dispatched (inside its slow call)."""
    submit(url, task_id)
    wait_for(
        url,
        task_id,
        lambda events: any(isinstance(e, AgentDispatched) and e.agent == "coder" for e in events),
        timeout_s=60,
    )


def test_a_second_interrupt_stops_a_daemon_at_once(private_nats: str, tmp_path: Path) -> None:
    """The first Ctrl-C lets the actors finish what they hold (up to 30 s); a second one
    does not make the user wait: the daemon exits at once, and its work is left to the
    next daemon, as after a crash."""
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log, script=slow_script(tmp_path, 60))
    try:
        submit_and_wait_for_the_coder(private_nats, "t1")
        daemon.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while "a second Ctrl-C" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        time.sleep(1)
        assert daemon.poll() is None  # still letting the coder finish its call
        interrupted = time.monotonic()
        daemon.send_signal(signal.SIGINT)
        assert daemon.wait(timeout=30) == 130
        assert time.monotonic() - interrupted < 10
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
    assert "Traceback" not in log.read_text()
    assert fold("t1", task_events(private_nats, "t1")).terminal is None  # left to the next


def test_a_stop_that_runs_out_of_time_ends_as_a_second_signal_would(
    private_nats: str, tmp_path: Path
) -> None:
    """One SIGTERM, as systemd sends, and actors holding more than the stop may take: the
    daemon stops at its deadline, saying so, instead of being SIGKILLed by the unit."""
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log, script=slow_script(tmp_path, 60), KF_STOP_DEADLINE="3")
    try:
        submit_and_wait_for_the_coder(private_nats, "t1")
        asked = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=30) == 130, log.read_text()
        assert 3 <= time.monotonic() - asked < 10, log.read_text()
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
    text = log.read_text()
    assert "(up to 3s; the whole stop up to 3s)" in text
    assert "the stop did not finish within 3s (KF_STOP_DEADLINE): stopping at once" in text
    assert "Traceback" not in text
    assert fold("t1", task_events(private_nats, "t1")).terminal is None  # left to the next


def test_a_daemon_whose_nats_is_gone_stops_at_once(tmp_path: Path) -> None:
    """With its server gone there is nothing a daemon can save or tell NATS on the way
    out: Ctrl-C ends it at once, not after its read model's requests time out."""
    stack = contextlib.ExitStack()
    server = stack.enter_context(keyed_nats_server(tmp_path / "nats"))
    url = server.url
    log = tmp_path / "daemon.log"
    daemon = start_daemon(url, log)
    try:
        wait_for_line(log, "warm-up done")  # a stop waits for a warm-up under way
        os.kill(server.pid or 0, signal.SIGKILL)
        server.stop()
        wait_for_line(log, "reconnecting")
        interrupted = time.monotonic()
        daemon.send_signal(signal.SIGINT)
        assert daemon.wait(timeout=30) == 0, log.read_text()
        # its read model would wait out a 10 s stop timeout (actors/readmodel.py)
        assert time.monotonic() - interrupted < 8, log.read_text()
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
        stack.close()
    assert "Traceback" not in log.read_text()


def test_a_killed_kernelflow_takes_its_embedded_nats_with_it(tmp_path: Path) -> None:
    """SIGKILL runs no clean-up, yet the embedded server must not run on for good: the
    kernel stops it (SIGTERM) with its owner, and the next kernelflow on the same data dir
    starts its own on the same store, where the log still is. The server's runtime dir is
    left unlocked, for the next daemon to remove."""
    data, temp = tmp_path / "data", tmp_path / "temp"
    temp.mkdir()
    log = tmp_path / "daemon.log"
    env = cli_env(KF_DATA_DIR=str(data), TMPDIR=str(temp))
    with log.open("ab") as out:
        daemon = subprocess.Popen(
            [*KERNELFLOW, "daemon", "--llm", f"scripted:{RELU_SCRIPT}"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_line(log, "daemon started")
        server = json.loads((data / "nats" / "server.json").read_text())
        submitted = run_cli("submit", "examples/tasks/relu.py", "--task-id", "kept", env=env)
        assert submitted.returncode == 0, submitted.stderr
        daemon.kill()  # the daemon's process only: the server has a group of its own
        daemon.wait()
        deadline = time.monotonic() + 15
        while alive(server["pid"]):
            assert time.monotonic() < deadline, "the embedded nats-server outlived its owner"
            time.sleep(0.1)
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
    # (A verification or the sandbox probe may have been cut short too: theirs go as well.)
    removed = [Path(p).name for p in remove_abandoned_workdirs(str(temp), 0)]
    assert [name for name in removed if name.startswith("kf-nats-")], removed
    replayed = run_cli("replay", "--task", "kept", "--view", "counters", env=env)
    assert replayed.returncode == 0, replayed.stderr
    assert replayed.stdout.startswith("workflow default: step"), replayed.stdout  # it is there


def test_run_reads_its_finished_task_back_from_a_server_that_answers_late(tmp_path: Path) -> None:
    """The task is over and `run` reads it back to write its outputs: a server that stops
    answering for longer than a request waits (a loaded machine) delays the outputs, it
    does not lose them."""
    with keyed_nats_server(tmp_path / "nats") as server:
        settings = Settings()  # a `run`'s: a daemon's role
        settings.nats_url, settings.data_dir = server.url, tmp_path / "data"
        settings.nats_creds = creds(server.url, "daemon")
        with connected(settings) as bridge:
            submitted = submitted_on_default("late")
            history = bridge.call(bridge.log.append(TaskHistory("late"), [submitted]))
            finished = TaskFinished(task_id="late", status="failed", reason="r", final_code=None)
            rewards = pending_reward_events(fold("late", [submitted, finished]))
            bridge.call(bridge.log.append(history, [finished, *rewards]))  # complete: no wait
            assert server.pid is not None
            pid = server.pid
            os.kill(pid, signal.SIGSTOP)
            while not _all_threads_stopped(pid):  # a busy thread stops a moment later
                time.sleep(0.01)
            resumed = threading.Timer(REQUEST_TIMEOUT_S + 1.5, os.kill, (pid, signal.SIGCONT))
            resumed.start()
            started = time.monotonic()
            try:
                events = read_back(bridge, "late", wait_s=60)
            finally:
                resumed.cancel()
                os.kill(pid, signal.SIGCONT)
            waited = time.monotonic() - started
            assert waited > REQUEST_TIMEOUT_S, waited  # a request did time out
    assert rewards and [e.kind for e in events[:2]] == ["task_submitted", "task_finished"]
    assert [getattr(e, "reward_fn", None) for e in events[2:]] == [r.reward_fn for r in rewards]
