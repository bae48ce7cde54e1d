"""kernelflow.runtime's parts that need no NATS: what a command's own daemon says about
other tasks, how it is stopped when the command gives up, and SIGTERM as Ctrl-C."""

from __future__ import annotations

import os
import signal
from typing import Any, cast

import pytest

from kernelflow.actors.daemon import Daemon
from kernelflow.actors.worker import Job
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import SubmitTask
from kernelflow.runtime import (
    ABANDONED_STOP_WAIT_S,
    noting_other_tasks,
    stopped_after,
    terminated_as_interrupted,
)
from kernelflow.usage import WaitTimeout, exit_code_for


def event_job(task_id: str) -> Job:
    return Job("event", f"{subjects.EVENTS_ROOT}.{task_id}.agent_dispatched", b"", {}, 1, 1)


def submit_job(task_id: str) -> Job:
    command = SubmitTask(task_id=task_id, task_name="relu", task_source="")
    return Job("command", subjects.SUBMIT, encode(command), {}, 1, 1)


def test_a_commands_daemon_notes_each_other_task_once(capsys: pytest.CaptureFixture[str]) -> None:
    on_job = noting_other_tasks({"mine"}, "this run")
    on_job("coder", event_job("mine"))
    on_job("conductor", submit_job("mine"))
    assert capsys.readouterr().err == ""
    on_job("coder", event_job("left-over"))
    on_job("verifier", event_job("left-over"))
    on_job("conductor", submit_job("queued"))
    on_job("conductor", Job("command", subjects.SUBMIT, b"not a command", {}, 1, 1))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "note: this run's daemon also works on task left-over (coder), queued before this run "
        "or by another publisher; `kernelflow cancel left-over` ends it",
        "note: this run's daemon also works on task queued (conductor), queued before this run "
        "or by another publisher; `kernelflow cancel queued` ends it",
    ]


class StoppingDaemon:
    def __init__(self) -> None:
        self.stopped_with: list[float | None] = []

    def stop(self, wait_s: float | None = None) -> None:
        self.stopped_with.append(wait_s)


@pytest.mark.parametrize(
    ("giving_up", "wait_s"),
    [
        (None, None),
        (KeyboardInterrupt, ABANDONED_STOP_WAIT_S),
        (WaitTimeout, ABANDONED_STOP_WAIT_S),
    ],
)
def test_a_commands_daemon_stops_at_once_when_the_command_gives_up(
    giving_up: type[BaseException] | None, wait_s: float | None
) -> None:
    daemon = StoppingDaemon()
    try:
        with stopped_after(cast(Daemon, daemon)):
            if giving_up is not None:
                raise giving_up()
    except BaseException as exc:
        assert giving_up is not None and isinstance(exc, giving_up)
    assert daemon.stopped_with == [wait_s]


def test_sigterm_interrupts_only_within_the_block() -> None:
    before: Any = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), terminated_as_interrupted():
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_exit_codes_of_a_task_that_ended() -> None:
    ended = ("success", "rejected", "failed", "cancelled")
    assert [exit_code_for(status) for status in ended] == [0, 2, 1, 1]
