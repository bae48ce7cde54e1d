"""kernelflow.host.runtime's parts that need no NATS: what a command's own daemon says about
other tasks, how it is stopped when the command gives up, and how a stop is bounded (a
first signal interrupts, the stop has a deadline, a second signal ends it at once)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from typing import Any, cast

import pytest

from kernelflow.actors.daemon import Daemon
from kernelflow.actors.worker import Message
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import CancelTask, SubmitTask, TaskCancelled, TaskSubmitted
from kernelflow.host.exits import WaitTimeout, exit_code_for
from kernelflow.host.runtime import (
    ABANDONED_STOP_WAIT_S,
    noting_other_tasks,
    own_work,
    stopped_after,
)
from kernelflow.host.stopping import interruptible
from tests.memory import running_bridge


def event_job(task_id: str) -> Message:
    return Message("event", f"{subjects.EVENTS_ROOT}.{task_id}.agent_dispatched", b"", {}, 1, 1)


def submit_message(task_id: str) -> Message:
    command = SubmitTask(task_id=task_id, task_name="relu", task_source="")
    return Message("command", subjects.SUBMIT, encode(command), {}, 1, 1)


def test_a_commands_daemon_notes_each_other_task_once_unless_it_is_over(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with running_bridge() as bridge:
        # An earlier command's task, cancelled as it stopped: its left-over work is dropped.
        ended = [
            TaskSubmitted(
                task_id="ended",
                seq=1,
                task_name="relu",
                task_source="",
                workflow_name="default",
                workflow_yaml="",
                backend="triton",
                group_id="g",
            ),
            TaskCancelled(task_id="ended", seq=2, reason="kernelflow run interrupted"),
        ]
        bridge.call(bridge.log.append(TaskHistory("ended"), ended))
        on_message = noting_other_tasks(bridge, {"mine"}, "this run")

        def taken(role: str, message: Message) -> None:  # as the daemon calls it: on the loop
            async def take() -> None:
                on_message(role, message)
                await asyncio.sleep(0.1)  # the look at the log it starts

            bridge.call(take())

        taken("coder", event_job("mine"))
        taken("conductor", submit_message("mine"))
        taken("designer", event_job("ended"))
        assert capsys.readouterr().err == ""
        taken("coder", event_job("left-over"))
        taken("verifier", event_job("left-over"))
        taken("conductor", submit_message("queued"))
        taken("conductor", Message("command", subjects.SUBMIT, b"not a command", {}, 1, 1))
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "note: this run's daemon also works on task left-over (coder), queued before this run "
        "or by another publisher; `kernelflow cancel left-over` ends it",
        "note: this run's daemon also works on task queued (conductor), queued before this run "
        "or by another publisher; `kernelflow cancel queued` ends it",
    ]


def test_a_commands_own_daemon_serves_its_own_tasks_and_cancels_only() -> None:
    for serves in (own_work({"mine"}), own_work(lambda task: task.startswith("mi"))):
        assert serves(event_job("mine")) and serves(submit_message("mine"))
        assert not serves(event_job("others")) and not serves(submit_message("others"))
        anonymous = SubmitTask(task_name="relu", task_source="")  # the conductor names it
        assert not serves(Message("command", subjects.SUBMIT, encode(anonymous), {}, 1, 1))
        cancel = encode(CancelTask(task_id="others", reason="not needed"))
        assert serves(Message("command", subjects.CANCEL, cancel, {}, 1, 1))  # costs no LLM
        assert serves(Message("command", subjects.SUBMIT, b"not a command", {}, 1, 1))


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


def test_signals_are_the_blocks_only_while_it_runs() -> None:
    before: Any = signal.getsignal(signal.SIGTERM)
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    with interruptible():
        assert signal.getsignal(signal.SIGTERM) is not before
        assert signal.set_wakeup_fd(-1) != wakeup  # the stop's own pipe
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(wakeup) == -1  # the block put back what it found


# Two signals delivered together whose handlers Python ran as one: the second's ran
# inside the first's before the first's own first line (a loaded machine delays the
# thread that takes the second), so one handler ran for two signals. The delivery is
# what the interpreter writes to the wakeup fd; here both bytes are written as its
# signal handler writes them, then one handler runs.
ONE_HANDLER_FOR_TWO = """
import os, signal, time
from kernelflow.host.stopping import interruptible
try:
    with interruptible(deadline_s=300):
        delivered = signal.set_wakeup_fd(-1)
        signal.set_wakeup_fd(delivered)
        os.write(delivered, bytes([signal.SIGINT, signal.SIGTERM]))
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
except KeyboardInterrupt:
    time.sleep(60)  # a stop that would take its minute
