"""Event schema evolution: a daemon of an older version reads a log a newer one wrote to
(unknown kinds are kept and skipped, never fatal), old versions are upcast on read, and
every projection decides about every event type."""

from __future__ import annotations

import importlib
import json
import pkgutil
import random
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelflow import projections
from kernelflow.events import codec, subjects
from kernelflow.events.codec import MalformedMessage, decode_event, encode, upcaster
from kernelflow.events.log import EventLog
from kernelflow.events.model import (
    EVENT_TYPES,
    Event,
    RewardAssigned,
    TaskCancelled,
    UnknownEvent,
)
from kernelflow.projections import logfile
from kernelflow.projections.handlers import DECISIONS, UndecidedEvents, handler_table
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.task_state import TaskState, fold
from kernelflow.projections.trajectory import build_trajectory
from tests.conftest import as_user, run_cli
from tests.integration.test_export_log import cli, second_nats  # noqa: F401  (a fixture)
from tests.unit.test_projections_props import FAST, OPTIONS, TaskSpec, grpo, logs, make_task

NEWER = {"kind": "kernel_profiled", "v": 3, "cause": "", "profile": {"sm_util": 0.8}}


def newer_event(task_id: str, seq: int) -> UnknownEvent:
    raw = json.dumps({**NEWER, "task_id": task_id, "seq": seq, "at": 5000.0 + seq}).encode()
    event = decode_event(raw)
    assert isinstance(event, UnknownEvent)
    return event


def with_newer_events(history: list[Event], rng: random.Random) -> list[Event]:
    """``history`` with unknown events slipped in anywhere, the sequence renumbered."""
    out: list[Event] = []
    for event in history:
        if rng.random() < 0.3:
            out.append(newer_event(event.task_id, len(out) + 1))
        out.append(msgspec.structs.replace(event, seq=len(out) + 1))
    return out


# --------------------------------------------------------------------------- the codec


def test_an_unknown_kind_decodes_keeping_its_place_and_its_bytes() -> None:
    raw = json.dumps({**NEWER, "task_id": "t1", "seq": 7, "at": 12.5}).encode()
    event = decode_event(raw + b"\n")  # as a log file's line
    assert isinstance(event, UnknownEvent)
    assert (event.task_id, event.seq, event.at, event.v) == ("t1", 7, 12.5, 3)
    assert event.kind == "kernel_profiled" and event.event_id == "t1:7"
    assert encode(event) == raw  # written back exactly as recorded
    assert subjects.event_subject(event) == "kf.ev.t1.kernel_profiled"
    assert decode_event(encode(event)) == event


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"garbage", "not a kernelflow event"),
        (b"[1, 2]", "not a kernelflow event"),
        (b'{"kind": "task_cancelled", "task_id": "t", "seq": 1}', "reason"),  # known, broken
        (b'{"kind": "kernel_profiled", "task_id": "bad id!", "seq": 1}', "task_id"),
        (b'{"kind": "kernel_profiled", "seq": 1}', "task_id"),
        (b'{"kind": "x.y>", "task_id": "t", "seq": 1}', "is not a name"),
        (b'{"kind": 3, "task_id": "t", "seq": 1}', "not a kernelflow event"),
    ],
)
def test_what_is_not_an_event_is_still_refused(payload: bytes, why: str) -> None:
    with pytest.raises(MalformedMessage, match=why):
        decode_event(payload)


@pytest.fixture
def no_upcasters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "_UPCASTERS", {})


OLD_CANCEL = b'{"kind": "task_cancelled", "v": 0, "task_id": "t", "seq": 4, "why": "old name"}'


