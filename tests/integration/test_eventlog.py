"""The EventLog against a real nats-server: ordering, concurrency control, dedup."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest
from nats.aio.msg import Msg

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import AppendConflict, EventLog, StreamConfig, TaskHistory, delivery_of
from kernelflow.events.model import AgentDispatched, TaskCancelled, TaskRejected
from tests.conftest import connect


def new_task() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def test_append_then_read_back(event_log: EventLog) -> None:
    task = new_task()
    history = event_log.run(
        event_log.append(
            TaskHistory(task),
            [
                TaskRejected(task_id=task, reason="first"),
                AgentDispatched(task_id=task, agent="coder", step=1, dispatch_id=f"{task}:d1"),
            ],
        )
    )
    assert [e.seq for e in history.events] == [1, 2]
    assert all(e.at > 0 for e in history.events)
    read = event_log.run(event_log.read_task(task))
    assert read == history
    assert read.next_seq == 3


def test_unknown_task_reads_empty(event_log: EventLog) -> None:
    history = event_log.run(event_log.read_task(new_task()))
    assert history.events == () and history.last_stream_seq == 0


def test_stale_append_is_a_conflict(event_log: EventLog) -> None:
    task = new_task()
    stale = TaskHistory(task)
    event_log.run(event_log.append(stale, [TaskRejected(task_id=task, reason="won")]))
    with pytest.raises(AppendConflict):
        event_log.run(event_log.append(stale, [TaskRejected(task_id=task, reason="lost")]))
    events = event_log.run(event_log.read_task(task)).events
    assert [e.reason for e in events] == ["won"]  # type: ignore[attr-defined]


def test_appends_to_other_tasks_do_not_conflict(event_log: EventLog) -> None:
    a, b = new_task(), new_task()
    history_a = event_log.run(
        event_log.append(TaskHistory(a), [TaskCancelled(task_id=a, reason="x")])
    )
    event_log.run(event_log.append(TaskHistory(b), [TaskCancelled(task_id=b, reason="y")]))
    history_a = event_log.run(event_log.append(history_a, [TaskCancelled(task_id=a, reason="z")]))
    assert [e.seq for e in history_a.events] == [1, 2]


def test_resent_publish_is_recorded_once(event_log: EventLog) -> None:
    """A publish re-sent with the same Nats-Msg-Id (e.g. after a lost ack) is dropped by the
    server, and the EventLog reports it as a conflict so the caller reloads."""
    task = new_task()
    history = event_log.run(
        event_log.append(TaskHistory(task), [TaskRejected(task_id=task, reason="a")])
    )
    original = history.events[0]
    ack = event_log.run(
        event_log.jetstream.publish(
            subjects.event_subject(original),
            encode(original),
            headers={"Nats-Msg-Id": original.event_id},
        )
    )
    assert ack.duplicate
    fresh = TaskHistory(task, (), 0)
    with pytest.raises(AppendConflict):
        # Same position again, as a restarted writer that lost track would try.
        event_log.run(event_log.append(fresh, [TaskRejected(task_id=task, reason="a")]))
    assert len(event_log.run(event_log.read_task(task)).events) == 1


def test_read_whole_log_from_a_position(event_log: EventLog) -> None:
    task = new_task()
    history = event_log.run(
        event_log.append(
            TaskHistory(task), [TaskCancelled(task_id=task, reason=str(i)) for i in range(5)]
        )
    )
    first = history.last_stream_seq - 4

    async def collect(start: int) -> list[tuple[int, str]]:
        return [(seq, e.task_id) async for seq, e in event_log.read(start_seq=start)]

    tail = event_log.run(collect(first))
    assert [seq for seq, _ in tail][:5] == list(range(first, first + 5))
    assert {t for _, t in tail[:5]} == {task}
    assert all(a < b for (a, _), (b, _) in itertools.pairwise(tail))


def test_a_read_spans_many_pull_batches_and_stops_where_the_log_ended(
    event_log: EventLog,
) -> None:
    """More events than one pull asks for, read in order, and only those recorded when
    the read began (a task appended to meanwhile does not keep it going)."""
    tasks = [new_task() for _ in range(3)]

    async def fill() -> int:
        for task in tasks:
            await event_log.append(
                TaskHistory(task), [TaskCancelled(task_id=task, reason=str(i)) for i in range(450)]
            )
        return (await event_log.jetstream.stream_info(subjects.EVENTS_STREAM)).state.last_seq

    last = event_log.run(fill())
    start = last - 3 * 450 + 1

    async def read_while_appending() -> list[tuple[int, str]]:
        seen = []
        async for seq, event in event_log.read(start_seq=start):
            seen.append((seq, event.task_id))
            if len(seen) == 10:  # recorded after the read began: not part of it
                later = TaskCancelled(task_id=new_task(), reason="late")
                await event_log.append(TaskHistory(later.task_id), [later])
        return seen

    seen = event_log.run(read_while_appending())
    assert [seq for seq, _ in seen] == list(range(start, last + 1))
    assert [task for _, task in seen[::450]] == tasks


def test_a_following_read_delivers_events_recorded_after_it_began(event_log: EventLog) -> None:
    task = new_task()

    async def follow() -> list[str]:
        got: list[str] = []
        reader = event_log.read(subject=subjects.task_events(task), follow=True, idle_timeout=0.2)
        async for _, event in reader:
            got.append(event.reason)  # type: ignore[attr-defined]
            if len(got) == 3:
                break
        await reader.aclose()
        return got

    async def both() -> list[str]:
        reading = asyncio.ensure_future(follow())
        await asyncio.sleep(0.5)  # the read waits through a few expired pull requests
        history = TaskHistory(task)
        for i in range(3):
            history = await event_log.append(history, [TaskCancelled(task_id=task, reason=str(i))])
        return await asyncio.wait_for(reading, 10)

    assert event_log.run(both()) == ["0", "1", "2"]


def test_delivery_of_reads_both_forms_of_ack_subject() -> None:
    msg = Msg(None, reply="$JS.ACK.KF_EVENTS.c1.3.1234.77.1700000000000000000.9")  # type: ignore[arg-type]
    assert delivery_of(msg) == (1234, 77, 3)
    msg = Msg(None, reply="$JS.ACK.hub.ACCHASH.KF_EVENTS.c1.2.99.7.1700000000000000000.0.tok")  # type: ignore[arg-type]
    assert delivery_of(msg) == (99, 7, 2)
    with pytest.raises(ValueError, match="not a JetStream delivery"):
        delivery_of(Msg(None, reply="_INBOX.abc"))  # type: ignore[arg-type]


def test_event_for_another_task_is_refused(event_log: EventLog) -> None:
    with pytest.raises(ValueError, match="appended to"):
        event_log.run(event_log.append(TaskHistory("a"), [TaskCancelled(task_id="b", reason="x")]))


def test_a_remembered_history_is_only_ever_behind(event_log: EventLog, nats_url: str) -> None:
    """Two writers on one log: each keeps the histories it saw, and still never decides
    on a stale one."""
    other_nc = event_log.run(connect(nats_url, "daemon"))
    other = EventLog(other_nc)
    task = new_task()
    mine = event_log.run(
        event_log.append(TaskHistory(task), [TaskCancelled(task_id=task, reason="1")])
    )
    theirs = event_log.run(other.read_task(task))
    event_log.run(other.append(theirs, [TaskCancelled(task_id=task, reason="2")]))
    with pytest.raises(AppendConflict):  # mine is behind now
        event_log.run(event_log.append(mine, [TaskCancelled(task_id=task, reason="3")]))
    caught_up = event_log.run(event_log.read_task(task))
    assert [e.reason for e in caught_up.events] == ["1", "2"]  # type: ignore[attr-defined]
    event_log.run(other_nc.close())


def test_history_through_a_delivered_event(event_log: EventLog, nats_url: str) -> None:
    task = new_task()
    history = event_log.run(
        event_log.append(TaskHistory(task), [TaskCancelled(task_id=task, reason="1")])
    )
    known = event_log.run(event_log.history_through(history.events[0], history.last_stream_seq))
    assert known == history
    nc = event_log.run(connect(nats_url, "reader"))
    fresh = EventLog(nc)  # remembers nothing: must read the log
    assert (
        event_log.run(fresh.history_through(history.events[0], history.last_stream_seq)) == history
    )
    event_log.run(nc.close())


def test_a_task_is_known_to_have_ended_once_its_end_is_recorded_or_read(
    event_log: EventLog, nats_url: str
) -> None:
    """What lets a daemon drop work queued for a finished task without reading it."""
    task, other = new_task(), new_task()
    dispatched = AgentDispatched(task_id=task, agent="coder", step=1, dispatch_id=f"{task}:d1")
    history = event_log.run(event_log.append(TaskHistory(task), [dispatched]))
    assert not event_log.has_ended(task)
    event_log.run(event_log.append(history, [TaskCancelled(task_id=task, reason="stop")]))
    assert event_log.has_ended(task)  # recorded here

    nc = event_log.run(connect(nats_url, "reader"))
    fresh = EventLog(nc, StreamConfig(ended_tasks=1))
    assert not fresh.has_ended(task)  # nothing is assumed
    event_log.run(fresh.read_task(task))
    assert fresh.has_ended(task)  # read here
    event_log.run(event_log.append(TaskHistory(other), [TaskRejected(task_id=other, reason="x")]))
    event_log.run(fresh.read_task(other))
    # Only the most recent ones are kept: an older task is read again when work for it comes.
    assert fresh.has_ended(other) and not fresh.has_ended(task)
    event_log.run(nc.close())