"""


def test_two_signals_delivered_together_stop_at_once_when_python_runs_one_handler() -> None:
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", ONE_HANDLER_FOR_TWO], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (
        130,
        "kernelflow: asked again to stop: stopping at once\n",
    )
    assert time.monotonic() - started < 30


# The second ask seen twice: by the second signal's handler and by the stop's watcher,
# each ending the process. Here two threads end it together and stderr is slow, so the
# first is still writing its line when the second comes.
TWO_SEE_THE_SECOND = """
import os, threading, time
from kernelflow.host import stopping
write = os.write
def slow_write(fd, data):
    written = write(fd, data)
    time.sleep(0.5)
    return written
os.write = slow_write
both = threading.Barrier(2)
def ask_again():
    both.wait()
    stopping.exit_now("asked again to stop: stopping at once")
threading.Thread(target=ask_again).start()
ask_again()
"""


def test_the_second_ask_is_said_once_when_two_threads_see_it() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", TWO_SEE_THE_SECOND], capture_output=True, text=True, timeout=60
    )
    assert (proc.returncode, proc.stderr) == (
        130,
        "kernelflow: asked again to stop: stopping at once\n",
    )


# A command that is asked to stop, and whose stop hangs (``STUCK``): in a thread nobody
# stops, which the interpreter waits for at its exit (an actor stuck in a call to a NATS
# that is gone), or in the stop itself.
STOPPING = """
import sys, threading, time
from kernelflow.host.stopping import interruptible
try:
    with interruptible(deadline_s={deadline}):
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("stopping", flush=True)
    {stuck}
"""
STUCK = {
    "at-exit": "threading.Thread(target=time.sleep, args=(60,)).start(); sys.exit(1)",
    "in-the-stop": "time.sleep(60)",
}


def stop_asked(deadline_s: float, stuck: str, signals: int) -> tuple[int, str, float]:
    """Run ``STOPPING``, send it ``signals`` SIGTERMs (the second once it is stopping):
    its exit status, stderr and how long it took after the first."""
    script = STOPPING.format(deadline=deadline_s, stuck=STUCK[stuck])
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    asked = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.readline() == "stopping\n"
    if signals > 1:
        proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    return proc.returncode, stderr, time.monotonic() - asked


@pytest.mark.parametrize("stuck", list(STUCK))
def test_a_stop_that_hangs_ends_at_its_deadline(stuck: str) -> None:
    code, stderr, took = stop_asked(1.0, stuck, signals=1)
    assert (code, stderr) == (130, "kernelflow: the stop took over 1s: stopping at once\n")
    assert took < 30  # the stuck part's minute is not waited for


def test_a_second_signal_stops_at_once() -> None:
    code, stderr, took = stop_asked(300.0, "in-the-stop", signals=2)
    assert (code, stderr) == (130, "kernelflow: asked again to stop: stopping at once\n")
    assert took < 30  # neither the stop's minute nor its deadline


def test_exit_codes_of_a_task_that_ended() -> None:
    ended = ("success", "rejected", "failed", "cancelled")
    assert [exit_code_for(status) for status in ended] == [0, 2, 1, 1]
