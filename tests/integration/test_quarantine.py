"""Messages of the log that are not events of their task are quarantined, never fatal.

An attacker (or a broken client) allowed to publish on ``kf.ev.>`` put ``b"garbage"``
into a task's history: every read of that task raised, so the task could be neither
advanced, nor cancelled, nor given up on, and the whole-log tools stopped there. Here,
reads turn such a message into a ``QuarantinedEvent`` placeholder, keep its stream
position (so appends after it go in), and say how many they quarantined."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import AppendConflict, EventLog, TaskHistory
from kernelflow.events.model import (
    Event,
    QuarantinedEvent,
    TaskCancelled,
    TaskRejected,
    UnknownEvent,
)
from kernelflow.events.quarantine import HistoryCheck, Quarantine, placed
from kernelflow.offline.files import verify_file
from kernelflow.offline.log_import import import_file
from kernelflow.offline.sources import EventFilter, FileSource
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.task_state import fold
from tests.conftest import as_user, connect
from tests.integration.test_export_log import cli, second_nats  # noqa: F401  (a fixture)
from tests.unit.test_eventlog_contract import LogUnderTest, in_memory, on_jetstream
from tests.unit.test_projections_props import TaskSpec, make_task

DEEP = b"[" * 100_000 + b"]" * 100_000


def new_task() -> str:
    return f"q-{uuid.uuid4().hex[:12]}"


def cancelled(task: str, seq: int, reason: str = "r") -> TaskCancelled:
    return TaskCancelled(task_id=task, seq=seq, reason=reason)


def on_subject(event: Event) -> tuple[str, bytes]:
    return subjects.event_subject(event), encode(event)


# --------------------------------------------------------------------------- placing


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"garbage", "not a kernelflow event"),
        (b'{"kind": "task_cancelled", "task_id": "v"', "not a kernelflow event"),
        (b'{"kind": "task_cancelled", "task_id": "v", "seq": 1e999, "reason": "r"}', "seq"),
        (b'{"kind": "task_cancelled", "params": ' + DEEP + b"}", "nested too deeply"),
        (DEEP, "not a kernelflow event"),
    ],
)
def test_a_message_that_does_not_decode_is_quarantined_with_why(data: bytes, why: str) -> None:
    q = placed("kf.ev.v.task_cancelled", data, 7)
    assert isinstance(q, QuarantinedEvent)
    assert (q.task_id, q.seq, q.stream_seq, q.size) == ("v", 0, 7, len(data))
    assert why in q.reason and len(q.reason) <= 300
    assert q.evidence == data[:256]


def test_an_event_on_another_subject_than_its_own_is_quarantined() -> None:
    event = cancelled("attacker", 1)
    assert placed("kf.ev.attacker.task_cancelled", encode(event), 1) == event
    for subject in ("kf.ev.victim.task_cancelled", "kf.ev.attacker.task_finished"):
        q = placed(subject, encode(event), 1)
        assert isinstance(q, QuarantinedEvent)
        assert "on another subject than its own" in q.reason
    # An unknown kind (a newer kernelflow's) belongs on its kind's subject, or below it.
    newer = json.dumps({"kind": "kernel_profiled", "task_id": "t", "seq": 1}).encode()
    assert isinstance(placed("kf.ev.t.kernel_profiled.gpu0", newer, 2), UnknownEvent)
    assert isinstance(placed("kf.ev.u.kernel_profiled", newer, 2), QuarantinedEvent)


def test_each_place_in_a_tasks_sequence_belongs_to_the_first_message_that_takes_it() -> None:
    check = HistoryCheck()
    placed_seqs = [
        (seq, type(check.place(*on_subject(cancelled(task, seq)), stream_seq)).__name__)
        for stream_seq, (task, seq) in enumerate(
            [("a", 1), ("a", 2), ("a", 2), ("b", 3), ("a", 1), ("a", 4), ("a", 3), ("b", 1)], 1
        )
    ]
    assert placed_seqs == [
        (1, "TaskCancelled"),
        (2, "TaskCancelled"),
        (2, "QuarantinedEvent"),  # a repeat
        (3, "QuarantinedEvent"),  # the first event of b is its seq 1
        (1, "QuarantinedEvent"),  # back
        (4, "QuarantinedEvent"),  # a gap
        (3, "TaskCancelled"),
        (1, "TaskCancelled"),
    ]


def test_a_read_that_starts_within_the_log_or_of_some_kinds_only_judges_less() -> None:
    within = HistoryCheck(from_first=False)  # a task's first event read may be any
    assert type(within.place(*on_subject(cancelled("a", 5)), 9)) is TaskCancelled
    assert type(within.place(*on_subject(cancelled("a", 7)), 10)) is QuarantinedEvent
    some_kinds = HistoryCheck(whole=False)  # seqs between them belong to other kinds
    assert type(some_kinds.place(*on_subject(cancelled("a", 1)), 1)) is TaskCancelled
    assert type(some_kinds.place(*on_subject(cancelled("a", 5)), 2)) is TaskCancelled
    assert type(some_kinds.place(*on_subject(cancelled("a", 5)), 3)) is QuarantinedEvent


def test_projections_skip_placeholders_and_the_metrics_count_them() -> None:
    events = make_task(TaskSpec("p-a", "g", ("pass",)))
    garbage = placed("kf.ev.p-a.x", b"garbage", 2)
    with_garbage = [events[0], garbage, *events[1:]]
    assert fold("p-a", with_garbage) == fold("p-a", events)
    plain = MetricsProjection().apply_all(enumerate(events, 1))
    metrics = MetricsProjection()
    assert metrics.apply(1, events[0]) and metrics.apply(2, garbage)
    metrics.apply_all(enumerate(events[1:], 3))
    assert metrics.tasks == plain.tasks
    assert (metrics.position, metrics.state.quarantined) == (len(events) + 1, 1)
    # Garbage on the subjects of no task makes no task.
    assert MetricsProjection().apply(1, placed("kf.ev.nobody.x", b"{", 1))
    assert not MetricsProjection().apply_all([(1, placed("kf.ev.nobody.x", b"{", 1))]).tasks


def test_a_quarantine_tally_keeps_the_first_few_and_counts_the_rest() -> None:
    tally = Quarantine()
    for n in range(100):
        tally = tally.add(placed(f"kf.ev.t{n}.x", b"garbage", n))
    assert (tally.count, len(tally.first)) == (100, 16)
    note = tally.note()
    assert note is not None and "100 message(s)" in note and "and 97 more" in note
    assert "stream seq 0 on kf.ev.t0.x (7 bytes)" in note
    assert Quarantine().note() is None


# --------------------------------------------------------------------------- the log


@pytest.fixture(params=["jetstream", "memory"])
def adapter(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogUnderTest]:
    """The log under the contract's harness (tests/unit/test_eventlog_contract.py): on a
    JetStream server of the test's own, and in memory."""
    if request.param == "memory":
        yield from in_memory()
    else:
        yield from on_jetstream(tmp_path / "nats")


