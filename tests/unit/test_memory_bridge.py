"""The memory bridge (``kernelflow.actors.memory_bridge``), what tests of actors' logic run
on instead of a nats-server: bridges on one ``MemoryServer`` share the log, the command
queue and requests, as processes on one NATS do, and each remembers its own histories."""

from __future__ import annotations

import pytest

from kernelflow.actors.memory_bridge import MemoryServer, NoNats
from kernelflow.events import subjects
from kernelflow.events.log import AppendConflict, TaskHistory
from kernelflow.events.model import AgentDispatched, SubmitTask
from tests.memory import answers_to, running_bridge


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


def test_bridges_on_one_server_share_the_queue_and_its_answers() -> None:
    """A command one bridge queues, another sees waiting; an answer one publishes reaches
    whoever listens on its inbox; a message that is no event is quarantined by reads."""
    server = MemoryServer()
    with running_bridge(server) as publisher, running_bridge(server) as listener:
        command = SubmitTask(task_id="t", task_source="x")
        seq = publisher.call(publisher.commands.publish(command, subjects.SUBMIT))
        assert listener.call(listener.commands.oldest(subjects.SUBMIT)) == seq
        server.streams.settle_command(seq)
        assert listener.call(listener.commands.oldest(subjects.SUBMIT)) is None

        answers = answers_to(server, "_INBOX.test")
        publisher.call(publisher.commands.answer("_INBOX.test", b'{"ok": true}'))
        assert answers.get(timeout=5) == {"ok": True}

        publisher.call(publisher.log.publish_raw("kf.ev.t.task_submitted", b"garbage"))
        read = listener.call(listener.log.read_task("t"))
        assert read.events == () and read.quarantine.count == 1


def test_a_memory_bridge_has_no_nats() -> None:
    with running_bridge() as bridge:
        assert bridge.connected
        with pytest.raises(NoNats):
            bridge.nc  # noqa: B018