def test_an_upcaster_reads_an_old_version_as_todays(no_upcasters: None) -> None:
    with pytest.raises(MalformedMessage):  # without it, v0's renamed field is missing
        decode_event(OLD_CANCEL)

    @upcaster("task_cancelled", from_version=0)
    def reason_was_why(obj: dict[str, object]) -> dict[str, object]:
        obj["reason"] = obj.pop("why")
        return {**obj, "v": 1}

    event = decode_event(OLD_CANCEL)
    assert event == TaskCancelled(task_id="t", seq=4, reason="old name", v=1)
    # An old event today's schema also reads (the fast path) is upcast all the same.
    fine_but_old = b'{"kind": "task_cancelled", "v": 0, "task_id": "t", "why": "w", "reason": ""}'
    assert decode_event(fine_but_old).reason == "w"  # type: ignore[attr-defined]
    # Today's version is left alone.
    today = encode(TaskCancelled(task_id="t", seq=5, reason="now"))
    assert decode_event(today) == TaskCancelled(task_id="t", seq=5, reason="now")


def test_upcasters_are_checked(no_upcasters: None) -> None:
    with pytest.raises(ValueError, match="unknown event kind"):
        upcaster("no_such_kind", 0)

    @upcaster("task_cancelled", from_version=0)
    def forgets_the_version(obj: dict[str, object]) -> dict[str, object]:
        return {**obj, "reason": obj.pop("why")}

    with pytest.raises(ValueError, match="already registered"):
        upcaster("task_cancelled", 0)(forgets_the_version)
    with pytest.raises(MalformedMessage, match="did not raise v"):
        decode_event(OLD_CANCEL)


# --------------------------------------------------------------------------- projections


def test_every_projection_decides_about_every_event_type() -> None:
    # Every table registers as its module is imported: import them all, whatever ran before.
    for found in pkgutil.iter_modules(projections.__path__):
        importlib.import_module(f"{projections.__name__}.{found.name}")
    expected = {
        "task_state",
        "metrics",
        "trajectory",
        "flow_grpo samples",
        "flow_grpo verl prompts",
    }
    assert expected <= set(DECISIONS)
    for name, (handled, ignored) in DECISIONS.items():
        assert handled | ignored == set(EVENT_TYPES), name
        assert not handled & ignored, name


def test_a_table_that_forgets_an_event_type_is_refused() -> None:
    everything_but_rewards = {t: print for t in EVENT_TYPES if t is not RewardAssigned}
    with pytest.raises(UndecidedEvents, match="neither handled nor ignored: RewardAssigned"):
        handler_table("forgetful", everything_but_rewards, ignored=())
    with pytest.raises(UndecidedEvents, match="both handled and ignored: RewardAssigned"):
        handler_table("twice", {t: print for t in EVENT_TYPES}, ignored=(RewardAssigned,))
    with pytest.raises(UndecidedEvents, match="not event types of this version: UnknownEvent"):
        handler_table("stranger", {t: print for t in EVENT_TYPES}, ignored=(UnknownEvent,))


def _steps(events: list[Event]) -> list[tuple[object, ...]]:
    t = build_trajectory(events[0].task_id, events)
    return [(s.step_type, s.content, s.tool_name, s.is_correct) for s in t.steps]


def _state(s: TaskState) -> tuple[object, ...]:
    return (
        s.terminal and s.terminal.kind,
        s.history,
        [v.report.verdict for v in s.verifications],
        s.finished.final_answer if s.finished else None,
        sorted(s.rewards),
    )


def _summary(metrics: MetricsProjection) -> dict[str, dict[str, object]]:
    rows = {}
    for tid, t in metrics.tasks.items():
        row = msgspec.structs.asdict(t)
        # The unknown events take places in the log (and event ids are places).
        del row["events"], row["last_seq"], row["passes"]
        rows[tid] = row
    return rows


