"""The status read model: a fold resumed from a snapshot equals one pass; a read model on a
real NATS answers ``kernelflow status``, resumes from its persisted position after a
crash or a restart without counting anything twice, and ``status`` folds the log itself
when no daemon answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.readmodel import SNAPSHOT, ReadModel, Snapshot
from kernelflow.actors.readmodel_client import NoAnswer, query_status, status_row, status_rows
from kernelflow.actors.readmodel_snapshot import Page, PagedMetrics
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import Event, RewardAssigned, SubmitTask
from kernelflow.events.pull import cancel_and_wait
from kernelflow.offline.sources import EventFilter, LiveSource, metrics_of
from kernelflow.projections.metrics import FOLD_VERSION, MetricsProjection
from kernelflow.projections.render import summary
from kernelflow.projections.task_state import fold
from tests.conftest import EXAMPLES, as_user, connect, role_auth, run_cli
from tests.daemons import start_daemon, submit, wait_until_settled
from tests.integration.test_export_log import append
from tests.unit.test_metrics_tools import assert_names_kept_once, decoded_tasks
from tests.unit.test_projections_props import FAST, TaskSpec, logs, make_task

# --------------------------------------------------------------------------- pure


@FAST
@given(logs(), st.data())
def test_rows_resumed_from_a_snapshot_equal_one_pass(log: list[tuple[int, Event]], data) -> None:  # type: ignore[no-untyped-def]
    one = MetricsProjection().apply_all(log)
    k = data.draw(st.integers(0, len(log)))
    first = MetricsProjection().apply_all(log[:k])
    saved = msgspec.json.encode(
        Snapshot(fold_version=FOLD_VERSION, stream_created="s", saved_at=0.0, state=first.state)
    )
    resumed = MetricsProjection(msgspec.json.decode(saved, type=Snapshot).state)
    assert resumed.position == (log[k - 1][0] if k else 0)
    # The consumer restarts at position + 1, and a redelivery may repeat some events.
    resumed.apply_all(log[k - data.draw(st.integers(0, k)) :])
    assert status_rows(resumed) == status_rows(one)
    # Each row says what `kernelflow status TASK` (a fold of that task's events) says.
    by_task: dict[str, list[Event]] = {}
    for _, e in log:
        by_task.setdefault(e.task_id, []).append(e)
    for tid, events in by_task.items():
        exact = summary(fold(tid, events))
        del exact["final_code"]
        assert status_row(one.tasks[tid]) == exact


def _resume(
    paged: PagedMetrics, stored: dict[int, bytes], log: list[tuple[int, Event]], start: int
) -> PagedMetrics:
    """Save ``paged`` as a daemon does (its new pages into ``stored``, then its head),
    and restore a read model from that: the head through JSON, the pages as stored."""
    for index, data in paged.unstored:
        assert stored.setdefault(index, data) == data, f"page {index} sealed differently"
    head = msgspec.json.decode(msgspec.json.encode(paged.head(0.0)), type=Snapshot)
    pages = [msgspec.json.decode(stored[i], type=Page) for i in range(head.pages)]
    resumed = PagedMetrics.restore(head, pages)
    for position, event in log[start:]:
        resumed.apply(position, event)
    return resumed


@FAST
@given(logs(), st.integers(1, 3), st.data())
def test_a_paged_snapshot_resumed_anywhere_equals_one_pass(log, page_rows, data) -> None:  # type: ignore[no-untyped-def]
    """Saved as pages and a head, stopped and resumed at any two points (with events
    delivered again), a read model has the state one pass gives, and seals the same
    pages, byte for byte, as a read model that never stopped."""
    one = PagedMetrics("s", page_rows)
    for position, event in log:
        one.apply(position, event)
    k1 = data.draw(st.integers(0, len(log)))
    k2 = data.draw(st.integers(k1, len(log)))
    first = PagedMetrics("s", page_rows)
    for position, event in log[:k1]:
        first.apply(position, event)
    stored: dict[int, bytes] = {}
    second = _resume(first, stored, log[:k2], k1 - data.draw(st.integers(0, k1)))
    third = _resume(second, stored, log, k2 - data.draw(st.integers(0, k2)))
    assert msgspec.json.encode(third.projection.state) == msgspec.json.encode(one.projection.state)
    assert third.rows == list(one.projection.tasks.values())
    for index, page in third.unstored:
        assert stored.setdefault(index, page) == page
    assert stored == dict(one.unstored)
    assert len(stored) == max(0, len(one.rows) // page_rows - 1)
    # The head holds the rows not sealed yet and the sealed ones changed since: no more.
    head = third.head(0.0)
    assert msgspec.json.encode(head) == msgspec.json.encode(one.head(0.0))
    unsealed = {t.task_id for t in one.rows[head.pages * page_rows :]}
    assert unsealed <= head.state.tasks.keys()
    for tid in head.state.tasks.keys() - unsealed:
        sealed_as = next(
            t
            for i in range(head.pages)
            for t in msgspec.json.decode(stored[i], type=Page).tasks
            if t.task_id == tid
        )
        assert sealed_as != one.projection.tasks[tid], f"{tid} is in the head unchanged"


def test_a_head_carries_the_rows_not_sealed_and_the_sealed_rows_that_changed() -> None:
    tasks = [make_task(TaskSpec(f"seq-{i}", "g", ("pass",))) for i in range(7)]
    log = list(enumerate((e for events in tasks for e in events), 1))  # one after another
    paged = PagedMetrics("s", page_rows=2)
    for position, event in log:
        paged.apply(position, event)
    # Rows 0-1 are sealed when the 4th row appears, rows 2-3 when the 6th does.
    assert [index for index, _ in paged.unstored] == [0, 1]
    assert list(paged.head(0.0).state.tasks) == ["seq-4", "seq-5", "seq-6"]
    late = RewardAssigned(
        task_id="seq-0", seq=len(tasks[0]) + 1, reward_fn="r", version=1, value=1.0
    )
    paged.apply(len(log) + 1, late)
    assert list(paged.head(0.0).state.tasks) == ["seq-0", "seq-4", "seq-5", "seq-6"]


def test_rows_restored_from_pages_and_head_keep_their_names_once() -> None:
    paged = PagedMetrics("s", page_rows=1)  # "a" is sealed when "b" appears, "b" with "c"
    for position, event in enumerate(decoded_tasks("abc"), 1):
        paged.apply(position, event)
    head = msgspec.json.decode(msgspec.json.encode(paged.head(0.0)), type=Snapshot)
    pages = [msgspec.json.decode(data, type=Page) for _, data in paged.unstored]
    restored = PagedMetrics.restore(head, pages).projection.tasks
    assert [t.task_id for t in pages[0].tasks] == ["a"] and list(head.state.tasks) == ["c"]
    assert_names_kept_once(restored["a"], restored["c"])


# --------------------------------------------------------------------------- NATS

FIRST = [
    TaskSpec("rm-a", "g", ("mismatch", "pass"), speedup=2.0, record_rewards=True),
    TaskSpec("rm-b", "g", ("compile_error",)),
    TaskSpec("rm-c", "g", ("mismatch",), end="unfinished"),
]
SECOND = [
    TaskSpec("rm-d", "h", ("pass",), record_rewards=True),
    TaskSpec("rm-e", "h", (), end="cancelled"),
]


def query(bridge: Bridge) -> list[dict[str, Any]]:
    return bridge.call(query_status(bridge.requests, bridge.log), timeout=30).rows


def test_read_model_resumes_from_its_position_after_a_crash(
    private_nats: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = private_nats
    # Answers come in pages of two rows.
    monkeypatch.setattr("kernelflow.actors.readmodel_client.PAGE", 2)
    append(url, [make_task(s) for s in FIRST])
    bridge = Bridge(url, auth=role_auth(url, "daemon")).start()
    model = ReadModel(bridge, "first", snapshot_every_s=3600).start()
    assert model.rebuilt_because == "no snapshot yet"
    rows = query(bridge)
    assert [r["task_id"] for r in rows] == ["rm-a", "rm-b", "rm-c"]
    assert rows == folded_rows(bridge)
    assert bridge.call(model.save())
    saved = model.saved_position
    append(url, [make_task(s) for s in SECOND])
    rows = query(bridge)  # waits until the fold has applied everything recorded
    assert [r["task_id"] for r in rows] == ["rm-a", "rm-b", "rm-c", "rm-d", "rm-e"]
    assert model.position > saved
    # A crash: the process goes away with events folded after its last snapshot.
    model.stop(save=False)

    model = ReadModel(bridge, "second").start()
    assert model.restored_from == saved and model.rebuilt_because == ""
    again = query(bridge)
    assert again == rows == folded_rows(bridge)
    model.stop()  # a clean stop saves the position it reached
    assert model.saved_position == model.position > saved

    # A snapshot this code cannot trust (another fold version) is refolded from the start.
    async def plant_old_snapshot() -> None:
        store = await bridge.log.jetstream.object_store(subjects.READMODEL_BUCKET)
        stale = msgspec.json.decode((await store.get(SNAPSHOT)).data, type=Snapshot)
        stale.fold_version = FOLD_VERSION - 1
        await store.put(SNAPSHOT, msgspec.json.encode(stale))

    bridge.call(plant_old_snapshot())
    model = ReadModel(bridge, "third").start()
    assert "fold version" in model.rebuilt_because and model.restored_from == 0
    assert query(bridge) == rows
    model.stop()

    # No read model answers: `status` says so and folds the log itself.
    result = run_cli("status", "--json", *as_user("publisher", url))
    assert result.returncode == 0, result.stderr
    assert "no daemon runs a read model; folding the log here" in result.stderr
    # And with no daemon up, a task not over waits for one: queued, saying why.
    waiting = "no daemon answered: it waits for one (kernelflow daemon)"
    assert json.loads(result.stdout) == [
        {**row, "status": "queued", "reason": row["reason"] or waiting}
        if row["status"] == "running"
        else row
        for row in rows
    ]
    assert any(row["status"] == "running" for row in rows)  # one of them is
    bridge.stop()


def test_saves_write_each_page_once_and_a_restart_resumes_from_the_pages(
    private_nats: str,
) -> None:
    url = private_nats
    specs = [TaskSpec(f"pg-{i}", "g", ("mismatch", "pass"), record_rewards=True) for i in range(9)]
    for spec in specs[:5]:
        append(url, [make_task(spec)])  # one task after another
    bridge = Bridge(url, auth=role_auth(url, "daemon")).start()

    def stored() -> dict[str, str]:
        async def go() -> dict[str, str]:
            store = await bridge.log.jetstream.object_store(subjects.READMODEL_BUCKET)
            return {info.name: info.nuid for info in await store.list(ignore_deletes=True)}

        return bridge.call(go())

    def head() -> Snapshot:
        async def go() -> bytes:
            store = await bridge.log.jetstream.object_store(subjects.READMODEL_BUCKET)
            return (await store.get(SNAPSHOT)).data or b""

        return msgspec.json.decode(bridge.call(go()), type=Snapshot)

    page = [f"{SNAPSHOT}.rows2.page{i:06d}" for i in range(3)]
    model = ReadModel(bridge, "pager", snapshot_every_s=3600, page_rows=2).start()
    assert len(query(bridge)) == 5 and bridge.call(model.save())
    first = stored()
    assert first.keys() == {SNAPSHOT, page[0]}  # rows 0-1, sealed when row 4 appeared
    for spec in specs[5:]:
        append(url, [make_task(spec)])
    rows = query(bridge)
    assert len(rows) == 9 and bridge.call(model.save())
    second = stored()
    assert second.keys() == {SNAPSHOT, *page}
    assert second[page[0]] == first[page[0]]  # written once
    # The head holds the rows of no page (6-8): a save writes them, not the history.
    assert (head().pages, list(head().state.tasks)) == (3, ["pg-6", "pg-7", "pg-8"])
    model.stop(save=False)

    model = ReadModel(bridge, "restarted", snapshot_every_s=3600).start()
    assert model.restored_from == model.saved_position and model.rebuilt_because == ""
    assert query(bridge) == rows == folded_rows(bridge)
    model.stop(save=False)

    # A page gone (or damaged): the read model folds the log from the start, saying why.
    async def lose_page() -> None:
        store = await bridge.log.jetstream.object_store(subjects.READMODEL_BUCKET)
        await store.delete(page[1])

    bridge.call(lose_page())
    model = ReadModel(bridge, "refolded", snapshot_every_s=3600, page_rows=2).start()
    assert model.restored_from == 0
    assert model.rebuilt_because.startswith(f"snapshot page {page[1]} unreadable")
    assert query(bridge) == rows
    model.stop()
    again = stored()
    assert again.keys() == {SNAPSHOT, *page}  # stored again by the refold, the same bytes:
    assert again[page[0]] == first[page[0]] and again[page[1]] != second[page[1]]
    bridge.stop()


def test_read_models_of_one_log_share_its_pages_and_resume_from_each_others_heads(
    private_nats: str,
) -> None:
    """Two daemons' read models fold one log and save to one store: each seals the same
    pages, byte for byte, so either may have stored a page another's head counts."""
    url = private_nats
    specs = [TaskSpec(f"two-{i}", "g", ("mismatch", "pass"), record_rewards=True) for i in range(7)]
    append(url, [make_task(s) for s in specs[:4]])  # interleaved: sealed rows change later
    bridge = Bridge(url, auth=role_auth(url, "daemon")).start()

    def caught_up(*models: ReadModel) -> None:
        async def last() -> int:
            return int(
                (await bridge.log.jetstream.stream_info(subjects.EVENTS_STREAM)).state.last_seq
            )

        end = bridge.call(last())
        for model in models:
            assert bridge.call(model.caught_up(end, 30.0))

    def pages() -> dict[str, str]:
        async def go() -> dict[str, str]:
            store = await bridge.log.jetstream.object_store(subjects.READMODEL_BUCKET)
            infos = await store.list(ignore_deletes=True)
            return {i.name: i.nuid for i in infos if i.name != SNAPSHOT}

        return bridge.call(go())

    a = ReadModel(bridge, "a", snapshot_every_s=3600, page_rows=1).start()
    caught_up(a)
    assert bridge.call(a.save()) and len(pages()) == a.paged.pages == 3
    b = ReadModel(bridge, "b", snapshot_every_s=3600).start()  # resumes from a's head
    assert b.restored_from == a.saved_position
    append(url, [make_task(s) for s in specs[4:]])
    caught_up(a, b)
    assert bridge.call(b.save())  # stores pages 3-5 and its head
    stored = pages()
    assert len(stored) == b.paged.pages == a.paged.pages == 6
    assert not bridge.call(a.save())  # b's head is as far; a's pages are b's, not rewritten
    assert pages() == stored
    a.stop(save=False)
    b.stop(save=False)

    c = ReadModel(bridge, "c", snapshot_every_s=3600).start()
    assert c.restored_from == b.saved_position and c.rebuilt_because == ""
    assert query(bridge) == folded_rows(bridge)
    assert status_rows(c.projection) == status_rows(a.projection)
    c.stop(save=False)
    bridge.stop()


