"""``log export`` / ``log import`` / ``report`` / ``export grpo`` against real nats-servers,
on synthetic tasks appended with the EventLog."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kernelflow.cli.main import main as kernelflow_main
from kernelflow.events import subjects
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import Event
from kernelflow.host.exits import UsageError
from kernelflow.offline.files import verify_file
from kernelflow.offline.log_import import ImportConflict, import_file
from kernelflow.offline.sources import EventFilter, FileSource
from kernelflow.projections import logfile
from tests.conftest import (
    KERNELFLOW,
    REPO,
    as_user,
    cli_env,
    connect,
    keyed_nats,
    keyed_nats_server,
)
from tests.daemons import stream_messages
from tests.unit.test_projections_props import TaskSpec, make_task

SPECS = [
    TaskSpec("x-a", "g1", ("mismatch", "pass"), speedup=2.0, record_rewards=True),
    TaskSpec("x-b", "g1", ("compile_error",)),
    TaskSpec("x-c", "g1", ("rejected_static", "pass"), speedup=1.5),
    TaskSpec("x-d", "g2", ("pass",), workflow="coder_only"),
    TaskSpec("x-e", "g2", ("mismatch",), end="unfinished"),
]


def append(url: str, histories: list[list[Event]]) -> None:
    """Append the tasks' events as a daemon records them."""

    async def go() -> None:
        nc = await connect(url, "daemon")
        try:
            log = EventLog(nc)
            await log.ensure_streams()
            known = {h[0].task_id: TaskHistory(h[0].task_id) for h in histories}
            # Interleave the tasks one event at a time, as concurrent tasks are recorded.
            for i in range(max(map(len, histories))):
                for h in histories:
                    if i < len(h):
                        tid = h[i].task_id
                        known[tid] = await log.append(known[tid], [h[i]])
        finally:
            await nc.close()

    asyncio.run(go())


def cli(*args: str) -> int:
    return kernelflow_main(list(args))


@pytest.fixture
def second_nats(tmp_path: Path) -> Iterator[str]:
    with keyed_nats(tmp_path / "nats-2") as url:
        yield url


@pytest.fixture
def source_url(private_nats: str) -> str:
    append(private_nats, [make_task(s) for s in SPECS])
    return private_nats


