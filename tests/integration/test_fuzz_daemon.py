"""A daemon under a fuzz of what any NATS publisher may send (``bench/fuzz_daemon.py``:
the same fuzz, 10,000 messages, with its figures) stays up, answers every command, query
and ping once and within seconds, keeps its memory, and logs one line per message it
refuses, never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fuzz_daemon import fuzz
from kernelflow.host.nats_server import EmbeddedNats
from tests.integration.test_log_attacks import running_daemon

MESSAGES = 2000


@pytest.fixture
def open_nats(tmp_path: Path) -> Iterator[str]:
    """A server that lets anyone in: the fuzz is what anyone who reaches it may send (one
    that asks for keys refuses most of it to every role:
    tests/integration/test_nats_security.py)."""
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server.url


def test_a_daemon_answers_all_of_a_fuzz_once_within_seconds(open_nats: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    with running_daemon(open_nats, log, "--roles", "conductor,designer,coder") as daemon:
        report = fuzz(open_nats, daemon.pid, log, MESSAGES)
        assert daemon.poll() is None, log.read_text()[-3000:]
    shown = "\n".join(report.lines())
    assert report.unanswered == 0 and report.answered_twice == 0, shown
    assert report.percentile_s(0.99) < 10.0, shown
    assert report.tracebacks == 0, shown
    assert report.refusal_lines <= report.log_lines <= report.refused + 20, shown
    assert report.rss_after_kb - report.rss_before_kb < 256 * 1024, shown
