"""Fault tests: a daemon killed with SIGKILL mid-task is replaced, and the task completes
with every step exactly once in the log."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from events.model import (
    DISPATCH_RESULTS,
    AgentDispatched,
    ConductorDecided,
    Event,
    LLMCalled,
)
from kernelflow.nats_server import EmbeddedNats
from projections.task_state import fold
from tests.conftest import EXAMPLES, KERNELFLOW, REPO, cli_env, run_cli


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[str]:
    # Its own server: the killed daemon leaves unacked work behind on purpose.
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
def slow_script(tmp_path: Path) -> Path:
    """The relu script with a model latency, so a kill lands in the middle of a call."""
    script = yaml.safe_load((EXAMPLES / "scripted" / "relu.yaml").read_text())
    for entry in script["coder"]:
        entry["latency_s"] = 1.5
    path = tmp_path / "slow_relu.yaml"
    path.write_text(yaml.safe_dump(script))
    return path


def start_daemon(url: str, script: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [*KERNELFLOW, "daemon", "--nats-url", url, "--llm", f"scripted:{script}"],
            cwd=REPO,
            env=cli_env(KF_ACK_WAIT="2"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def task_events(url: str, task_id: str) -> list[Event]:
    import asyncio

    import nats

    from events.log import EventLog

    async def read() -> list[Event]:
        nc = await nats.connect(url)
        try:
            return list((await EventLog(nc).read_task(task_id)).events)
        finally:
            await nc.close()

    return asyncio.run(read())


def wait_for(url: str, task_id: str, until, timeout_s: float) -> list[Event]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = task_events(url, task_id)
        if until(events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"timed out; log has {[e.kind for e in task_events(url, task_id)]}")


def assert_each_step_once(events: list[Event]) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    dispatches = [e for e in events if isinstance(e, AgentDispatched)]
    assert len({d.dispatch_id for d in dispatches}) == len(dispatches)
    results = Counter(e.dispatch_id for e in events if isinstance(e, DISPATCH_RESULTS))  # type: ignore[attr-defined]
    assert all(results[d.dispatch_id] == 1 for d in dispatches), results
    calls = Counter(e.dispatch_id for e in events if isinstance(e, LLMCalled))
    assert all(n == 1 for n in calls.values()), calls
    decisions = Counter(e.cause for e in events if isinstance(e, ConductorDecided))
    assert all(n == 1 for n in decisions.values()), decisions


@pytest.mark.parametrize(
    "kill_when",
    ["coder is calling its LLM", "verifier is running the candidate"],
)
def test_killed_daemon_is_replaced_and_task_completes(
    kill_when: str, private_nats: str, slow_script: Path, tmp_path: Path
) -> None:
    agent = "coder" if "coder" in kill_when else "verifier"
    task_id = f"crash-{agent}"
    daemon_log = tmp_path / "daemon.log"
    first = start_daemon(private_nats, slow_script, daemon_log)
    try:
        submit = run_cli(
            "submit", "examples/tasks/relu.py", "--nats-url", private_nats, "--task-id", task_id
        )
        assert submit.returncode == 0, submit.stderr

        def agent_busy(events: list[Event]) -> bool:
            return any(isinstance(e, AgentDispatched) and e.agent == agent for e in events)

        wait_for(private_nats, task_id, agent_busy, timeout_s=60)
        time.sleep(0.5)  # inside the LLM call / the sandboxed run
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    before = task_events(private_nats, task_id)
    assert fold(task_id, before).terminal is None, "the kill must land mid-task"

    second = start_daemon(private_nats, slow_script, daemon_log)
    try:
        events = wait_for(
            private_nats, task_id, lambda ev: fold(task_id, ev).terminal is not None, 120
        )
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0, daemon_log.read_text()

    state = fold(task_id, events)
    assert state.finished is not None and state.finished.status == "success"
    assert [v.report.verdict for v in state.verifications] == ["fail", "pass"]
    assert state.history == ["designer", "coder", "verifier", "coder", "verifier"]
    assert events[: len(before)] == before  # history is only ever appended to
    assert_each_step_once(events)