def test_export_import_export_is_identical_and_idempotent(
    source_url: str, second_nats: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert cli("log", "export", "--out", str(a), *as_user("reader", source_url)) == 0
    assert "of 5 tasks" in capsys.readouterr().out
    lines = a.read_bytes().splitlines()
    assert json.loads(lines[0])["format"] == "kernelflow-log"
    assert (
        json.loads(lines[-1])["records"] == len(lines) - 2 == sum(len(make_task(s)) for s in SPECS)
    )

    assert cli("log", "import", str(a), *as_user("daemon", second_nats)) == 0
    assert f"{len(lines) - 2} events appended, 0 already present" in capsys.readouterr().out
    assert cli("log", "import", str(a), *as_user("daemon", second_nats)) == 0
    assert f"0 events appended, {len(lines) - 2} already present" in capsys.readouterr().out

    assert cli("log", "export", "--out", str(b), *as_user("reader", second_nats)) == 0
    assert a.read_bytes() == b.read_bytes()
    # gzip output is deterministic too, and readable as a source.
    gz1, gz2 = tmp_path / "1.jsonl.gz", tmp_path / "2.jsonl.gz"
    for gz in (gz1, gz2):
        assert cli("log", "export", "--out", str(gz), *as_user("reader", source_url)) == 0
    assert gz1.read_bytes() == gz2.read_bytes()
    assert cli("log", "export", "--from", str(gz1), "--out", str(tmp_path / "c.jsonl")) == 0
    assert (tmp_path / "c.jsonl").read_bytes() == a.read_bytes()


def test_filtered_exports(source_url: str, tmp_path: Path) -> None:
    out = tmp_path / "g2.jsonl"
    assert (
        cli("log", "export", "--group", "g2", "--out", str(out), *as_user("reader", source_url))
        == 0
    )
    tasks = {json.loads(x)["task_id"] for x in out.read_bytes().splitlines()[1:-1]}
    assert tasks == {"x-d", "x-e"}
    assert json.loads(out.read_bytes().splitlines()[0])["filter"] == {"group": "g2"}
    one = tmp_path / "one.jsonl"
    assert (
        cli("log", "export", "--task", "x-a", "--out", str(one), *as_user("reader", source_url))
        == 0
    )
    assert {json.loads(x)["task_id"] for x in one.read_bytes().splitlines()[1:-1]} == {"x-a"}
    wf = tmp_path / "wf.jsonl"
    assert (
        cli("log", "export", "--from", str(out), "--workflow", "coder_only", "--out", str(wf)) == 0
    )
    assert {json.loads(x)["task_id"] for x in wf.read_bytes().splitlines()[1:-1]} == {"x-d"}


def test_corrupt_or_conflicting_imports_are_refused_whole(
    source_url: str, second_nats: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.jsonl"
    assert cli("log", "export", "--out", str(a), *as_user("reader", source_url)) == 0
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(a.read_bytes().replace(b'"mismatch"', b'"pass"', 1))
    assert cli("log", "import", str(bad), *as_user("daemon", second_nats)) == 2
    assert "SHA-256 mismatch" in capsys.readouterr().err
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"".join(a.read_bytes().splitlines(keepends=True)[:-3]))
    assert cli("log", "import", str(cut), *as_user("daemon", second_nats)) == 2
    assert "truncated" in capsys.readouterr().err
    assert cli("log", "verify", str(cut)) == 2

    # The target already has task x-b with another history: nothing at all is imported.
    append(second_nats, [make_task(TaskSpec("x-b", "g9", ("pass",)))])
    assert cli("log", "import", str(a), *as_user("daemon", second_nats)) == 2
    assert "x-b already exists" in capsys.readouterr().err
    out = tmp_path / "after.jsonl"
    assert cli("log", "export", "--out", str(out), *as_user("reader", second_nats)) == 0
    assert {json.loads(x)["task_id"] for x in out.read_bytes().splitlines()[1:-1]} == {"x-b"}


def test_import_continues_what_the_target_holds_and_stops_at_a_concurrent_writer(
    source_url: str, second_nats: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.jsonl"
    assert cli("log", "export", "--out", str(a), *as_user("reader", source_url)) == 0
    # The target holds the start of x-a (an earlier import of part of it): the import adds
    # the rest after it.
    x_a = [e for _, e in logfile.read_events(a.read_bytes().splitlines(keepends=True))]
    x_a = [e for e in x_a if e.task_id == "x-a"]
    start = tmp_path / "start.jsonl"
    writer = logfile.LogWriter()
    start.write_bytes(b"".join([writer.header(), *map(writer.record, x_a[:3]), writer.trailer()]))
    assert cli("log", "import", str(start), *as_user("daemon", second_nats)) == 0
    assert cli("log", "import", str(a), *as_user("daemon", second_nats)) == 0
    total = sum(len(make_task(s)) for s in SPECS)
    assert f"{total - 3} events appended, 3 already present" in capsys.readouterr().out
    b = tmp_path / "b.jsonl"
    assert cli("log", "export", "--out", str(b), *as_user("reader", second_nats)) == 0
    records = sorted(a.read_bytes().splitlines()[1:-1])
    assert sorted(b.read_bytes().splitlines()[1:-1]) == records

    # Another writer appends to x-a after the import read the target: refused, not merged.
    with keyed_nats(tmp_path / "nats-3") as third:
        assert cli("log", "import", str(start), *as_user("daemon", third)) == 0

        async def go() -> None:
            importer, writer = await connect(third, "daemon"), await connect(third, "daemon")
            log, other = EventLog(importer), EventLog(writer)
            read = log.read_task

            async def read_then_someone_writes(task_id: str) -> TaskHistory:
                history = await read(task_id)
                if task_id == "x-a":
                    await other.append(await other.read_task("x-a"), [x_a[3]])
                return history

            log.read_task = read_then_someone_writes  # type: ignore[method-assign]
            try:
                with pytest.raises(ImportConflict, match="written to by someone"):
                    await import_file(log, a, verify_file(a))
            finally:
                await importer.close()
                await writer.close()

        asyncio.run(go())


def test_an_import_cut_by_a_nats_crash_says_so_and_the_next_one_finishes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.jsonl"
    specs = [TaskSpec(f"f{i:04d}", f"g{i % 50}", ("mismatch", "pass")) for i in range(2000)]
    histories = [make_task(spec) for spec in specs]
    events = [h[k] for k in range(max(map(len, histories))) for h in histories if k < len(h)]
    writer = logfile.LogWriter()
    path.write_bytes(b"".join([writer.header(), *map(writer.record, events), writer.trailer()]))
    with socket.socket() as probe:  # a free port the restarted server can take again
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with keyed_nats_server(tmp_path / "nats", streams=False, port=port) as server:
        url = server.url
        importing = subprocess.Popen(
            [*KERNELFLOW, "log", "import", str(path), *as_user("daemon", url)],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while stream_messages(url, subjects.EVENTS_STREAM) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(server.pid or 0, signal.SIGKILL)
        server.stop()
        out, err = importing.communicate(timeout=120)
        assert importing.returncode == 1, out + err
        assert "import again to continue" in err and "Traceback" not in err, err

        assert server.start() == url
        assert cli("log", "import", str(path), *as_user("daemon", url)) == 0
        counts = re.search(r"(\d+) events appended, (\d+) already", capsys.readouterr().out)
        assert counts is not None
        appended, present = int(counts[1]), int(counts[2])
        assert present > 0 and appended > 0 and appended + present == len(events)
        again = tmp_path / "again.jsonl"
        assert cli("log", "export", "--out", str(again), *as_user("reader", url)) == 0
        assert again.read_bytes() == path.read_bytes()  # all of it, in the file's order


def test_report_and_dataset_from_live_log_and_file_agree(
    source_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = tmp_path / "a.jsonl"
    assert cli("log", "export", "--out", str(a), *as_user("reader", source_url)) == 0
    capsys.readouterr()
    assert cli("report", "--json", *as_user("reader", source_url)) == 0
    live = json.loads(capsys.readouterr().out)
    assert cli("report", "--json", "--from", str(a)) == 0
    assert json.loads(capsys.readouterr().out) == live
    assert live["overall"]["tasks"] == 5 and live["overall"]["running"] == 1
    assert live["overall"]["correctness_rate"] == pytest.approx(3 / 4)
    assert live["per_workflow"]["coder_only"]["tasks"] == 1
    assert cli("report", "--from", str(a)) == 0
    text = capsys.readouterr().out
    assert "workflow coder_only" in text and "x-e" in text and "fast_1.5" in text

    outs = []
    for name, extra in [
        ("live.parquet", [*as_user("reader", source_url)]),
        ("file.parquet", ["--from", str(a)]),
    ]:
        out = tmp_path / name
        assert (
            cli(
                "export",
                "grpo",
                "--out",
                str(out),
                "--reward",
                "speedup",
                "--agents",
                "coder",
                *extra,
            )
            == 0
        )
        outs.append(out)
    rows = pq.read_table(outs[0]).to_pylist()
    assert pq.read_table(outs[1]).to_pylist() == rows
    assert sorted((r["rollout_id"], r["turn_index"]) for r in rows) == [
        ("x-a", 0),
        ("x-a", 1),
        ("x-b", 0),
        ("x-c", 0),
        ("x-c", 1),
        ("x-d", 0),
    ]
    by_task = {r["rollout_id"]: r for r in rows}
    assert by_task["x-a"]["reward"] == 2.0 and by_task["x-a"]["reward_source"] == "recorded"
    assert by_task["x-c"]["reward"] == 1.5 and by_task["x-c"]["reward_source"] == "computed"
    g1 = [by_task[t]["advantage"] for t in ("x-a", "x-b", "x-c")]
    assert sum(g1) == pytest.approx(0.0, abs=1e-9) and g1[0] > g1[2] > 0 > g1[1]
    assert by_task["x-d"]["advantage"] == 0.0  # alone in its group once x-e is left out
    assert by_task["x-a"]["response_token_ids"] == [1, 2, 3]
    meta = json.loads((tmp_path / "live.parquet.meta.json").read_text())
    assert meta["drops"]["unfinished"] == 1 and meta["reward_sources"] == {
        "computed": 3,
        "recorded": 1,
    }


def test_bad_options_are_refused(
    source_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.parquet"
    assert (
        cli("export", "grpo", "--out", str(out), "--reward", "nope", *as_user("reader", source_url))
        == 2
    )
    assert "unknown reward function" in capsys.readouterr().err
    assert (
        cli("export", "grpo", "--out", str(tmp_path / "x.csv"), *as_user("reader", source_url)) == 2
    )
    assert cli("replay", "--task", "nope", *as_user("reader", source_url)) == 2
    assert not out.exists() and not list(tmp_path.glob(".*partial*"))


def test_tools_reading_a_file_refuse_it_modified_or_out_of_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The digest is checked before anything is folded; an export whose digest matches but
    whose events are out of order (an exporter's bug) is refused when the replay reaches
    it, and leaves no dataset behind."""
    events = make_task(TaskSpec("o-a", "g", ("mismatch", "pass"), speedup=1.5))
    writer = logfile.LogWriter()
    good = tmp_path / "good.jsonl"
    good.write_bytes(
        b"".join([writer.header(), *(writer.record(e) for e in events), writer.trailer()])
    )
    modified = tmp_path / "modified.jsonl"
    modified.write_bytes(good.read_bytes().replace(b'"mismatch"', b'"pass"', 1))
    writer = logfile.LogWriter()
    swapped = [events[0], *events[2:5], events[1], *events[5:]]
    misordered = tmp_path / "misordered.jsonl"
    misordered.write_bytes(
        b"".join([writer.header(), *(writer.record(e) for e in swapped), writer.trailer()])
    )
    assert cli("report", "--from", str(good)) == 0
    capsys.readouterr()
    assert cli("report", "--from", str(modified)) == 2
    assert "SHA-256 mismatch" in capsys.readouterr().err
    out = tmp_path / "d.parquet"
    assert cli("export", "grpo", "--out", str(out), "--from", str(misordered)) == 2
    assert "out of order" in capsys.readouterr().err
    assert not out.exists()
    assert cli("replay", "--task", "o-a", "--from", str(misordered)) == 2
    assert "out of order" in capsys.readouterr().err


def test_a_fold_collects_garbage_rarely_and_restores_the_collector(tmp_path: Path) -> None:
    """Folding a log runs the cyclic collector rarely (it would rescan the events each task
    keeps, again and again); the process's own setting is back once the feed ends, also
    when it ends on a corrupt record."""
    events = make_task(TaskSpec("gc-a", "g", ("mismatch", "pass"), speedup=1.5))
    writer = logfile.LogWriter()
    good = tmp_path / "good.jsonl"
    good.write_bytes(
        b"".join([writer.header(), *(writer.record(e) for e in events), writer.trailer()])
    )
    writer = logfile.LogWriter()
    misordered = tmp_path / "misordered.jsonl"
    misordered.write_bytes(
        b"".join(
            [writer.header(), *(writer.record(e) for e in [events[1], events[0]]), writer.trailer()]
        )
    )
    before = gc.get_threshold()
    seen: list[int] = []
    source = FileSource(good, EventFilter())
    assert source.feed(lambda _pos, _event: seen.append(gc.get_threshold()[0])) == len(events)
    assert len(seen) == len(events) and min(seen) >= 50 * before[0]
    assert gc.get_threshold() == before
    with pytest.raises(UsageError, match="out of order"):
        FileSource(misordered, EventFilter()).feed(lambda *_: None)
    assert gc.get_threshold() == before