# On both of the log's adapters (``adapter``: the JetStream log on a server of the test's
# own, and the memory log), as the contract's clauses are.


def publish(t: LogUnderTest, subject: str, data: bytes) -> int:
    """What anyone allowed on ``kf.ev.>`` can store there: no check at all."""
    return int(t.run(t.log.publish_raw(subject, data)))


def test_garbage_in_a_history_is_read_past_and_the_next_append_goes_on_top_of_it(
    adapter: LogUnderTest,
) -> None:
    t = adapter
    task = new_task()
    first = t.run(t.log.append(TaskHistory(task), [TaskRejected(task_id=task, reason="a")]))
    garbage_at = publish(t, f"kf.ev.{task}.x", b"garbage")
    # This process remembers the history before the garbage: its append is refused, and
    # the history read then holds the garbage's position, not the garbage.
    with pytest.raises(AppendConflict):
        t.run(t.log.append(first, [cancelled(task, 0)]))
    read = t.run(t.log.read_task(task))
    assert read.events == first.events and read.next_seq == 2
    assert read.last_stream_seq == garbage_at
    assert read.quarantine.count == 1 and read.quarantine.first[0].stream_seq == garbage_at
    after = t.run(t.log.append(read, [cancelled(task, 0)]))
    assert [e.seq for e in after.events] == [1, 2]
    assert after.quarantine == read.quarantine
    # Another process (nothing remembered) reads the same.
    again = t.run(t.other().read_task(task))
    assert again.events == after.events and again.quarantine.count == 1


def test_forged_events_are_quarantined_in_a_tasks_history(
    adapter: LogUnderTest,
) -> None:
    t = adapter
    task, other = new_task(), new_task()
    history = t.run(t.log.append(TaskHistory(task), [cancelled(task, 0, "first")]))
    forged = [
        (f"kf.ev.{task}.task_cancelled", encode(cancelled(other, 2))),  # another task's
        (f"kf.ev.{task}.task_cancelled", encode(cancelled(task, 1, "again"))),  # a repeat
        (f"kf.ev.{task}.task_cancelled", encode(cancelled(task, 9))),  # a gap
        (f"kf.ev.{task}.task_finished", encode(cancelled(task, 2))),  # on another kind
    ]
    for subject, data in forged:
        publish(t, subject, data)
    read = t.run(t.other().read_task(task))
    assert read.events == history.events and read.quarantine.count == len(forged)
    appended = t.run(t.log.append(read, [cancelled(task, 0, "second")]))
    assert [(e.seq, e.reason) for e in appended.events] == [(1, "first"), (2, "second")]


