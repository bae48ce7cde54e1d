"""A daemon killed with SIGKILL between every pair of events of a task, at each point in
turn, and restarted: every task still ends as it would have, each step exactly once."""

from __future__ import annotations

import time
from pathlib import Path

from projections.rewards import KERNEL_REWARDS
from projections.task_state import fold
from tests.daemons import assert_each_step_once, is_settled, start_daemon, submit, task_events

# coder_only on relu with the relu script: coder, verifier (fail), conductor LLM, coder,
# verifier (pass), finish, and the finish's rewards — 21 events.
EVENTS_PER_TASK = 18 + len(KERNEL_REWARDS)


def test_crash_between_every_pair_of_events(private_nats: str, tmp_path: Path) -> None:
    tasks = {f"fault-{k}": k for k in range(1, EVENTS_PER_TASK)}
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
            private_nats, log, "--pool", "verifier=2", KF_ACK_WAIT="1", KF_FAULT_CRASH_AFTER=spec
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