def test_status_waits_for_a_read_model_catching_up_while_it_moves(
    private_nats: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A daemon restarted after the log grew answers ``status`` once its read model has
    caught up: the query waits as long as it moves, and gives up when it does not. How
    many waits a real model needs is the machine's (a loaded one may fold the whole log
    before the first); the waits themselves are counted on a scripted model
    (tests/unit/test_status_query.py)."""
    url = private_nats
    append(url, [make_task(TaskSpec(f"cu-{i}", "g", ("pass",))) for i in range(150)])
    fold = PagedMetrics.apply

    def slow_fold(self: PagedMetrics, position: int, event: Event) -> bool:
        time.sleep(0.001)  # ~2 s for the whole log: several waits of 0.4 s
        return fold(self, position, event)

    monkeypatch.setattr(PagedMetrics, "apply", slow_fold)
    bridge = Bridge(url, auth=role_auth(url, "daemon")).start()
    try:
        model = ReadModel(bridge, "catching-up", snapshot_every_s=3600).start()
        seen: list[int] = []
        asking = query_status(bridge.requests, bridge.log, 0.4, lambda _, at, end: seen.append(at))
        answer = bridge.call(asking, timeout=60)
        assert seen == sorted(set(seen)), seen  # each wait found it further on
        assert answer.rows == folded_rows(bridge)
        model.stop(save=False)

        # One that stops moving (its reader gone): the query gives up, saying so.
        model = ReadModel(bridge, "stuck", snapshot_every_s=3600).start()
        time.sleep(0.3)
        bridge.call(cancel_and_wait(model._tasks[:1]))  # its reader
        with pytest.raises(NoAnswer, match=r"is catching up but did not move in 0\.1s"):
            bridge.call(query_status(bridge.requests, bridge.log, 0.1), timeout=60)
        model.stop(save=False)
    finally:
        bridge.stop()


def test_a_start_removes_the_snapshots_older_versions_left(
    private_nats: str, caplog: pytest.LogCaptureFixture
) -> None:
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()

    async def put(*names: str) -> None:
        js = bridge.log.jetstream
        try:
            store = await js.object_store(subjects.READMODEL_BUCKET)
        except nats.js.errors.BucketNotFoundError:
            store = await js.create_object_store(subjects.READMODEL_BUCKET)
        for name in names:
            await store.put(name, b"{}")

    async def names() -> set[str]:
        store = await bridge.log.jetstream.object_store(subjects.READMODEL_BUCKET)
        return {info.name for info in await store.list(ignore_deletes=True)}

    left = [
        f"status-v{FOLD_VERSION}",  # a whole state, from before heads and pages
        f"status-v{FOLD_VERSION - 1}.head",
        f"status-v{FOLD_VERSION - 1}.head.rows1000.page000000",
    ]
    kept = [f"status-v{FOLD_VERSION + 1}.head", "status-notes"]  # a newer version's; not ours
    bridge.call(put(*left, *kept))
    time.sleep(1.5)
    # Written just now: a daemon of that version may be running and saving it.
    recent = f"status-v{FOLD_VERSION - 2}"
    bridge.call(put(recent))
    try:
        with caplog.at_level(logging.INFO, logger="kernelflow.readmodel"):
            model = ReadModel(bridge, "sweeper", snapshot_every_s=3600, stale_after_s=1.0).start()
            deadline = time.monotonic() + 10
            while bridge.call(names()) != {*kept, recent} and time.monotonic() < deadline:
                time.sleep(0.1)
            assert bridge.call(names()) == {*kept, recent}
            model.stop(save=False)
        assert (
            f"removed 3 snapshot object(s) older versions left in {subjects.READMODEL_BUCKET}"
            in caplog.text
        )
    finally:
        bridge.stop()


def folded_rows(bridge: Bridge) -> list[dict[str, Any]]:
    """The rows a fold of the whole log gives, as `status` computes them with no daemon."""
    return status_rows(metrics_of(LiveSource(bridge, EventFilter())))


def read_rows(url: str) -> list[dict[str, Any]]:
    bridge = Bridge(url, auth=role_auth(url, "reader")).start()
    try:
        return folded_rows(bridge)
    finally:
        bridge.stop()


def status(url: str) -> tuple[list[dict[str, Any]], str]:
    result = run_cli("status", "--json", *as_user("publisher", url))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def health(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        result = run_cli(
            "health", "--json", *as_user("reader", url), "--wait", "0.5", "--min-daemons", "1"
        )
        if result.returncode == 0 or time.monotonic() > deadline:
            assert result.returncode == 0, result.stdout + result.stderr
            report: dict[str, Any] = json.loads(result.stdout)
            return report


async def publish_submit(url: str, command: SubmitTask) -> None:
    nc = await connect(url, "publisher")
    try:
        await nc.jetstream().publish(subjects.SUBMIT, encode(command))
    finally:
        await nc.close()


def test_a_stop_that_cannot_finish_is_cut_short_and_says_what_it_waited_for(
    private_nats: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon's stop must fit in its service's stop timeout: a read model whose stop
    hangs (here a task that ignores cancellation, as ``asyncio.wait_for`` can on Python
    3.11) gives up at its bound and says where it was."""
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    try:
        model = ReadModel(bridge, "stuck", snapshot_every_s=3600).start()

        async def plant_deaf_task() -> asyncio.Event:
            release = asyncio.Event()

            async def deaf() -> None:
                while not release.is_set():
                    with contextlib.suppress(asyncio.CancelledError):
                        await release.wait()

            model._tasks.append(asyncio.create_task(deaf()))
            return release

        release = bridge.call(plant_deaf_task())
        began = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kernelflow.readmodel"):
            model.stop(timeout_s=1.0)
        assert time.monotonic() - began < 10.0  # not forever, as the deaf task would have it
        assert (
            "read model: stop did not finish within 1s "
            "(waiting for its reader and queries to stop: TimeoutError"
        ) in caplog.text
        bridge.loop.call_soon_threadsafe(release.set)
    finally:
        bridge.stop()


