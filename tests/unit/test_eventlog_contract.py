"""One contract for the event log's port (``kernelflow.events.port``) and the command
queue's beside it (``kernelflow.events.queue``), run against both of their adapters: the
JetStream log and queue on a real nats-server, and the memory ones. And the proof
that the contract can fail: a memory log that skips the conflict check (or the duplicate
check) must fail the clauses that are about it, and only those.

Each clause is a plain function of a ``LogUnderTest``: the log, a way to run a coroutine
on its loop, another process's log on the same streams (remembering nothing), and a way
to let the duplicate window pass (a short window on a private JetStream server, waited
out; a clock moved on for the memory log)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog
from kernelflow.events.memory import MemoryCommandQueue, MemoryEventLog, MemoryStreams
from kernelflow.events.model import (
    AgentDispatched,
    Event,
    SubmitTask,
    TaskCancelled,
    TaskRejected,
)
from kernelflow.events.nats_queue import JetStreamCommandQueue
from kernelflow.events.port import AppendConflict, EventLogPort, StreamConfig, TaskHistory
from kernelflow.events.queue import CommandQueuePort
from tests.conftest import connect, keyed_nats
from tests.memory import FakeClock

T = TypeVar("T")
# A short duplicate window, so that a clause can outlive it.
WINDOW_S = 1.0
SETTINGS = StreamConfig(duplicate_window_s=WINDOW_S)


@dataclass
class LogUnderTest:
    log: EventLogPort
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    # Another process's log on the same streams: it remembers nothing.
    other: Callable[[], EventLogPort]
    # Lets the duplicate window pass: message ids stored before are forgotten.
    outlive_window: Callable[[], None]
    # The command queue beside the log, and another process's.
    commands: CommandQueuePort
    other_commands: Callable[[], CommandQueuePort]
    # Where the answer to the queued command at a sequence goes (its ``KF-Reply``): what a
    # conductor reads off the command it takes.
    reply_to_of: Callable[[int], Coroutine[Any, Any, str]]


def new_task() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def cancelled(task: str, reason: str = "r", seq: int = 0) -> TaskCancelled:
    return TaskCancelled(task_id=task, seq=seq, reason=reason)


def dispatch(task: str, n: int) -> AgentDispatched:
    return AgentDispatched(task_id=task, agent="coder", step=n, dispatch_id=f"{task}:d{n}")


def reasons(history: TaskHistory) -> list[str]:
    return [e.reason for e in history.events]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- the clauses

CONTRACT: list[Callable[[LogUnderTest], None]] = []


def clause(check: Callable[[LogUnderTest], None]) -> Callable[[LogUnderTest], None]:
    CONTRACT.append(check)
    return check


@clause
def appends_number_a_tasks_events_one_after_the_other(t: LogUnderTest) -> None:
    task = new_task()
    first = t.run(
        t.log.append(
            TaskHistory(task),
            [
                TaskRejected(task_id=task, reason="first"),
                AgentDispatched(task_id=task, agent="coder", step=1, dispatch_id=f"{task}:d1"),
            ],
        )
    )
    assert [e.seq for e in first.events] == [1, 2]
    assert all(e.at > 0 for e in first.events)
    history = t.run(t.log.append(first, [cancelled(task, "third")]))
    assert [e.seq for e in history.events] == [1, 2, 3]
    assert history.events[:2] == first.events
    assert history.last_stream_seq > first.last_stream_seq
    assert t.run(t.log.read_task(task)) == history  # remembered
    read = t.run(t.other().read_task(task))  # read from the log
    assert read == history and read.next_seq == 4 and read.quarantine.count == 0


@clause
def an_unknown_task_reads_empty(t: LogUnderTest) -> None:
    history = t.run(t.log.read_task(new_task()))
    assert history.events == () and history.last_stream_seq == 0 and history.next_seq == 1


@clause
def a_stale_append_is_refused(t: LogUnderTest) -> None:
    task = new_task()
    stale = TaskHistory(task)
    t.run(t.log.append(stale, [cancelled(task, "won")]))
    with pytest.raises(AppendConflict):
        t.run(t.log.append(stale, [cancelled(task, "lost")]))
    assert reasons(t.run(t.other().read_task(task))) == ["won"]


@clause
def an_append_on_top_of_a_message_it_did_not_read_is_refused(t: LogUnderTest) -> None:
    """The check is on the task's last message, whatever it is: here one that is no
    event (its ids are no help: no event's id was used twice)."""
    task = new_task()
    first = t.run(t.log.append(TaskHistory(task), [cancelled(task, "1")]))
    garbage_at = t.run(t.log.publish_raw(f"kf.ev.{task}.x", b"garbage"))
    with pytest.raises(AppendConflict):
        t.run(t.log.append(first, [cancelled(task, "2")]))
    read = t.run(t.log.read_task(task))
    assert read.events == first.events and read.last_stream_seq == garbage_at
    after = t.run(t.log.append(read, [cancelled(task, "2")]))
    assert [e.seq for e in after.events] == [1, 2] and after.last_stream_seq > garbage_at
    assert reasons(t.run(t.other().read_task(task))) == ["1", "2"]


@clause
def a_stale_append_is_refused_once_its_ids_are_forgotten(t: LogUnderTest) -> None:
    """Past the duplicate window nothing recognises the stale event's id: only the
    expected-sequence check refuses it."""
    task = new_task()
    stale = TaskHistory(task)
    t.run(t.log.append(stale, [cancelled(task, "won")]))
    t.outlive_window()
    with pytest.raises(AppendConflict):
        t.run(t.log.append(stale, [cancelled(task, "lost")]))
    read = t.run(t.other().read_task(task))
    assert reasons(read) == ["won"] and read.quarantine.count == 0


@clause
def an_event_sent_again_is_recorded_once(t: LogUnderTest) -> None:
    """Sent again on top of the right stream sequence (an answer lost, the send retried):
    only its message id tells it apart, and it is not stored twice."""
    task = new_task()
    history = t.run(t.log.append(TaskHistory(task), [TaskRejected(task_id=task, reason="a")]))

    async def send_again() -> int:
        return await (await t.log.send_recorded(history.events[0], history.last_stream_seq))

    with pytest.raises(AppendConflict, match="already recorded"):
        t.run(send_again())
    read = t.run(t.other().read_task(task))
    assert read.events == history.events and read.quarantine.count == 0
    assert read.last_stream_seq == history.last_stream_seq


@clause
def message_ids_are_forgotten_after_the_duplicate_window(t: LogUnderTest) -> None:
    """As JetStream's ``Nats-Msg-Id``: a duplicate only within the window. Stored again
    after it, the copy is quarantined as a repeat of its place."""
    task = new_task()
    history = t.run(t.log.append(TaskHistory(task), [TaskRejected(task_id=task, reason="a")]))
    t.outlive_window()

    async def send_again() -> int:
        return await (await t.log.send_recorded(history.events[0], history.last_stream_seq))

    copy_at = t.run(send_again())
    assert copy_at > history.last_stream_seq
    read = t.run(t.other().read_task(task))
    assert read.events == history.events and read.last_stream_seq == copy_at
    assert read.quarantine.count == 1 and "a repeat" in read.quarantine.first[0].reason


@clause
def appends_to_other_tasks_do_not_conflict(t: LogUnderTest) -> None:
    a, b = new_task(), new_task()
    history_a = t.run(t.log.append(TaskHistory(a), [cancelled(a, "x")]))
    t.run(t.log.append(TaskHistory(b), [cancelled(b, "y")]))
    history_a = t.run(t.log.append(history_a, [cancelled(a, "z")]))
    assert [e.seq for e in history_a.events] == [1, 2]


@clause
def an_event_of_another_task_is_refused(t: LogUnderTest) -> None:
    with pytest.raises(ValueError, match="appended to"):
        t.run(t.log.append(TaskHistory(new_task()), [cancelled("elsewhere", "x")]))


@clause
def messages_that_are_not_a_tasks_events_are_quarantined(t: LogUnderTest) -> None:
    task, other = new_task(), new_task()
    history = t.run(t.log.append(TaskHistory(task), [cancelled(task, "first")]))
    forged = [
        (f"kf.ev.{task}.x", b"garbage"),  # does not decode
        (f"kf.ev.{task}.task_cancelled", encode(cancelled(other, seq=2))),  # another task's
        (f"kf.ev.{task}.task_cancelled", encode(cancelled(task, "again", 1))),  # a repeat
        (f"kf.ev.{task}.task_cancelled", encode(cancelled(task, seq=9))),  # a gap
        (f"kf.ev.{task}.task_finished", encode(cancelled(task, seq=2))),  # on another kind
    ]
    at = [t.run(t.log.publish_raw(subject, data)) for subject, data in forged]
    assert at == sorted(at) and at[0] > history.last_stream_seq
    for reader in (t.log, t.other()):  # remembering the history, and not
        read = t.run(reader.read_task(task))
        assert read.events == history.events and read.last_stream_seq == at[-1]
        assert read.quarantine.count == len(forged)
        assert [q.stream_seq for q in read.quarantine.first] == at
    appended = t.run(t.log.append(read, [cancelled(task, "second")]))
    assert [(e.seq, e.reason) for e in appended.events] == [(1, "first"), (2, "second")]  # type: ignore[attr-defined]
    # Garbage where a task has no events yet does not keep it from beginning.
    fresh = new_task()
    t.run(t.log.publish_raw(f"kf.ev.{fresh}.task_submitted", b"\xff\xfe"))
    read = t.run(t.other().read_task(fresh))
    assert read.events == () and read.last_stream_seq > 0 and read.next_seq == 1
    assert [e.seq for e in t.run(t.log.append(read, [cancelled(fresh)])).events] == [1]


@clause
def a_read_of_the_log_yields_placeholders_in_place(t: LogUnderTest) -> None:
    task = new_task()
    t.run(t.log.append(TaskHistory(task), [cancelled(task)]))
    garbage_at = t.run(t.log.publish_raw(f"kf.ev.{task}.x", b"garbage"))
    t.run(t.log.append(t.run(t.log.read_task(task)), [cancelled(task)]))

    async def read() -> list[tuple[int, Event]]:
        return [item async for item in t.log.read(subject=subjects.task_events(task))]

    kinds = [(seq, type(e).__name__) for seq, e in t.run(read())]
    assert [k for _, k in kinds] == ["TaskCancelled", "QuarantinedEvent", "TaskCancelled"]
    assert kinds[1][0] == garbage_at


@clause
def reads_go_by_stream_position_and_stop_where_the_log_ended(t: LogUnderTest) -> None:
    """More messages than a read takes at once, read in order from a position, and only
    those recorded when the read began."""
    tasks = [new_task() for _ in range(3)]

    async def fill() -> int:
        for task in tasks:
            await t.log.append(TaskHistory(task), [cancelled(task, str(i)) for i in range(220)])
        return await t.log.end_seq()

    last = t.run(fill())
    start = last - 3 * 220 + 1

    async def read_while_appending(start_seq: int, subject: str) -> list[tuple[int, str]]:
        seen = []
        async for seq, event in t.log.read(start_seq=start_seq, subject=subject):
            seen.append((seq, event.task_id))
            if len(seen) == 10:  # recorded after the read began: not part of it
                later = cancelled(new_task(), "late")
                await t.log.append(TaskHistory(later.task_id), [later])
        return seen

    seen = t.run(read_while_appending(start, subjects.ALL_EVENTS))
    assert [seq for seq, _ in seen] == list(range(start, last + 1))
    assert [task for _, task in seen[::220]] == tasks
    assert all(a < b for (a, _), (b, _) in itertools.pairwise(seen))
    middle = t.run(read_while_appending(start + 300, subjects.task_events(tasks[1])))
    assert [seq for seq, _ in middle] == list(range(start + 300, start + 440))
    assert {task for _, task in middle} == {tasks[1]}


@clause
def a_following_read_is_woken_by_what_is_recorded_after_it_began(t: LogUnderTest) -> None:
    """Woken by each new event, not by looking again now and then (which here would take
    a minute)."""
    task = new_task()

    async def follow() -> list[str]:
        got: list[str] = []
        reader = t.log.read(subject=subjects.task_events(task), follow=True, idle_timeout=60)
        async for _, event in reader:
            got.append(event.reason)  # type: ignore[attr-defined]
            if len(got) == 3:
                break
        await reader.aclose()
        return got

    async def both() -> list[str]:
        await t.log.append(TaskHistory(task), [cancelled(task, "0")])
        reading = asyncio.ensure_future(follow())
        await asyncio.sleep(0.3)  # the read has caught up, and waits
        other = t.other()  # another writer
        for i in (1, 2):
            await other.append(await other.read_task(task), [cancelled(task, str(i))])
        return await asyncio.wait_for(reading, 10)

    assert t.run(both()) == ["0", "1", "2"]


@clause
def a_process_remembers_the_histories_it_saw_never_ahead_of_the_log(t: LogUnderTest) -> None:
    task = new_task()  # a task that goes on: its history is worth remembering
    mine = t.run(t.log.append(TaskHistory(task), [dispatch(task, 1)]))
    assert t.log.remembered(task) is mine and t.log.remembered_through(mine.events[0]) is mine
    # The history through a delivered event: remembered, or read.
    event = mine.events[0]
    assert t.run(t.log.history_through(event, mine.last_stream_seq)) is mine
    assert t.run(t.other().history_through(event, mine.last_stream_seq)) == mine
    other = t.other()
    assert other.remembered(task) is None
    theirs = t.run(other.read_task(task))
    assert other.remembered(task) == theirs == mine
    t.run(other.append(theirs, [dispatch(task, 2)]))
    with pytest.raises(AppendConflict):  # mine is behind now
        t.run(t.log.append(mine, [dispatch(task, 3)]))
    caught_up = t.run(t.log.read_task(task))
    assert [e.dispatch_id for e in caught_up.events] == [f"{task}:d1", f"{task}:d2"]  # type: ignore[attr-defined]
    assert t.log.remembered(task) == caught_up


@clause
def a_task_is_known_to_have_ended_once_its_end_is_recorded_or_read(t: LogUnderTest) -> None:
    task = new_task()
    history = t.run(t.log.append(TaskHistory(task), [dispatch(task, 1)]))
    assert not t.log.has_ended(task)
    t.run(t.log.append(history, [cancelled(task, "stop")]))
    assert t.log.has_ended(task) and t.log.remembered(task) is None
    other = t.other()
    assert not other.has_ended(task)
    t.run(other.read_task(task))
    assert other.has_ended(task)


@clause
def commands_wait_in_their_queue_in_order(t: LogUnderTest) -> None:
    assert t.run(t.commands.oldest(subjects.SUBMIT)) is None
    assert t.run(t.commands.waiting(subjects.SUBMIT)) == 0
    first, second = (SubmitTask(task_id=new_task(), task_source="x") for _ in range(2))
    at = [t.run(t.commands.publish(c, subjects.SUBMIT)) for c in (first, second)]
    assert at[0] < at[1]
    assert t.run(t.commands.oldest(subjects.SUBMIT)) == at[0]
    assert t.run(t.other_commands().oldest(subjects.SUBMIT)) == at[0]
    assert t.run(t.commands.oldest(subjects.CANCEL)) is None
    assert t.run(t.other_commands().waiting(subjects.SUBMIT)) == 2
    assert t.run(t.commands.waiting(subjects.CANCEL)) == 0


@clause
def a_command_sent_again_under_its_id_is_queued_once(t: LogUnderTest) -> None:
    command = SubmitTask(task_id=new_task(), task_source="x")
    again = {"Nats-Msg-Id": f"submit-{command.task_id}"}
    first = t.run(t.commands.publish(command, subjects.SUBMIT, again))
    assert t.run(t.other_commands().publish(command, subjects.SUBMIT, again)) == first
    assert t.run(t.commands.waiting(subjects.SUBMIT)) == 1


@clause
def a_request_is_answered_on_its_own_inbox(t: LogUnderTest) -> None:
    command = SubmitTask(task_id=new_task(), task_source="x")

    async def ask_and_answer() -> Any:
        asking = asyncio.ensure_future(t.commands.request(command, subjects.SUBMIT, 10.0))
        while (seq := await t.commands.oldest(subjects.SUBMIT)) is None:
            await asyncio.sleep(0.01)
        reply_to = await t.reply_to_of(seq)
        assert subjects.reply_refusal(reply_to) is None  # an inbox
        await t.other_commands().answer(reply_to, b'{"ok": true, "task_id": "x"}')
        return await asking

    assert t.run(ask_and_answer()) == {"ok": True, "task_id": "x"}


@clause
def a_request_nobody_answers_comes_back_empty(t: LogUnderTest) -> None:
    command = SubmitTask(task_id=new_task(), task_source="x")
    assert t.run(t.commands.request(command, subjects.SUBMIT, 0.2)) is None
    assert t.run(t.commands.waiting(subjects.SUBMIT)) == 1  # still queued


# --------------------------------------------------------------------------- the adapters


def in_memory(log_class: type[MemoryEventLog] = MemoryEventLog) -> Iterator[LogUnderTest]:
    clock = FakeClock()
    streams = MemoryStreams(SETTINGS, clock=clock)
    loop = asyncio.new_event_loop()

    async def reply_to_of(seq: int) -> str:
        (command,) = [c for c in streams.commands() if c.seq == seq]
        return command.headers[subjects.REPLY_HEADER]

    try:
        yield LogUnderTest(
            log_class(streams),
            loop.run_until_complete,
            lambda: log_class(streams),
            lambda: clock.advance(WINDOW_S * 2),
            MemoryCommandQueue(streams),
            lambda: MemoryCommandQueue(streams),
            reply_to_of,
        )
    finally:
        loop.close()


def on_jetstream(store: Path) -> Iterator[LogUnderTest]:
    """A server of the test's own, whose streams this log makes (with this test's window,
    as a daemon: the role that appends), and where nothing else consumes commands."""
    with keyed_nats(store, streams=False) as url:
        loop = asyncio.new_event_loop()
        nc = loop.run_until_complete(connect(url, "daemon"))
        log = EventLog(nc, SETTINGS)
        loop.run_until_complete(log.ensure_streams())

        async def reply_to_of(seq: int) -> str:
            stored = await nc.jetstream().get_msg(subjects.COMMANDS_STREAM, seq)
            return str((stored.headers or {})[subjects.REPLY_HEADER])

        try:
            # JetStream forgets ids on a timer: wait a little past the window.
            yield LogUnderTest(
                log,
                loop.run_until_complete,
                lambda: EventLog(nc, SETTINGS),
                _sleep(WINDOW_S * 2.5),
                JetStreamCommandQueue(nc),
                lambda: JetStreamCommandQueue(nc),
                reply_to_of,
            )
        finally:
            loop.run_until_complete(nc.close())
            loop.close()


def _sleep(seconds: float) -> Callable[[], None]:
    return lambda: time.sleep(seconds)


# The JetStream half, on a server of its own:
# tests/integration/test_eventlog_contract_jetstream.py.
@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
def test_the_contract_in_memory(check: Callable[[LogUnderTest], None]) -> None:
    with contextlib.contextmanager(in_memory)() as t:
        check(t)


# --------------------------------------------------------------------------- broken logs


class SkipsTheConflictCheck(MemoryEventLog):
    """Records an event whatever the task's last message is."""

    def _store(
        self, event: Event, after_stream_seq: int, headers: dict[str, str] | None = None
    ) -> int:
        published = self.streams.publish(
            subjects.event_subject(event), encode(event), msg_id=event.event_id, headers=headers
        )
        if published.duplicate:
            raise AppendConflict(f"event {event.event_id} was already recorded")
        return published.seq


class SkipsTheDuplicateCheck(MemoryEventLog):
    """Records an event however recently its id was recorded."""

    def _store(
        self, event: Event, after_stream_seq: int, headers: dict[str, str] | None = None
    ) -> int:
        return self.streams.publish(
            subjects.event_subject(event),
            encode(event),
            expected_last=after_stream_seq,
            expected_subject=subjects.task_events(event.task_id),
            headers=headers,
        ).seq


@pytest.mark.parametrize(
    ("broken", "fails"),
    [
        (
            SkipsTheConflictCheck,
            {
                "an_append_on_top_of_a_message_it_did_not_read_is_refused",
                "a_stale_append_is_refused_once_its_ids_are_forgotten",
            },
        ),
        (SkipsTheDuplicateCheck, {"an_event_sent_again_is_recorded_once"}),
    ],
    ids=["no conflict check", "no duplicate check"],
)
def test_a_broken_log_fails_the_clauses_about_what_it_breaks(
    broken: type[MemoryEventLog], fails: set[str]
) -> None:
    failed = set()
    for check in CONTRACT:
        with contextlib.contextmanager(in_memory)(broken) as t:
            try:
                check(t)
            except (AssertionError, pytest.fail.Exception):
                failed.add(check.__name__)
    assert failed == fails


# --------------------------------------------------------------------------- memory only


def test_a_following_read_is_woken_by_a_writer_on_another_thread() -> None:
    """Logs on one ``MemoryStreams`` may live on several loops (several bridges)."""
    streams = MemoryStreams()
    task = new_task()
    writer = MemoryEventLog(streams)
    started = threading.Event()

    def write() -> None:
        started.wait(10)
        asyncio.run(writer.append(TaskHistory(task), [cancelled(task, "from afar")]))

    async def follow() -> str:
        reader = MemoryEventLog(streams).read(
            subject=subjects.task_events(task), follow=True, idle_timeout=60
        )
        async with contextlib.aclosing(reader):
            started.set()
            async for _, event in reader:
                return event.reason  # type: ignore[attr-defined,no-any-return]
        raise AssertionError("the read ended")

    thread = threading.Thread(target=write)
    thread.start()
    assert asyncio.run(asyncio.wait_for(follow(), 10)) == "from afar"
    thread.join()