@FAST
@given(logs(), OPTIONS, st.integers(0, 2**16))
def test_projections_skip_events_of_unknown_kinds(log, options, seed) -> None:  # type: ignore[no-untyped-def]
    """Slipping newer events anywhere into any log changes no projection's answer."""
    rng = random.Random(seed)
    by_task: dict[str, list[Event]] = {}
    for _, e in log:
        by_task.setdefault(e.task_id, []).append(e)
    newer = {tid: with_newer_events(h, rng) for tid, h in by_task.items()}
    cursors = dict.fromkeys(newer, 0)
    mixed: list[Event] = []
    for _, e in log:  # the same interleaving, each task's new events in their place
        h = newer[e.task_id]
        while isinstance(h[cursors[e.task_id]], UnknownEvent):
            mixed.append(h[cursors[e.task_id]])
            cursors[e.task_id] += 1
        mixed.append(h[cursors[e.task_id]])
        cursors[e.task_id] += 1
    mixed_log = list(enumerate(mixed, 1))

    for tid, history in by_task.items():
        plain, skipped = fold(tid, history), fold(tid, newer[tid])
        assert skipped.last is not None and skipped.last.seq == len(newer[tid])  # all count
        assert _state(skipped) == _state(plain)
        assert _steps(newer[tid]) == _steps(history)
    assert _summary(MetricsProjection().apply_all(mixed_log)) == _summary(
        MetricsProjection().apply_all(log)
    )
    keys = ("rollout_id", "turn_index", "agent", "prompt", "response", "reward", "advantage")
    samples = [
        [tuple(getattr(s, k) for k in keys) for s in grpo(x, options)[0]] for x in (log, mixed_log)
    ]
    assert samples[0] == samples[1]


# --------------------------------------------------------------------------- a real log


def test_an_older_daemon_reads_exports_and_continues_a_task_holding_a_newer_event(
    second_nats: str,  # noqa: F811
    tmp_path: Path,
    event_log: EventLog,
) -> None:
    """A log holding an event of a kind this version does not know: every tool reads it,
    an export of it is byte-identical to what was imported, and appends continue after
    it in order."""
    history = with_newer_events(
        make_task(TaskSpec("evo-a", "g", ("mismatch", "pass"))), random.Random(3)
    )
    assert any(isinstance(e, UnknownEvent) for e in history)
    writer = logfile.LogWriter()
    original = tmp_path / "newer.jsonl"
    original.write_bytes(
        writer.header() + b"".join(writer.record(e) for e in history) + writer.trailer()
    )

    assert cli("log", "verify", str(original)) == 0
    for args in (
        ("replay", "--from", str(original), "--task", "evo-a"),
        ("replay", "--from", str(original), "--task", "evo-a", "--view", "metrics"),
        ("report", "--from", str(original)),
        ("export", "grpo", "--from", str(original), "--out", str(tmp_path / "d.jsonl")),
    ):
        done = run_cli(*args)
        assert done.returncode == 0, (args, done.stderr)
        assert "Traceback" not in done.stderr
        if args[0] == "replay":  # the views that show one task say what they skipped
            assert "of kinds this kernelflow does not know (kernel_profiled x" in done.stderr
    assert cli("log", "import", str(original), *as_user("daemon", second_nats)) == 0
    again = tmp_path / "again.jsonl"
    assert cli("log", "export", "--out", str(again), *as_user("reader", second_nats)) == 0
    assert again.read_bytes() == original.read_bytes()
    status = run_cli("status", "evo-a", *as_user("publisher", second_nats))
    assert status.returncode == 0, status.stderr
    assert "a newer kernelflow wrote them" in status.stderr

    # On the live log: the task's history reads whole, and the next append lands after it.
    async def record() -> None:
        last = 0
        for e in history:
            last = await (await event_log.send_recorded(e, last))

    event_log.run(record())  # type: ignore[attr-defined]
    read = event_log.run(event_log.read_task("evo-a"))  # type: ignore[attr-defined]
    assert [e.kind for e in read.events] == [e.kind for e in history]
    later = RewardAssigned(task_id="evo-a", reward_fn="binary", version=1, value=1.0)
    after = event_log.run(event_log.append(read, [later]))  # type: ignore[attr-defined]
    assert after.events[-1].seq == len(history) + 1
