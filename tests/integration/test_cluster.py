"""The 3-node JetStream cluster of deploy/nats-cluster/, as shipped (its users file from
``kernelflow creds``, its route password; only hosts, ports and stores rendered for
loopback), carries kernelflow with KF_REPLICAS=3 through the loss of a node: the event
log's leader, the node the daemon is connected to, is killed mid-run, and every task still
finishes, each step once, nothing acknowledged lost."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest

from kernelflow.actors.connection import ClientAuth
from kernelflow.events import subjects
from kernelflow.events.model import AgentDispatched, Event
from kernelflow.host.nats_server import find_nats_server
from kernelflow.projections.task_state import fold
from tests.conftest import REPO, run_cli
from tests.daemons import (
    assert_each_step_once,
    is_settled_events,
    slow_script,
    start_daemon,
    task_events,
    wait_for_line,
)

CLUSTER = REPO / "deploy" / "nats-cluster"
NODES = (1, 2, 3)
TASKS = 3
EVENTS_INFO = f"$JS.API.STREAM.INFO.{subjects.EVENTS_STREAM}"
Events = dict[str, list[Event]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replaced(text: str, old: str, new: str, count: int = 1) -> str:
    assert text.count(old) == count, f"{old!r} is no longer in the shipped config: update this"
    return text.replace(old, new)


@dataclass
class Node:
    name: str
    url: str
    monitor: str
    proc: subprocess.Popen[bytes]


@dataclass
class Cluster:
    nodes: dict[str, Node]
    seed: Path  # a key of the daemon role
    # A user of the test's own, beside kernelflow's: an operator moving a stream's leader.
    operator: dict[str, str]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes.values())

    @property
    def auth(self) -> ClientAuth:
        return ClientAuth(creds=self.seed)

    def alive(self) -> Node:
        return next(n for n in self.nodes.values() if n.proc.poll() is None)


def render(directory: Path, n: int, ports: dict[str, dict[int, int]], password: str) -> Path:
    """Node ``n``'s configuration, from the shipped files: loopback ports and a store of
    this test's own instead of hosts and /var/lib, and a route password of its own."""
    text = (CLUSTER / "cluster.conf").read_text()
    text = replaced(text, "change-me-route-password", password, count=4)
    for other in NODES:
        text = replaced(text, f"@nats-{other}.internal:6222", f"@127.0.0.1:{ports['route'][other]}")
    text = replaced(text, "listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{ports['client'][n]}")
    text = replaced(text, "listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{ports['route'][n]}")
    text = replaced(text, '"/var/lib/kernelflow/nats"', json.dumps(str(directory / "js")))
    text = replaced(text, "http: 127.0.0.1:8222", f"http: 127.0.0.1:{ports['http'][n]}")
    (directory / "cluster.conf").write_text(text)
    config = directory / f"n{n}.conf"
    config.write_text((CLUSTER / f"n{n}.conf").read_text())  # as shipped
    return config


async def _request(url: str, subject: str, body: bytes, **connect: Any) -> dict[str, Any]:
    async def quiet(_: Exception) -> None:
        pass  # a node still starting: the caller tries again

    nc = await nats.connect(url, error_cb=quiet, allow_reconnect=False, **connect)
    try:
        answer: dict[str, Any] = json.loads((await nc.request(subject, body, timeout=2)).data)
        return answer
    finally:
        await nc.close()


def js_api(cluster: Cluster, subject: str, body: bytes = b"", node: Node | None = None) -> Any:
    """A JetStream API request, as a daemon makes it."""
    url = (node or cluster.alive()).url
    return asyncio.run(_request(url, subject, body, **cluster.auth.options()))


def wait_for_jetstream(cluster: Cluster, timeout_s: float = 30) -> None:
    """Every node has joined the cluster and knows its JetStream meta leader."""
    deadline = time.monotonic() + timeout_s
    for node in cluster.nodes.values():
        while True:
            try:
                if "error" not in js_api(cluster, "$JS.API.INFO", node=node):
                    break
            except (OSError, nats.errors.Error):
                pass  # not listening yet
            assert time.monotonic() < deadline, f"{node.name} did not join the cluster"
            time.sleep(0.2)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    seed, users = tmp_path / "daemon.nk", tmp_path / "nats-users.conf"
    made = run_cli("creds", "daemon", "--new", "--out", str(seed), "--users-file", str(users))
    assert made.returncode == 0, made.stderr
    operator = {"user": "operator", "password": secrets.token_hex(16)}
    entry = "  users = [\n"
    users_text = replaced(users.read_text(), entry, f"{entry}    {json.dumps(operator)}\n")
    ports = {kind: {n: free_port() for n in NODES} for kind in ("client", "route", "http")}
    password = secrets.token_hex(16)
    nodes: dict[str, Node] = {}
    try:
        for n in NODES:
            directory = tmp_path / f"n{n}"
            directory.mkdir()
            (directory / "nats-users.conf").write_text(users_text)
            config = render(directory, n, ports, password)
            with (directory / "nats-server.log").open("wb") as log:
                proc = subprocess.Popen(
                    [find_nats_server(), "-c", config], stdout=log, stderr=subprocess.STDOUT
                )
            name = f"kernelflow-{n}"  # server_name, as n{n}.conf sets it
            url, monitor = (
                f"nats://127.0.0.1:{ports['client'][n]}",
                f"http://127.0.0.1:{ports['http'][n]}",
            )
            nodes[name] = Node(name, url, monitor, proc)
        cluster = Cluster(nodes, seed, operator)
        wait_for_jetstream(cluster)
        yield cluster
    finally:
        for node in nodes.values():
            if node.proc.poll() is None:
                node.proc.terminate()
                node.proc.wait(timeout=30)


