"""A daemon under a fuzz of what any NATS publisher may send (``bench/fuzz_daemon.py``:
the same fuzz, 10,000 messages, with its figures) stays up, answers every command, query
and ping once and within seconds, keeps its memory, and logs one line per message it
refuses, never a traceback."""

from __future__ import annotations

from pathlib import Path

from bench.fuzz_daemon import fuzz
from tests.test_log_attacks import running_daemon

MESSAGES = 2000


def test_a_daemon_answers_all_of_a_fuzz_once_within_seconds(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    with running_daemon(private_nats, log, "--roles", "conductor,designer,coder") as daemon:
        report = fuzz(private_nats, daemon.pid, log, MESSAGES)
        assert daemon.poll() is None, log.read_text()[-3000:]
    shown = "\n".join(report.lines())
    assert report.unanswered == 0 and report.answered_twice == 0, shown
    assert report.percentile_s(0.99) < 10.0, shown
    assert report.tracebacks == 0, shown
    assert report.refusal_lines <= report.log_lines <= report.refused + 20, shown
    assert report.rss_after_kb - report.rss_before_kb < 256 * 1024, shown