def test_a_read_model_stopped_as_it_starts_stops_at_once(private_nats: str) -> None:
    """On Python 3.11, ``asyncio.wait_for`` (in every nats-py request) swallows a
    cancellation that arrives together with its answer, and the task goes on: a read
    model stopped just after it started then waited out its whole stop timeout."""
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    try:
        for i in range(6):  # the race itself, as it happens (most of the time)
            model = ReadModel(bridge, f"quick-{i}", snapshot_every_s=3600).start()
            began = time.monotonic()
            model.stop(timeout_s=30.0)  # waiting it out is far from stopping at once
            assert time.monotonic() - began < 10.0, f"stop {i} waited"
        # And every time: a task that swallows one cancellation, as wait_for does.
        model = ReadModel(bridge, "swallower", snapshot_every_s=3600).start()

        async def plant_swallowing_task() -> None:
            async def swallows_one() -> None:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(3600)
                await asyncio.sleep(3600)

            model._tasks.append(asyncio.create_task(swallows_one()))

        bridge.call(plant_swallowing_task())
        began = time.monotonic()
        model.stop(timeout_s=30.0)
        assert time.monotonic() - began < 10.0
    finally:
        bridge.stop()


def test_daemon_answers_status_and_keeps_counting_once_across_a_restart(
    private_nats: str, tmp_path: Path
) -> None:
    url = private_nats
    candidate = EXAMPLES / "candidates" / "solutions" / "relu.py"
    daemon = start_daemon(url, tmp_path / "daemon-1.log")
    try:
        submit(url, "rm-run-1", "--workflow", "verifier_only", "--candidate", str(candidate))
        first = wait_until_settled(url, "rm-run-1")
        rows, stderr = status(url)
        assert stderr == ""  # the daemon's read model answered
        assert rows == [
            {
                "task_id": "rm-run-1",
                "status": "success",
                "steps": 1,
                "verdict": "pass",
                "speedup": None,
                "speedup_conclusive": None,  # Triton on the CPU: not timed
                "speedup_ci95": [],
                "sol_fraction": None,  # not timed: no fraction of the speed of light
                "reason": "verification passed",
                "verifications": ["pass"],
                "rechecks": [],
                "events": len(first),
                "forked_from": None,  # no fork (docs/workflows.md, "Forking a task")
            }
        ]
    finally:
        daemon.terminate()  # a clean stop: the read model saves its position
        daemon.wait(30)

    daemon = start_daemon(url, tmp_path / "daemon-2.log")
    try:
        (answer,) = health(url)["daemons"]
        assert answer["read_model"]["restored_from"] > 0
        # A task the daemon rejects, from a publisher of its own (the CLI refuses the file).
        broken = SubmitTask(task_id="rm-run-2", task_source="import torch\ndef get_inputs(:\n")
        asyncio.run(publish_submit(url, broken))
        second = wait_until_settled(url, "rm-run-2")
        rows, stderr = status(url)
        assert stderr == ""
        assert [(r["task_id"], r["status"], r["events"]) for r in rows] == [
            ("rm-run-1", "success", len(first)),
            ("rm-run-2", "rejected", len(second)),
        ]
        assert rows == read_rows(url)  # what a fold of the whole log says
    finally:
        daemon.kill()
        daemon.wait(30)
