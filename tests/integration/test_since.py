"""``--since TIME`` on ``log export``, ``report`` and ``export grpo``: the tasks that began
at or after TIME, whole, from the live log (JetStream ``BY_START_TIME``) or a file (by
event time)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kernelflow.cli.main import main as kernelflow_main
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import Event
from kernelflow.offline.since import BadTime, parse_since
from tests.conftest import as_user, connect
from tests.unit.test_projections_props import TaskSpec, make_task

NOW = 1_750_000_000.0


def test_parse_since() -> None:
    assert parse_since("90s", now=NOW) == NOW - 90
    assert parse_since("1h30m", now=NOW) == NOW - 5400
    assert parse_since("2d", now=NOW) == NOW - 2 * 86400
    assert parse_since("0.5h", now=NOW) == NOW - 1800
    assert (
        parse_since("2025-06-01T12:00:00Z", now=NOW)
        == datetime(2025, 6, 1, 12, tzinfo=UTC).timestamp()
    )
    local = datetime(2025, 6, 1, 12, 0).astimezone().timestamp()
    assert parse_since("2025-06-01T12:00", now=NOW) == local
    assert parse_since("2025-06-01 12:00", now=NOW) == local
    for bad in ["yesterday", "", "2h ago", "10", "h", "2025-13-01"]:
        with pytest.raises(BadTime, match="not a time"):
            parse_since(bad, now=NOW)
    with pytest.raises(BadTime, match="in the future"):
        parse_since("2999-01-01", now=NOW)


def append_in_phases(url: str, phases: list[list[Event]], pause_s: float) -> list[float]:
    """Append each phase's events (tasks continue across phases); return the times
    between phases."""

    async def go() -> list[float]:
        nc = await connect(url, "daemon")  # appending: a daemon's work
        marks = []
        try:
            log = EventLog(nc)
            await log.ensure_streams()
            known: dict[str, TaskHistory] = {}
            for i, phase in enumerate(phases):
                if i:
                    await asyncio.sleep(pause_s)
                    marks.append(time.time())
                    await asyncio.sleep(pause_s)
                for e in phase:
                    h = known.get(e.task_id) or TaskHistory(e.task_id)
                    known[e.task_id] = await log.append(h, [e])
        finally:
            await nc.close()
        return marks

    return asyncio.run(go())


def tasks_in(path: Path) -> set[str]:
    return {json.loads(x)["task_id"] for x in path.read_bytes().splitlines()[1:-1]}


def test_since_selects_the_tasks_that_began_after_it(
    private_nats: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = make_task(TaskSpec("s-old", "g", ("pass",), record_rewards=True))
    spanning = make_task(TaskSpec("s-span", "g", ("mismatch", "pass")))
    new = make_task(TaskSpec("s-new", "g", ("compile_error",), record_rewards=True))
    half = len(spanning) // 2
    (mark,) = append_in_phases(
        private_nats, [[*old, *spanning[:half]], [*spanning[half:], *new]], pause_s=0.3
    )
    since = datetime.fromtimestamp(mark, UTC).isoformat()

    def cli(*args: str) -> int:  # reading the log
        return kernelflow_main([*args, *as_user("reader", private_nats)])

    live = tmp_path / "live.jsonl"
    assert cli("log", "export", "--since", since, "--out", str(live)) == 0
    # A task that began before the time is left out whole, even with events after it.
    assert tasks_in(live) == {"s-new"}
    header = json.loads(live.read_bytes().splitlines()[0])
    assert header["filter"] == {"since": since.replace("+00:00", "Z")}
    assert kernelflow_main(["log", "verify", str(live)]) == 0  # still a valid log file

    everything = tmp_path / "all.jsonl"
    assert cli("log", "export", "--out", str(everything)) == 0
    from_file = tmp_path / "file.jsonl"
    args = ["log", "export", "--from", str(everything), "--since", since, "--out", str(from_file)]
    assert kernelflow_main(args) == 0
    assert from_file.read_bytes() == live.read_bytes()  # by event time, the same selection

    capsys.readouterr()
    assert cli("report", "--json", "--since", since) == 0
    assert [t["task_id"] for t in json.loads(capsys.readouterr().out)["tasks"]] == ["s-new"]
    assert cli("report", "--json", "--since", "1h") == 0
    tasks = {t["task_id"] for t in json.loads(capsys.readouterr().out)["tasks"]}
    assert tasks == {"s-old", "s-span", "s-new"}
    assert cli("report", "--json", "--since", "2999-01-01T00:00:00Z") == 2
    assert "--since '2999-01-01T00:00:00Z' is in the future" in capsys.readouterr().err

    data = tmp_path / "since.jsonl"
    assert cli("export", "grpo", "--since", since, "--out", str(data), "--json") == 0
    meta = json.loads(capsys.readouterr().out)
    assert meta["source"]["since"] == since.replace("+00:00", "Z")
    assert {json.loads(x)["rollout_id"] for x in data.read_bytes().splitlines()} == {"s-new"}

    assert cli("log", "export", "--since", "last tuesday", "--out", str(tmp_path / "x")) == 2
    err = capsys.readouterr().err
    assert "--since 'last tuesday': not a time" in err and "30m" in err
    assert not (tmp_path / "x").exists()
