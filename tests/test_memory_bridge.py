"""The memory bridge (``kernelflow.actors.memory_bridge``), what tests of actors' logic run
on instead of a nats-server: bridges on one ``MemoryServer`` share the log and core
publish/subscribe, as processes on one NATS do, and each remembers its own histories."""

from __future__ import annotations

import queue

import nats.errors
import pytest
from nats.aio.msg import Msg

from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.events import subjects
from kernelflow.events.log import AppendConflict, TaskHistory
from kernelflow.events.model import AgentDispatched, SubmitTask
from tests.memory import running_bridge


def dispatch(task: str, n: int) -> AgentDispatched:
    return AgentDispatched(task_id=task, agent="coder", step=n, dispatch_id=f"{task}:d{n}")


def test_bridges_on_one_server_share_the_log_not_what_they_remember() -> None:
    server = MemoryServer()
    with running_bridge(server) as mine, running_bridge(server) as theirs:
        history = mine.call(mine.log.append(TaskHistory("t"), [dispatch("t", 1)]))
        assert mine.log.remembered("t") is history and theirs.log.remembered("t") is None
        read = theirs.call(theirs.log.read_task("t"))
        assert read == history
        theirs.call(theirs.log.append(read, [dispatch("t", 2)]))
        with pytest.raises(AppendConflict):  # mine is behind
            mine.call(mine.log.append(history, [dispatch("t", 2)]))


def test_what_is_published_is_kept_delivered_and_taken_by_the_streams() -> None:
    """A reply reaches a subscriber on another bridge and is kept for the test to read;
    a publish on an event subject lands in the log (and reaches that subject's
    subscribers), one on a command subject in the command queue."""
    server = MemoryServer()
    got: queue.Queue[Msg] = queue.Queue()

    async def on_msg(msg: Msg) -> None:
        got.put(msg)

    with running_bridge(server) as publisher, running_bridge(server) as listener:
        inbox = listener.nc.new_inbox()
        listener.call(listener.nc.subscribe(inbox, cb=on_msg))
        listener.call(listener.nc.subscribe(subjects.task_events("t"), cb=on_msg))
        publisher.call(publisher.nc.publish(inbox, b'{"ok": true}'))
        assert got.get(timeout=5).data == b'{"ok": true}'
        assert [m.data for m in publisher.nc.published_on("_INBOX.>")] == [b'{"ok": true}']

        publisher.call(publisher.nc.publish("kf.ev.t.task_submitted", b"garbage"))
        assert got.get(timeout=5).subject == "kf.ev.t.task_submitted"
        read = listener.call(listener.log.read_task("t"))
        assert read.events == () and read.quarantine.count == 1

        command = SubmitTask(task_id="t", task_source="x")
        seq = publisher.call(publisher.commands.publish(command, subjects.SUBMIT))
        assert listener.call(listener.commands.oldest(subjects.SUBMIT)) == seq
        server.streams.settle_command(seq)
        assert listener.call(listener.commands.oldest(subjects.SUBMIT)) is None


def test_a_subscription_for_one_message_answers_next_msg_then_stops() -> None:
    with running_bridge() as bridge:

        async def ask() -> bytes:
            inbox = bridge.nc.new_inbox()
            sub = await bridge.nc.subscribe(inbox, max_msgs=1)
            await bridge.nc.publish(inbox, b"one")
            await bridge.nc.publish(inbox, b"two")
            first = await sub.next_msg(timeout=5)
            with pytest.raises(nats.errors.TimeoutError):  # as nats-py's
                await sub.next_msg(timeout=0.1)
            return first.data

        assert bridge.call(ask()) == b"one"
