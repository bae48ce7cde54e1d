"""Fixtures: a real nats-server (JetStream, temp store) per test session, and helpers to
run the real CLI as a user would.

These servers let anyone in (``EmbeddedNats`` without ``authorization``), so that tests
connect without credentials; kernelflow's own embedded default asks for its data dir's
keys, and tests/test_nats_security.py runs its roles on such a server."""

from __future__ import annotations

import asyncio
import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from kernelflow.events.log import EventLog
from kernelflow.nats_server import EmbeddedNats

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
KERNELFLOW = [sys.executable, "-m", "kernelflow"]


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedNats(tmp_path_factory.mktemp("nats-store")) as server:
        yield server.url


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[str]:
    """A server of the test's own, for tests that leave unacked work behind on purpose."""
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
def event_log(nats_url: str) -> Iterator[EventLog]:
    """An EventLog on its own event loop, for tests that talk to JetStream directly."""
    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(nats_url))
    log = EventLog(nc)
    loop.run_until_complete(log.ensure_streams())
    log.run = loop.run_until_complete  # type: ignore[attr-defined]
    yield log
    loop.run_until_complete(nc.close())
    loop.close()


@functools.cache
def _own_data_dir() -> str:
    """A data dir of this test process's own: a command run without one must not share
    the user's (nor another test process's, under ``pytest -n``) embedded server."""
    path = tempfile.mkdtemp(prefix="kf-test-data-")
    atexit.register(shutil.rmtree, path, True)
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
    env["KF_DATA_DIR"] = _own_data_dir()
    env.update(extra)
    return env


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KERNELFLOW, *args],
        capture_output=True,
        text=True,
        env=env or cli_env(),
        cwd=REPO,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (zombies may linger unreaped in containers)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
