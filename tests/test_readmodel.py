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
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.bridge import Bridge
from actors.readmodel import (
    BUCKET,
    SNAPSHOT,
    ReadModel,
    Snapshot,
    query_status,
    status_row,
    status_rows,
)
from events import subjects
from events.codec import encode
from events.model import Event, SubmitTask
from kernelflow.cli import summary
from kernelflow.offline_cmd import EventFilter, LiveSource, metrics_of
from projections.metrics import FOLD_VERSION, MetricsProjection
from projections.task_state import fold
from tests.conftest import EXAMPLES, run_cli
from tests.daemons import start_daemon, submit, wait_until_settled
from tests.test_export_log import append
from tests.test_projections_props import FAST, TaskSpec, logs, make_task

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
    return bridge.call(query_status(bridge.nc, bridge.log.jetstream), timeout=30).rows


def test_read_model_resumes_from_its_position_after_a_crash(
    private_nats: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = private_nats
    monkeypatch.setattr("actors.readmodel.PAGE", 2)  # answers come in pages of two rows
    append(url, [make_task(s) for s in FIRST])
    bridge = Bridge(url).start()
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
        store = await bridge.log.jetstream.object_store(BUCKET)
        stale = msgspec.json.decode((await store.get(SNAPSHOT)).data, type=Snapshot)
        stale.fold_version = FOLD_VERSION - 1
        await store.put(SNAPSHOT, msgspec.json.encode(stale))

    bridge.call(plant_old_snapshot())
    model = ReadModel(bridge, "third").start()
    assert "fold version" in model.rebuilt_because and model.restored_from == 0
    assert query(bridge) == rows
    model.stop()

    # No read model answers: `status` says so and folds the log itself.
    result = run_cli("status", "--json", "--nats-url", url)
    assert result.returncode == 0, result.stderr
    assert "no daemon runs a read model; folding the log here" in result.stderr
    assert json.loads(result.stdout) == rows
    bridge.stop()


def folded_rows(bridge: Bridge) -> list[dict[str, Any]]:
    """The rows a fold of the whole log gives, as `status` computes them with no daemon."""
    return status_rows(metrics_of(LiveSource(bridge, EventFilter())))


def read_rows(url: str) -> list[dict[str, Any]]:
    bridge = Bridge(url).start()
    try:
        return folded_rows(bridge)
    finally:
        bridge.stop()


def status(url: str) -> tuple[list[dict[str, Any]], str]:
    result = run_cli("status", "--json", "--nats-url", url)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), result.stderr


def health(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        result = run_cli("health", "--json", "--nats-url", url, "--wait", "0.5")
        if result.returncode == 0 or time.monotonic() > deadline:
            assert result.returncode == 0, result.stdout + result.stderr
            report: dict[str, Any] = json.loads(result.stdout)
            return report


async def publish_submit(url: str, command: SubmitTask) -> None:
    nc = await nats.connect(url)
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
    bridge = Bridge(private_nats).start()
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
        assert time.monotonic() - began < 3.0
        assert (
            "read model: stop did not finish within 1s "
            "(waiting for its reader and queries to stop: TimeoutError"
        ) in caplog.text
        bridge.loop.call_soon_threadsafe(release.set)
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
                "reason": "verification passed",
                "verifications": ["pass"],
                "events": len(first),
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
