"""Faults the design promises to survive: a daemon killed with SIGKILL between every pair
of events of a task, at each point in turn, and restarted; nats-server killed and
restarted under a running daemon. Every task still ends as it would have, each step
exactly once."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest
import yaml

from kernelflow.events.model import LLMCalled
from kernelflow.projections.rewards import KERNEL_REWARDS
from kernelflow.projections.task_state import fold
from tests.conftest import REPO, keyed_nats_server
from tests.daemons import (
    RELU_SCRIPT,
    assert_each_step_once,
    is_settled,
    start_daemon,
    submit,
    task_events,
    wait_for,
    wait_until_settled,
)

# coder_only on relu with the relu script: coder, verifier (fail), conductor LLM, coder,
# verifier (pass), finish, and the finish's rewards — 21 events.
EVENTS_PER_TASK = 18 + len(KERNEL_REWARDS)


# The crash points, in shards of their own (separate servers and daemons): test runners
# that run tests side by side (pytest -n) spread them, instead of one long chain of daemons.
SHARDS = 3


@pytest.mark.parametrize("shard", range(SHARDS))
def test_crash_between_every_pair_of_events(private_nats: str, tmp_path: Path, shard: int) -> None:
    tasks = {f"fault-{k}": k for k in range(1, EVENTS_PER_TASK) if k % SHARDS == shard}
    for task_id in tasks:
        submit(private_nats, task_id, "--workflow", "coder_only")
    spec = ",".join(f"{t}:{k}" for t, k in tasks.items())
    log = tmp_path / "daemons.log"

    def all_over() -> bool:
        return all(is_settled(private_nats, t) for t in tasks)

    crashes = 0
    deadline = time.monotonic() + 400
    while not all_over():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        daemon = start_daemon(
            private_nats, log, "--pool", "verifier=1", KF_ACK_WAIT="1", KF_FAULT_CRASH_AFTER=spec
        )
        while daemon.poll() is None and not all_over():
            time.sleep(0.2)
        if daemon.poll() is None:
            daemon.terminate()
            assert daemon.wait(timeout=30) == 0
        else:
            assert daemon.returncode == -9, log.read_text()[-3000:]
            crashes += 1
    # A failpoint fires at most once (its event is appended once). It may not fire at all
    # when its event was stored while the daemon was dying of another failpoint, before
    # the ack came back: the daemon still died between that event and the task's next.
    assert len(tasks) // 2 <= crashes <= len(tasks)

    for task_id in tasks:
        events = task_events(private_nats, task_id)
        state = fold(task_id, events)
        assert state.finished is not None and state.finished.status == "success", task_id
        assert state.history == ["coder", "verifier", "coder", "verifier"], task_id
        assert len(events) == EVENTS_PER_TASK, (task_id, [e.kind for e in events])
        assert_each_step_once(events)


def test_daemon_rides_out_a_nats_crash_and_restart(tmp_path: Path) -> None:
    """nats-server is SIGKILLed while tasks are mid-flight and started again on the same
    port and store: the daemon reconnects on its own, and every task still ends as it
    would have, each step exactly once."""
    with socket.socket() as probe:  # a free port the restarted server can take again
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = yaml.safe_load((REPO / RELU_SCRIPT).read_text())
    for agent in ("designer", "coder", "conductor"):
        for entry in script[agent]:
            entry["latency_s"] = 1.0  # the crash lands while LLM calls are in flight
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(script))

    with keyed_nats_server(tmp_path / "nats", port=port) as server:
        url = server.url
        log = tmp_path / "daemon.log"
        daemon = start_daemon(url, log, script=slow, KF_ACK_WAIT="2")
        try:
            tasks = [f"restart-{k}" for k in range(4)]
            for task_id in tasks:
                submit(url, task_id, "--workflow", "coder_only")
            wait_for(url, tasks[-1], lambda ev: any(isinstance(e, LLMCalled) for e in ev), 60)
            os.kill(server.pid or 0, signal.SIGKILL)
            server.stop()
            time.sleep(1.5)  # the daemon finds NATS gone and keeps retrying
            assert daemon.poll() is None, log.read_text()[-3000:]
            assert server.start() == url

            for task_id in tasks:
                events = wait_until_settled(url, task_id, 180)
                state = fold(task_id, events)
                assert state.finished is not None and state.finished.status == "success", task_id
                assert len(events) == EVENTS_PER_TASK, (task_id, [e.kind for e in events])
                assert_each_step_once(events)
            assert "reconnected to NATS" in log.read_text()
        finally:
            daemon.kill()
            daemon.wait(30)
