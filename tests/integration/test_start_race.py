"""A data dir's embedded NATS server when kernelflow processes start at the same moment:
one server per store, whichever process starts it, and the others join it. Two servers
on one store each kept their own view of it: a ``submit --wait`` started with a
``kernelflow daemon`` on a fresh data dir waited forever for a task the daemon ran to
success on the other server (issue #32)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.host.nats_server import (
    EmbeddedNats,
    StoreInUse,
    embedded_nats,
    running_embedded_server,
)
from tests.conftest import KERNELFLOW, REPO, cli_env, run_cli
from tests.daemons import RELU_SCRIPT, wait_for_line


def test_a_second_server_on_one_store_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    first = EmbeddedNats(tmp_path / "nats")
    first.start()
    second = EmbeddedNats(tmp_path / "nats")
    try:
        with pytest.raises(StoreInUse):
            second.start()
        first.stop()
        second.start()
    finally:
        first.stop()
        second.stop()


def test_a_process_that_joined_runs_the_server_on_when_its_starter_ends(tmp_path: Path) -> None:
    """A daemon that joined the server of a ``submit --wait`` carries on after the submit
    ends: the joiner starts a server on the same store and port, where its connection
    reconnects."""
    store = tmp_path / "nats"
    with contextlib.ExitStack() as stack:
        starter = embedded_nats(store)
        url, _ = stack.enter_context(starter)
        owner = json.loads((store / "server.json").read_text())["pid"]
        joined_url, auth = stack.enter_context(embedded_nats(store))
        assert joined_url == url
        bridge = Bridge(url, auth=auth).start()
        stack.callback(bridge.stop)
        starter.__exit__(None, None, None)  # the starter ends first (its exit again: a no-op)

        deadline = time.monotonic() + 20
        while running_embedded_server(store) is None:
            assert time.monotonic() < deadline, "nobody runs the server on"
            time.sleep(0.1)
        assert running_embedded_server(store) == url
        assert json.loads((store / "server.json").read_text())["pid"] != owner
        info = bridge.call(bridge.log.jetstream.account_info(), timeout=20)
        assert info.streams == 2  # the same store: the streams the starter's server made
    assert not (store / "server.json").exists()  # stopped with the joiner


def start_daemon(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [*KERNELFLOW, "daemon", "--llm", f"scripted:{RELU_SCRIPT}"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def submit_and_wait(env: dict[str, str], task_id: str) -> subprocess.Popen[str]:
    args = ("submit", "examples/tasks/relu.py", "--task-id", task_id, "--wait", "--timeout", "120")
    return subprocess.Popen(
        [*KERNELFLOW, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("attempt", [1, 2])
@pytest.mark.parametrize("first", ["daemon", "submit"])
def test_a_daemon_and_a_submit_started_at_once_on_a_fresh_data_dir(
    tmp_path: Path, first: str, attempt: int
) -> None:
    """Whichever process starts the server, the follower sees every event of its task,
    and the daemon outlives the submit (a second task runs)."""
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    log = tmp_path / "daemon.log"
    if first == "daemon":
        daemon = start_daemon(env, log)
        waiting = submit_and_wait(env, "raced")
    else:
        waiting = submit_and_wait(env, "raced")
        daemon = start_daemon(env, log)
    try:
        out, err = waiting.communicate(timeout=180)
        assert waiting.returncode == 0, out + err + log.read_text()
        assert out.splitlines()[-1] == "finished: success — verification passed", out
        assert "not taken" not in err and "Traceback" not in err, err

        again = ("submit", "examples/tasks/relu.py", "--task-id", "later", "--wait")
        later = run_cli(*again, "--timeout", "120", env=env)
        assert later.returncode == 0, later.stdout + later.stderr + log.read_text()
        wait_for_line(log, "daemon started")
        daemon.send_signal(signal.SIGINT)
        assert daemon.wait(timeout=60) == 0, log.read_text()
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
    assert "Traceback" not in log.read_text()
