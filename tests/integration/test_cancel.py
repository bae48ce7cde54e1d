"""``kernelflow cancel`` under credentials, as users run it: the daemon with the daemon
role, ``submit`` and ``cancel`` with the publisher's. A cancel of a task that is not in
the log yet answers "no task" at once when no submit published before it waits, and
otherwise waits for that submit and cancels the task once it is recorded."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.conductor import Conductor
from kernelflow.actors.worker import Message
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import (
    CancelTask,
    SubmitTask,
    TaskCancelled,
    TaskFinished,
    TaskSubmitted,
)
from kernelflow.projections.task_state import fold
from tests.conftest import REPO, as_user, role_auth, run_cli
from tests.daemons import (
    publish,
    start_daemon,
    stream_messages,
    submit,
    task_events,
    wait_for_line,
    wait_until_over,
)

RELU = "examples/tasks/relu.py"


def _assert_no_error_in(log: Path) -> None:
    text = log.read_text()
    for sign in ("Traceback", "NATS refused", "NatsPermissionDenied", "permissions violation"):
        assert sign not in text, text


def test_a_cancel_of_a_task_no_one_submitted_answers_at_once(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log, "--roles", "conductor", "--no-read-model")
    try:
        wait_for_line(log, "daemon started")
        started = time.monotonic()
        cancel = run_cli(
            "cancel", "never-submitted", "--timeout", "30", *as_user("publisher", private_nats)
        )
        took = time.monotonic() - started
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    assert cancel.returncode == 2, cancel.stderr  # a wrong id, as `status` says of one
    assert cancel.stderr == "kernelflow: no task never-submitted\n"
    assert took < 10, took  # one look at the log and the queue, not a timeout
    _assert_no_error_in(log)


def test_a_task_cancelled_right_after_its_submit_ends_cancelled(
    private_nats: str, tmp_path: Path
) -> None:
    """``submit --task-id X`` then ``cancel X`` while no daemon runs: both wait in the
    queue. The daemon that starts takes them together; the cancel waits for the submit
    ahead of it and cancels the task once it is recorded: it never runs to success."""
    for n in range(8):  # others' submits ahead, for the conductors to be busy with
        publish(private_nats, SubmitTask(task_id=f"other-{n}", task_source="", backend="cobol"))
    submit(private_nats, "cancelled-early")
    cancel = run_cli(
        "cancel", "cancelled-early", "--timeout", "30", *as_user("publisher", private_nats)
    )
    assert cancel.returncode == 3, cancel.stderr  # no conductor yet: it waits in the queue
    assert "cancel of cancelled-early queued: no daemon answered" in cancel.stderr
    assert stream_messages(private_nats, subjects.COMMANDS_STREAM) == 10
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log)
    try:
        events = wait_until_over(private_nats, "cancelled-early", timeout_s=120)
        time.sleep(2)  # anything the daemon would still record for it
        events = task_events(private_nats, "cancelled-early")
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    state = fold("cancelled-early", events)
    assert isinstance(state.terminal, TaskCancelled), [e.kind for e in events]
    assert not any(isinstance(e, TaskFinished) for e in events)
    assert stream_messages(private_nats, subjects.COMMANDS_STREAM) == 0  # both answered
    _assert_no_error_in(log)


# --------------------------------------------------------------------------- the conductor


@pytest.fixture
def bridge(private_nats: str) -> Iterator[Bridge]:
    """A daemon's connection (its role's key), with no daemon running: commands stay in
    the queue for the test to hand to a conductor."""
    b = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    yield b
    b.stop()


def _queued(
    bridge: Bridge, command: SubmitTask | CancelTask, subject: str, reply_to: str = ""
) -> Message:
    """Publish ``command`` to the queue; the message a conductor would get for it."""
    seq = bridge.call(bridge.commands.publish(command, subject))
    return Message(
        source="command",
        subject=subject,
        data=encode(command),
        headers={subjects.REPLY_HEADER: reply_to} if reply_to else {},
        stream_seq=seq,
        deliveries=1,
    )


def _submit(task_id: str) -> SubmitTask:
    source = (REPO / RELU).read_text()
    return SubmitTask(task_id=task_id, task_source=source, task_name="relu")


def _answers(bridge: Bridge) -> tuple[str, Callable[[], list[dict[str, object]]]]:
    """An inbox of this client's, and what has come to it (after a moment to arrive)."""
    replies: list[dict[str, object]] = []

    async def on_reply(msg) -> None:  # type: ignore[no-untyped-def]
        replies.append(json.loads(msg.data))

    inbox = bridge.nc.new_inbox()
    bridge.call(bridge.nc.subscribe(inbox, cb=on_reply))

    def received() -> list[dict[str, object]]:
        deadline = time.monotonic() + 10
        while not replies and time.monotonic() < deadline:
            bridge.call(asyncio.sleep(0.05))
        return replies

    return inbox, received


def test_a_cancel_waits_for_the_submit_queued_before_it(bridge: Bridge) -> None:
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    submitted = _queued(bridge, _submit(task_id), subjects.SUBMIT)
    inbox, received = _answers(bridge)
    cancel = _queued(bridge, CancelTask(task_id=task_id), subjects.CANCEL, inbox)
    conductor = Conductor(bridge, llm=None)
    # The submit is still queued (or being recorded by another conductor): not yet.
    assert conductor.handle(cancel) == "soon"
    assert conductor.handle(submitted) == "ack"
    # Delivered again, the cancel finds the task.
    assert conductor.handle(cancel) == "ack"
    assert received() == [{"ok": True, "task_id": task_id}]
    events = bridge.call(bridge.log.read_task(task_id)).events
    assert isinstance(events[0], TaskSubmitted) and isinstance(events[-1], TaskCancelled)


def test_a_cancel_answers_no_task_when_no_submit_waits_before_it(bridge: Bridge) -> None:
    """A submit published after the cancel is not waited for: the cancel came first."""
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    inbox, received = _answers(bridge)
    cancel = _queued(bridge, CancelTask(task_id=task_id), subjects.CANCEL, inbox)
    _queued(bridge, _submit(task_id), subjects.SUBMIT)
    assert Conductor(bridge, llm=None).handle(cancel) == "ack"
    assert received() == [{"ok": False, "error": f"no task {task_id}"}]
    assert bridge.call(bridge.log.read_task(task_id)).events == ()


def test_a_cancel_still_behind_queued_submits_on_its_last_delivery_says_so(
    bridge: Bridge,
) -> None:
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    _queued(bridge, _submit("another-task"), subjects.SUBMIT)
    inbox, received = _answers(bridge)
    cancel = _queued(bridge, CancelTask(task_id=task_id), subjects.CANCEL, inbox)
    last = dataclasses.replace(cancel, deliveries=20, last_delivery=True)
    assert Conductor(bridge, llm=None).handle(last) == "ack"  # answered, never lost
    [answer] = received()
    assert answer["ok"] is False
    assert f"task {task_id} is not in the log yet" in str(answer["error"])