def daemon_node(cluster: Cluster) -> Node:
    """The node the daemon is connected to (its connection is named ``kernelflow``)."""
    for node in cluster.nodes.values():
        with urllib.request.urlopen(f"{node.monitor}/connz", timeout=5) as answer:
            if any(c.get("name") == "kernelflow" for c in json.load(answer)["connections"]):
                return node
    raise AssertionError("the daemon is connected to no node")


def lead_events_from(cluster: Cluster, node: Node, timeout_s: float = 30) -> None:
    """Make ``node`` the event log's leader (an operator's step-down, naming it)."""
    deadline = time.monotonic() + timeout_s
    preferred = json.dumps({"placement": {"preferred": node.name}}).encode()
    while True:
        try:
            if js_api(cluster, EVENTS_INFO)["cluster"].get("leader") == node.name:
                return
            subject = f"$JS.API.STREAM.LEADER.STEPDOWN.{subjects.EVENTS_STREAM}"
            asyncio.run(_request(node.url, subject, preferred, **cluster.operator))
        except nats.errors.Error:
            pass  # electing: no leader answers for a moment
        assert time.monotonic() < deadline, "the event log's leader did not move"
        time.sleep(1)


def wait_until(
    cluster: Cluster, task_ids: list[str], done: Callable[[Events], bool], timeout_s: float
) -> Events:
    deadline = time.monotonic() + timeout_s
    events: Events = {}
    while True:
        try:
            url = cluster.alive().url
            events = {t: task_events(url, t, cluster.auth) for t in task_ids}
        except nats.errors.Error:
            pass  # the stream is electing a new leader: a read times out meanwhile
        else:
            if done(events):
                return events
        assert time.monotonic() < deadline, [(t, [e.kind for e in ev]) for t, ev in events.items()]
        time.sleep(0.2)


def test_losing_the_event_logs_leader_mid_run_loses_and_repeats_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    # Coders that take a while, so that the kill lands while every task is under way.
    script = slow_script(tmp_path, 1.5)
    daemon = start_daemon(
        cluster.url, log, "--creds", str(cluster.seed), script=script,
        KF_REPLICAS="3", KF_ACK_WAIT="5",
    )  # fmt: skip
    try:
        wait_for_line(log, "kernelflow daemon on")
        info = js_api(cluster, EVENTS_INFO)
        assert info["config"]["num_replicas"] == 3 and len(info["cluster"]["replicas"]) == 2
        # The verifiers' shared extensions, as the streams: made by the daemon, 3 copies.
        shared = js_api(cluster, f"$JS.API.STREAM.INFO.{subjects.EXTENSIONS_STREAM}")
        assert shared["config"]["num_replicas"] == 3, shared
        # The hardest node to lose: the log's leader, and the daemon's own server.
        doomed = daemon_node(cluster)
        lead_events_from(cluster, doomed)
        submitted = run_cli(
            "submit", "examples/tasks/relu.py", "--task-id", "c", "--samples", str(TASKS),
            "--nats-url", cluster.url, "--creds", str(cluster.seed),
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        task_ids = submitted.stdout.split()
        assert len(task_ids) == TASKS

        def all_coding(events: Events) -> bool:
            return all(
                any(isinstance(e, AgentDispatched) and e.agent == "coder" for e in ev)
                for ev in events.values()
            )

        before = wait_until(cluster, task_ids, all_coding, 60)
        assert js_api(cluster, EVENTS_INFO)["cluster"]["leader"] == doomed.name
        doomed.proc.kill()
        doomed.proc.wait()
        assert not any(fold(t, ev).terminal for t, ev in before.items()), "too late a kill"

        def all_settled(events: Events) -> bool:
            return all(is_settled_events(t, ev) for t, ev in events.items())

        after = wait_until(cluster, task_ids, all_settled, 90)
        assert daemon.poll() is None, log.read_text()  # it rode the loss out
        assert "disconnected from NATS" in log.read_text()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=45) == 0, log.read_text()
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
    for task_id, events in after.items():
        state = fold(task_id, events)
        assert state.finished is not None and state.finished.status == "success", task_id
        assert events[: len(before[task_id])] == before[task_id]  # nothing acknowledged lost
        assert_each_step_once(events)
    assert js_api(cluster, EVENTS_INFO)["cluster"]["leader"] != doomed.name
