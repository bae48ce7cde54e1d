"""Fixtures: a real nats-server (JetStream, temp store) per test session, and helpers to
run the real CLI as a user would.

These servers are run as kernelflow's embedded default runs its own
(``kernelflow.host.nats_server.keyed_server``): they let in only the holders of their store's
keys, each with its role's permissions (docs/security.md), and refuse anyone else. So
every test says which role it acts as, and connects with that role's key the way a user
passes it:

- a command: ``run_cli("submit", TASK, *as_user("publisher", url))`` (``--nats-url URL
  --creds FILE``), or ``user_env("reader", url)`` (``KF_NATS_URL``, ``KF_NATS_CREDS``);
- a client of its own: ``await connect(url, "reader")``, ``Bridge(url, auth=role_auth(url,
  "daemon"))``;
- tests/daemons.py's helpers act as a user would: ``start_daemon`` with the daemon role,
  ``submit`` and ``publish`` with the publisher's, the readers of the log (``task_events``,
  ``wait_for``...) with the reader's.

``creds(url, role)`` is the seed file ``kernelflow creds ROLE`` hands out for the server;
``keyed_nats`` / ``keyed_nats_server`` make such a server for a module of its own, or to
stop and restart. Tests of anonymous access (an open server's fuzz) and of servers set up
otherwise (security, clusters) run their own."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from kernelflow.actors.connection import ClientAuth
from kernelflow.events.log import EventLog
from kernelflow.host.nats_auth import ROLES, LocalKeys
from kernelflow.host.nats_server import EmbeddedNats, keyed_server, local_keys

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
KERNELFLOW = [sys.executable, "-m", "kernelflow"]


# The keys of each test server running in this process, by its URL.
_KEYS: dict[str, LocalKeys] = {}


@contextlib.contextmanager
def keyed_nats_server(
    store: Path, *, streams: bool = True, port: int = -1
) -> Iterator[EmbeddedNats]:
    """A nats-server on ``store``, run as the embedded default runs its own: only the
    holders of its keys get in, each with its role. With ``streams``, the streams are
    there, as the first daemon on a server (or the first command on the embedded
    default, with its daemon key) makes them: no other role may. The server is started;
    a test may stop and start it again (on a fixed ``port``: the same URL)."""
    server = keyed_server(store)
    server.port = port
    with server:
        _KEYS[server.url] = local_keys(store)
        try:
            if streams:
                asyncio.run(_make_streams(server.url))
            yield server
        finally:
            del _KEYS[server.url]


@contextlib.contextmanager
def keyed_nats(store: Path, *, streams: bool = True) -> Iterator[str]:
    """``keyed_nats_server``'s URL."""
    with keyed_nats_server(store, streams=streams) as server:
        yield server.url


async def _make_streams(url: str) -> None:
    nc = await connect(url, "daemon")
    try:
        await EventLog(nc).ensure_streams()
    finally:
        await nc.close()


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's server (keys required, streams made)."""
    with keyed_nats(tmp_path_factory.mktemp("nats-store")) as url:
        yield url


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[str]:
    """A server of the test's own, for tests that leave unacked work behind on purpose
    (keys required, streams made)."""
    with keyed_nats(tmp_path / "nats") as url:
        yield url


@pytest.fixture
def bare_nats(tmp_path: Path) -> Iterator[str]:
    """A server of the test's own with nothing on it yet, not even the streams (keys
    required): for tests of what a first daemon finds."""
    with keyed_nats(tmp_path / "nats", streams=False) as url:
        yield url


def creds(url: str, role: str) -> Path:
    """The seed file of ``role`` for the test server at ``url``: the key ``kernelflow creds
    ROLE`` hands out for it."""
    if role not in ROLES:
        raise ValueError(f"no role {role!r}: one of {', '.join(ROLES)}")
    if url not in _KEYS:
        raise LookupError(f"{url} is not a test server of this process (nats_url, private_nats)")
    return _KEYS[url].seed_file(role)


def is_keyed(url: str) -> bool:
    """Whether ``url`` is a test server of this process that asks for its keys."""
    return url in _KEYS


def as_user(role: str, url: str) -> list[str]:
    """A command's options for a user holding ``role``'s key: ``--nats-url URL --creds
    FILE``."""
    return ["--nats-url", url, "--creds", str(creds(url, role))]


def user_env(role: str, url: str, **extra: str) -> dict[str, str]:
    """A command's environment for a user holding ``role``'s key (``KF_NATS_URL``,
    ``KF_NATS_CREDS``), ``extra`` added."""
    return cli_env(KF_NATS_URL=url, KF_NATS_CREDS=str(creds(url, role)), **extra)


def role_auth(url: str, role: str) -> ClientAuth:
    """What a client of one's own presents as ``role`` (a Bridge's ``auth``)."""
    return ClientAuth(creds=creds(url, role))


async def connect(url: str, role: str, **options: Any) -> NATS:
    """A NATS client of one's own, holding ``role``'s key."""
    return await nats.connect(url, **role_auth(url, role).options(), **options)


@pytest.fixture
def event_log(nats_url: str) -> Iterator[EventLog]:
    """An EventLog on its own event loop, for tests that talk to JetStream directly: as a
    daemon, which alone may append."""
    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(connect(nats_url, "daemon"))
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


# --------------------------------------------------------------------------- the tiers

# tests/unit, tests/sandbox and tests/integration: what a test of each may start is in
# tests/tiers.py, held by each tier's conftest. ``make test-fast`` runs tests/unit.


# The longest modules (a minute or more of one test process each), run first: `make test`
# hands whole modules to its processes in collection order, and one of these last
# would leave the other process idle for as long.
LONGEST_FIRST = (
    "test_faults.py",
    "test_second_hour.py",
    "test_sandbox_secrets.py",
    "test_workflow_runs.py",
    "test_verifier_cpp.py",
    "test_agentic_workflow.py",
    "test_analysis_tools.py",
    "test_bench.py",
    "test_verifier_pool.py",
    "test_e2e.py",
    "test_first_hour.py",
    "test_search_speed.py",
    "test_crash.py",
    "test_task_faults.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order


@pytest.fixture(scope="session")
def extension_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++/CUDA extension cache the whole run shares, every test process included (the
    cache is safe with several verifiers building at once, and keyed by content: a kernel
    built for one test is found built by the next, as a node's verifiers find it)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's base temp, above each worker's own
    path = shared / "extensions"
    path.mkdir(exist_ok=True)
    return path


def marked(marker: str) -> list[int]:
    """Host pids of the processes whose command line holds ``marker`` (a tool's command
    has a PID namespace and /proc of its own: it cannot tell its host pids)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_until_unmarked(marker: str, within_s: float) -> None:
    """Wait until no process's command line has held ``marker`` for half a second, or
    ``within_s`` passed: a process mid-exec reads as unmarked for an instant."""
    deadline = time.monotonic() + within_s
    unmarked_since = None
    while time.monotonic() < deadline:
        if marked(marker):
            unmarked_since = None
        elif unmarked_since is None:
            unmarked_since = time.monotonic()
        elif time.monotonic() - unmarked_since >= 0.5:
            return
        time.sleep(0.05)