def test_a_task_whose_subjects_hold_only_garbage_can_still_begin(
    adapter: LogUnderTest,
) -> None:
    """Garbage published before a task exists (its id guessed) does not keep it out."""
    t = adapter
    task = new_task()
    publish(t, f"kf.ev.{task}.task_submitted", b"\xff\xfe")
    read = t.run(t.log.read_task(task))
    assert read.events == () and read.last_stream_seq > 0 and read.next_seq == 1
    appended = t.run(t.log.append(read, [cancelled(task, 0)]))
    assert [e.seq for e in appended.events] == [1]


def test_a_whole_log_read_yields_placeholders_in_place(
    adapter: LogUnderTest,
) -> None:
    t = adapter
    task = new_task()
    t.run(t.log.append(TaskHistory(task), [cancelled(task, 0)]))
    garbage_at = publish(t, f"kf.ev.{task}.x", b"garbage")
    history = t.run(t.log.read_task(task))
    t.run(t.log.append(history, [cancelled(task, 0)]))

    async def read() -> list[tuple[int, Event]]:
        return [item async for item in t.log.read(subject=subjects.task_events(task))]

    kinds = [(seq, type(e).__name__) for seq, e in t.run(read())]
    assert [k for _, k in kinds] == ["TaskCancelled", "QuarantinedEvent", "TaskCancelled"]
    assert kinds[1][0] == garbage_at


# --------------------------------------------------------------------------- tools

SPECS = (TaskSpec("v-1", "g", ("mismatch", "pass"), speedup=2.0), TaskSpec("v-2", "g", ("pass",)))


@pytest.fixture
def attacked(private_nats: str) -> str:
    """A log of two tasks, one of them with garbage, a forged repeat and another task's
    event in its history; and garbage on the subjects of no task (as only a holder of the
    daemon key may write there: a daemon with a bug)."""

    async def go() -> None:
        nc = await connect(private_nats, "daemon")
        log = EventLog(nc)
        await log.ensure_streams()
        js = nc.jetstream()
        for spec in SPECS:
            events = make_task(spec)
            history = await log.append(TaskHistory(spec.task_id), events[:3])
            if spec.task_id == "v-1":
                await js.publish("kf.ev.v-1.x", b"garbage")
                await js.publish(*on_subject(events[0]))  # a repeat of its first event
                await js.publish("kf.ev.v-1.task_cancelled", encode(cancelled("v-2", 4)))
                history = await log.read_task(spec.task_id)
            await log.append(history, events[3:])
        await js.publish("kf.ev.nobody.agent_dispatched.coder", b'{"kind": "agent_dispa')
        await nc.close()

    asyncio.run(go())
    return private_nats


def test_whole_log_tools_skip_quarantined_messages_with_a_note(
    attacked: str,
    second_nats: str,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "log.jsonl"
    assert cli("log", "export", "--out", str(out), *as_user("reader", attacked)) == 0
    printed = capsys.readouterr()
    assert "of 2 tasks and 4 quarantine record(s)" in printed.out
    assert "4 message(s) on the log's task subjects" in printed.err
    summary = verify_file(out)
    assert (summary.quarantined, sorted(summary.tasks)) == (4, ["v-1", "v-2"])
    assert cli("log", "verify", str(out), "--json") == 0
    assert json.loads(capsys.readouterr().out)["quarantined"] == 4
    # The file reads back with its placeholders where the log had them.
    from_file: list[Event] = []
    FileSource(out, EventFilter()).feed(lambda _, e: from_file.append(e))
    assert [type(e).__name__ for e in from_file].count("QuarantinedEvent") == 4
    assert cli("report", "--json", *as_user("reader", attacked)) == 0
    printed = capsys.readouterr()
    report = json.loads(printed.out)
    assert report["overall"]["tasks"] == 2 and "quarantined" in printed.err
    assert (
        cli("export", "grpo", "--out", str(tmp_path / "s.jsonl"), *as_user("reader", attacked)) == 0
    )
    assert cli("replay", "--task", "v-1", "--json", *as_user("reader", attacked)) == 0
    assert cli("status", "--json", *as_user("publisher", attacked)) == 0  # no daemon: folded here
    printed = capsys.readouterr()
    notes = [line.split(" are not")[0] for line in printed.err.splitlines() if "note" in line]
    assert notes == [f"note: {n} message(s) on the log's task subjects" for n in (4, 3, 4)]
    assert [row["status"] for row in json.loads(printed.out.splitlines()[-1])] == ["success"] * 2
    assert cli("status", "v-1", "--json", *as_user("publisher", attacked)) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out.splitlines()[-1])["status"] == "success"
    assert "3 message(s)" in printed.err

    async def imported() -> tuple[int, int]:  # `log import`'s: a daemon's role
        nc = await connect(second_nats, "daemon")
        log = EventLog(nc)
        await log.ensure_streams()
        result = await import_file(log, out, summary)
        await nc.close()
        return result.appended, result.quarantined

    # Imported elsewhere: the events, not the quarantined messages.
    assert asyncio.run(imported()) == (summary.records - 4, 4)
