"""A daemon on a log it did not write: an exported log imported into another NATS (a
move to new servers), whose history its new consumers are handed from the start. The
finished tasks need nothing: nothing is appended to them and their queued work is
dropped; the unfinished one is resumed from where the log says; new work runs."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import msgspec

from kernelflow.events import subjects
from kernelflow.events.model import AgentDispatched
from kernelflow.projections import logfile
from kernelflow.projections.task_state import fold
from tests.conftest import EXAMPLES, as_user, connect, keyed_nats, run_cli
from tests.daemons import (
    assert_each_step_once,
    start_daemon,
    submit,
    task_events,
    wait_until_over,
    wait_until_settled,
)

CANDIDATE = str(EXAMPLES / "candidates" / "solutions" / "relu.py")
VERIFY_ONLY = ("--workflow", "verifier_only", "--candidate", CANDIDATE)
FINISHED = ["old-1", "old-2", "old-3"]


def test_a_daemon_on_an_imported_log_resumes_what_was_unfinished_and_redoes_nothing(
    private_nats: str, tmp_path: Path
) -> None:
    # The old installation: three tasks run to their end.
    daemon = start_daemon(private_nats, tmp_path / "old.log")
    try:
        for task_id in FINISHED:
            submit(private_nats, task_id, *VERIFY_ONLY)
        finished = {task_id: wait_until_settled(private_nats, task_id) for task_id in FINISHED}
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
    # ... and one it was in the middle of when the log was exported: a copy of the first
    # task cut right after its verifier was dispatched.
    first = finished[FINISHED[0]]
    cut = next(i for i, e in enumerate(first) if isinstance(e, AgentDispatched)) + 1
    unfinished = [msgspec.structs.replace(e, task_id="cut-1") for e in first[:cut]]
    writer = logfile.LogWriter()
    exported = tmp_path / "export.jsonl"
    histories = [*finished.values(), unfinished]
    exported.write_bytes(
        b"".join(
            [writer.header(), *(writer.record(e) for h in histories for e in h), writer.trailer()]
        )
    )

    with keyed_nats(tmp_path / "new-nats", streams=False) as new:  # a new installation
        imported = run_cli("log", "import", str(exported), *as_user("daemon", new))
        assert imported.returncode == 0, imported.stderr
        daemon = start_daemon(new, tmp_path / "new.log")
        try:
            submit(new, "new-1", *VERIFY_ONLY)
            resumed = wait_until_over(new, "cut-1")
            fresh = wait_until_over(new, "new-1")
            deadline = time.monotonic() + 30
            while (left := asyncio.run(pending_work(new))) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert left == {}, "the daemon still holds work"
        finally:
            daemon.send_signal(signal.SIGTERM)
            assert daemon.wait(timeout=60) == 0
        for task_id, events in finished.items():
            assert task_events(new, task_id) == events, f"{task_id} was changed"

    for events in (resumed, fresh):
        state = fold(events[0].task_id, events)
        assert state.finished is not None and state.finished.status == "success"
        assert_each_step_once(events)
    assert resumed[:cut] == unfinished
    assert [d.agent for d in fold("cut-1", resumed).dispatches] == ["verifier"]


async def pending_work(url: str) -> dict[str, tuple[int, int]]:
    """The daemons' consumers that still hold work: name -> (not delivered, not acked)."""
    nc = await connect(url, "reader")
    try:
        js = nc.jetstream()
        left = {}
        for stream in (subjects.EVENTS_STREAM, subjects.COMMANDS_STREAM):
            for info in await js.consumers_info(stream):
                daemons = info.name.startswith(("kf-agent-", "kf-conductor"))
                if daemons and (info.num_pending or info.num_ack_pending):
                    left[info.name] = (info.num_pending, info.num_ack_pending)
        return left
    finally:
        await nc.close()
