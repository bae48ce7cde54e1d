"""Progress of long reads: the line's content and pace on a fake clock, and the real CLI
showing it on a terminal (a pseudo-terminal) and nowhere else."""

from __future__ import annotations

import io
import os
import pty
import subprocess
from pathlib import Path

from kernelflow.events.model import Event
from kernelflow.progress import ProgressLine, for_terminal
from kernelflow.projections import logfile
from tests.conftest import KERNELFLOW, REPO, as_user, cli_env
from tests.integration.test_export_log import append
from tests.unit.test_projections_props import TaskSpec, interleave, make_task


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drawn(out: io.StringIO) -> list[str]:
    """The lines drawn, in order (each redraw starts with CR + erase-line)."""
    return [line for line in out.getvalue().split("\r\x1b[K") if line]


def test_progress_shows_position_rate_and_time_left_at_its_pace() -> None:
    out, clock = io.StringIO(), Clock()
    progress = ProgressLine(out, every_s=0.5, clock=clock)
    with progress.phase("exporting", 10_000) as update:
        update(1)  # shown at once: a phase is never silent
        clock.now += 0.1
        update(500)  # not due yet
        clock.now += 0.4
        update(2_001)  # 2,000 events in 0.5 s: 4,000/s, 8,000 to go
        clock.now += 3.0
        update(10_000)
    assert drawn(out) == [
        "exporting: event 1 of 10,000 (0%)",
        "exporting: event 2,001 of 10,000 (20%), 4,000 events/s, about 2s left",
        "exporting: event 10,000 of 10,000 (100%), 2,857 events/s",
    ]
    assert out.getvalue().endswith("\r\x1b[K")  # erased at the end: the output stays clean


def test_progress_says_minutes_and_hours_for_long_reads() -> None:
    out, clock = io.StringIO(), Clock()
    with ProgressLine(out, clock=clock).phase("reading", 10_000_000) as update:
        update(1)
        clock.now += 10
        update(1_001)  # 100 events/s
        clock.now += 90
        update(100_001)  # 1,000 events/s
    assert drawn(out)[1].endswith("about 27h46m left")
    assert drawn(out)[2].endswith("about 2h45m left")


def test_progress_counts_other_units_when_told() -> None:
    out, clock = io.StringIO(), Clock()
    with ProgressLine(out, clock=clock).phase("reading the target", 400, "task") as update:
        update(1)
        clock.now += 1
        update(101)
    assert drawn(out)[1] == "reading the target: task 101 of 400 (25%), 100 tasks/s, about 3s left"


def test_progress_only_on_a_terminal() -> None:
    assert for_terminal(io.StringIO()) is None
    primary, secondary = pty.openpty()
    try:
        with os.fdopen(secondary, "w", closefd=False) as tty:
            assert for_terminal(tty) is not None
    finally:
        os.close(primary)
        os.close(secondary)


def test_report_shows_its_progress_on_a_terminal_and_nowhere_else(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    writer = logfile.LogWriter()
    events = some_events()
    path.write_bytes(b"".join([writer.header(), *map(writer.record, events), writer.trailer()]))
    report = [*KERNELFLOW, "report", "--from", str(path)]

    piped = subprocess.run(report, cwd=REPO, env=cli_env(), capture_output=True, timeout=120)
    assert piped.returncode == 0 and piped.stderr == b""
    stdout, terminal = on_a_terminal(report)
    assert stdout == piped.stdout  # the report itself is the same
    assert f"reading: event 1 of {len(events)}".encode() in terminal
    assert terminal.endswith(b"\r\x1b[K")


def test_status_folding_the_log_itself_shows_its_progress(private_nats: str) -> None:
    """With no daemon to answer, `status` reads the whole log: on a big one, minutes."""
    histories = [make_task(TaskSpec(f"s{i}", f"g{i % 3}", ("pass",))) for i in range(20)]
    append(private_nats, histories)
    status = [*KERNELFLOW, "status", *as_user("publisher", private_nats)]

    piped = subprocess.run(status, cwd=REPO, env=cli_env(), capture_output=True, timeout=120)
    assert piped.returncode == 0
    assert b"folding the log here" in piped.stderr and b"reading:" not in piped.stderr
    stdout, terminal = on_a_terminal(status)
    assert stdout == piped.stdout
    total = sum(map(len, histories))
    assert f"reading: event 1 of {total}".encode() in terminal


def some_events() -> list[Event]:
    specs = [TaskSpec(f"p{i}", f"g{i % 3}", ("mismatch", "pass")) for i in range(40)]
    return [e for _, e in interleave([make_task(spec) for spec in specs], seed=1)]


def on_a_terminal(command: list[str]) -> tuple[bytes, bytes]:
    """Run the CLI with its stderr on a pseudo-terminal: its stdout, and what the terminal
    received."""
    primary, secondary = pty.openpty()
    with subprocess.Popen(
        command, cwd=REPO, env=cli_env(), stdout=subprocess.PIPE, stderr=secondary
    ) as proc:
        os.close(secondary)
        stdout = proc.stdout.read() if proc.stdout else b""
        terminal = b""
        while chunk := _read(primary):
            terminal += chunk
    os.close(primary)
    assert proc.returncode == 0, terminal
    return stdout, terminal


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # the other end closed (EIO on Linux)
        return b""
