"""The files in deploy/ do what they say: the nats-server configuration lets in only the
users its documented steps add, and carries the events kernelflow writes; its roles are
kernelflow's; and the systemd unit, with the example environment, starts a daemon that a
stop (the unit's signal, within its timeout) shuts down cleanly, mid-task, leaving the task
to the next daemon with nothing lost or repeated."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.connection import ClientAuth, NatsAccessRefused
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import AgentDispatched, Event, LLMCalled, TaskSubmitted
from kernelflow.projections.task_state import fold
from tests.conftest import EXAMPLES, KERNELFLOW, REPO, cli_env, creds, run_cli
from tests.daemons import (
    assert_each_step_once,
    submit,
    task_events,
    wait_for,
    wait_until_over,
)

DEPLOY = REPO / "deploy"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replaced(text: str, old: str, new: str) -> str:
    assert old in text, f"deploy file no longer holds {old!r}: update this test"
    return text.replace(old, new)


def test_the_nats_configuration_lets_in_its_users_and_carries_events_of_megabytes(
    tmp_path: Path,
) -> None:
    nats_server = Path(sys.executable).parent / "nats-server"
    # The configuration on ports and a store of this test's own.
    port = free_port()
    text = (DEPLOY / "nats-server.conf").read_text()
    text = replaced(text, "listen: 127.0.0.1:4222", f"listen: 127.0.0.1:{port}")
    text = replaced(text, "http: 127.0.0.1:8222", f"http: 127.0.0.1:{free_port()}")
    text = replaced(text, '"/var/lib/kernelflow/nats"', json.dumps(str(tmp_path / "store")))
    conf = tmp_path / "nats-server.conf"
    conf.write_text(text)

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [nats_server, "-t", "-c", conf], capture_output=True, text=True, timeout=30
        )

    refused = check()  # no users yet: the server does not start
    assert refused.returncode != 0 and "nats-users.conf" in refused.stderr, refused.stderr
    # The steps its header gives: a key per user, added to the users file.
    for role in ("daemon", "publisher"):
        added = run_cli(
            "creds", role, "--new", "--out", str(tmp_path / f"{role}.nk"),
            "--users-file", str(tmp_path / "nats-users.conf"),
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
    # Permissions that are not this kernelflow's (an older one's, or edited by hand) are
    # rewritten as it requires; the users stay.
    users = tmp_path / "nats-users.conf"
    users.write_text(users.read_text().replace('"publish": [', '"publish": [">", '))
    rewritten = run_cli("creds", "--users-file", str(users))
    assert rewritten.returncode == 0 and "2 user(s)" in rewritten.stdout, rewritten.stderr
    assert '"publish": [">"' not in users.read_text()
    checked = check()
    assert checked.returncode == 0, checked.stderr
    with subprocess.Popen([nats_server, "-c", conf], stderr=subprocess.DEVNULL) as server:
        try:
            event = TaskSubmitted(
                task_id="big",
                task_name="big",
                task_source="import torch\n" + "# a long reference model\n" * 120_000,
                workflow_name="default",
                workflow_yaml="",
                backend="triton",
                group_id="big",
            )
            daemon = ClientAuth(creds=tmp_path / "daemon.nk")
            (stored,) = append_and_read(port, event, daemon)
            assert isinstance(stored, TaskSubmitted) and stored.task_source == event.task_source
            assert len(event.task_source) > 2_000_000
            # Anyone else is refused; a publisher may not append.
            for auth, refusal in [
                (ClientAuth(), "refused no credentials"),
                (ClientAuth(creds=tmp_path / "publisher.nk"), "permissions violation"),
            ]:
                with pytest.raises(NatsAccessRefused, match=refusal):
                    append_and_read(port, event, auth)
        finally:
            server.terminate()
            assert server.wait(timeout=30) == 0


def append_and_read(port: int, event: TaskSubmitted, auth: ClientAuth) -> list[Event]:
    """Append ``event`` and read its task back, as a client presenting ``auth``."""
    deadline = time.monotonic() + 30
    while True:  # the server is starting
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "nats-server did not start with this configuration"
            time.sleep(0.1)
    bridge = Bridge(f"nats://127.0.0.1:{port}", auth=auth).start(timeout_s=10)
    try:
        bridge.call(bridge.log.append(TaskHistory(event.task_id), [event]))
        return list(bridge.call(bridge.log.read_task(event.task_id)).events)
    finally:
        bridge.stop()


def unit_service(path: Path) -> dict[str, str]:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read_string(path.read_text())
    return dict(unit["Service"])


def environment_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines())
    return {kv[0]: kv[1] for kv in pairs if len(kv) == 2 and not kv[0].startswith("#")}


def exec_start(line: str, env: dict[str, str]) -> list[str]:
    """systemd's expansion of an ExecStart line: a word ``$NAME`` becomes the variable's
    value split at whitespace, ``${NAME}`` its value as it is."""
    words: list[str] = []
    for word in shlex.split(line):
        if re.fullmatch(r"\$\w+", word):
            words += env.get(word[1:], "").split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def test_the_daemon_unit_stops_mid_task_within_its_timeout_and_the_next_daemon_finishes(
    private_nats: str, tmp_path: Path
) -> None:
    service = unit_service(DEPLOY / "kernelflow-daemon@.service")
    example = environment_file(DEPLOY / "kernelflow.env")
    argv = exec_start(service["ExecStart"], example)
    assert argv[:2] == ["/opt/kernelflow/bin/kernelflow", "daemon"], argv
    stop_signal = signal.Signals[service["KillSignal"]]
    stop_timeout_s = float(service["TimeoutStopSec"])

    # A coder that takes a while to answer, so that the stop comes while it thinks.
    script = yaml.safe_load((EXAMPLES / "scripted" / "relu.yaml").read_text())
    for entry in script["coder"]:
        entry["latency_s"] = 4.0
    (tmp_path / "slow.yaml").write_text(yaml.safe_dump(script))
    # The example environment, but this test's NATS and a scripted LLM (no API key here);
    # HOME and the working directory as the unit sets them. The credentials: a daemon key
    # this server knows (what `kernelflow creds daemon --new --users-file …` gives one).
    here = {
        "KF_NATS_URL": private_nats,
        "KF_NATS_CREDS": str(creds(private_nats, "daemon")),
        "KF_LLM": f"scripted:{tmp_path / 'slow.yaml'}",
        "HOME": str(tmp_path),
    }
    env = cli_env(**{**example, **here})
    log = tmp_path / "daemon.log"

    def start() -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                [*KERNELFLOW, *argv[1:]], cwd=tmp_path, env=env, stdout=out, stderr=out
            )

    daemon = start()
    try:
        deadline = time.monotonic() + 60
        while b"kernelflow daemon on" not in log.read_bytes():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        health = run_cli("health", "--json", "--min-daemons", "1", env=env)
        assert health.returncode == 0, health.stdout + health.stderr + log.read_text()
        (answer,) = json.loads(health.stdout)["daemons"]
        assert answer["pools"]["coder"] == 8  # from KF_DAEMON_ARGS

        submit(private_nats, "deploy-stop")
        coding = wait_for(
            private_nats,
            "deploy-stop",
            lambda events: any(
                isinstance(e, AgentDispatched) and e.agent == "coder" for e in events
            ),
            timeout_s=60,
        )
        time.sleep(1.5)  # inside the coder's LLM call (delivered in ms, answered in 4 s)
        daemon.send_signal(stop_signal)
        assert daemon.wait(timeout=stop_timeout_s) == 0, log.read_text()
    finally:
        if daemon.poll() is None:
            daemon.kill()
    # The stop let the coder finish its call and record it; the task is still open.
    after_stop = task_events(private_nats, "deploy-stop")
    assert any(isinstance(e, LLMCalled) and e.agent == "coder" for e in after_stop[len(coding) :])
    assert fold("deploy-stop", after_stop).terminal is None, "the stop must come mid-task"

    successor = start()
    try:
        events = wait_until_over(private_nats, "deploy-stop")
    finally:
        successor.send_signal(stop_signal)
        assert successor.wait(timeout=stop_timeout_s) == 0, log.read_text()
    state = fold("deploy-stop", events)
    assert state.finished is not None and state.finished.status == "success"
    assert events[: len(after_stop)] == after_stop
    assert_each_step_once(events)  # the call the stop came during was not made again
