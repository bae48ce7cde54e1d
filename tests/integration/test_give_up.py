"""A daemon whose NATS stays unreachable past ``--nats-give-up`` (KF_NATS_GIVE_UP) exits
with status 1 and one line saying so, for its supervisor (systemd's Restart=) to start a
fresh one; a NATS back within the bound keeps it running. Real servers, real daemons."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.host.exits import EXIT_BAD_INPUT, EXIT_FAILED
from kernelflow.host.settings import Settings, SettingsError
from tests.conftest import (
    KERNELFLOW,
    REPO,
    as_user,
    cli_env,
    is_keyed,
    keyed_nats_server,
    role_auth,
    run_cli,
)
from tests.daemons import RELU_SCRIPT, wait_for_line


class Daemon:
    """``kernelflow daemon`` with its stdout and stderr apart."""

    def __init__(self, tmp_path: Path, url: str, *args: str) -> None:
        self.out, self.err = tmp_path / "daemon.out", tmp_path / "daemon.err"
        # With the daemon role's key of a test server (a URL where none listens: none).
        at = as_user("daemon", url) if is_keyed(url) else ["--nats-url", url]
        argv = [*KERNELFLOW, "daemon", *at, "--llm", f"scripted:{RELU_SCRIPT}"]
        with self.out.open("ab") as out, self.err.open("ab") as err:
            self.proc = subprocess.Popen(
                [*argv, *args],
                cwd=REPO,
                env=cli_env(),
                stdout=out,
                stderr=err,
                start_new_session=True,
            )

    def stderr(self) -> str:
        return self.err.read_text()


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for daemon in started:
        if daemon.proc.poll() is None:
            os.killpg(daemon.proc.pid, signal.SIGKILL)
            daemon.proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_gave_up_with_one_line(daemon: Daemon, line: str) -> None:
    text = daemon.stderr()
    assert "Traceback" not in text, text
    # The logging before it has a time stamp; the CLI's own line is the last, and alone.
    assert [x for x in text.splitlines() if x.startswith("kernelflow:")] == [line], text
    assert text.splitlines()[-1] == line, text


def test_a_daemon_whose_nats_stays_lost_past_the_bound_exits_with_one_line(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    with keyed_nats_server(tmp_path / "nats") as server:
        url = server.url
        daemon = Daemon(tmp_path, url, "--nats-give-up", "2")
        daemons.append(daemon)
        wait_for_line(daemon.out, "kernelflow daemon on")
        os.kill(server.pid or 0, signal.SIGKILL)
        lost = time.monotonic()
        assert daemon.proc.wait(timeout=30) == EXIT_FAILED, daemon.stderr()
        took = time.monotonic() - lost
    assert 2 <= took < 10, (took, daemon.stderr())
    assert_gave_up_with_one_line(daemon, f"kernelflow: lost NATS at {url} for 2s; giving up")


def test_the_give_up_happens_though_messages_wait_for_the_lost_server(tmp_path: Path) -> None:
    """What was published while reconnecting is buffered for the dead connection, and
    nats-py's close fails flushing it: the give-up must happen anyway (it did not, in about
    one daemon in three, whose pull requests had been buffered)."""
    stack = contextlib.ExitStack()
    server = stack.enter_context(keyed_nats_server(tmp_path / "nats"))
    url = server.url
    gave_up = threading.Event()
    bridge = Bridge(url, give_up_s=1.0, on_give_up=gave_up.set, auth=role_auth(url, "daemon"))
    bridge.start()
    try:
        os.kill(server.pid or 0, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not bridge.nc.is_reconnecting:
            assert time.monotonic() < deadline
            time.sleep(0.05)

        async def publish_while_away() -> None:
            for _ in range(5):
                await bridge.nc.publish("kf.test.buffered", b"x" * 1000)

        bridge.call(publish_while_away())
        assert gave_up.wait(10), "the bridge never gave up"
        assert bridge.lost is not None and "giving up" in str(bridge.lost)
    finally:
        bridge.stop()
        stack.close()


def test_a_daemon_that_never_reaches_nats_exits_after_the_bound(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    daemon = Daemon(tmp_path, url, "--nats-give-up", "2")
    daemons.append(daemon)
    assert daemon.proc.wait(timeout=30) == EXIT_FAILED, daemon.stderr()
    assert 2 <= time.monotonic() - started < 10, daemon.stderr()
    assert_gave_up_with_one_line(
        daemon, f"kernelflow: no NATS server answered at {url} within 2s (connection refused)"
    )


def test_a_nats_back_within_the_bound_keeps_the_daemon(
    tmp_path: Path, daemons: list[Daemon]
) -> None:
    """A restart of NATS shorter than the bound is no reason to exit; the bound counts
    from the last loss, not the first."""
    stack = contextlib.ExitStack()
    server = stack.enter_context(keyed_nats_server(tmp_path / "nats", port=free_port()))
    url = server.url
    daemon = Daemon(tmp_path, url, "--nats-give-up", "4")
    daemons.append(daemon)
    try:
        wait_for_line(daemon.out, "kernelflow daemon on")
        for outage in (1, 2):
            os.kill(server.pid or 0, signal.SIGKILL)
            server.stop()
            lost = time.monotonic()
            time.sleep(1)
            server.start()  # on the same port and store
            deadline = time.monotonic() + 15
            while daemon.stderr().count("reconnected to NATS") < outage:
                assert time.monotonic() < deadline, daemon.stderr()
                time.sleep(0.1)
            time.sleep(max(0.0, lost + 4.5 - time.monotonic()))  # past the bound of this loss
            assert daemon.proc.poll() is None, daemon.stderr()
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.proc.wait(timeout=30) == 0, daemon.stderr()
    finally:
        stack.close()
    assert "giving up" not in daemon.stderr()
    assert "Traceback" not in daemon.stderr()


@pytest.mark.parametrize(
    ("raw", "expected"), [("60", 60.0), ("0.5", 0.5), ("0", None)], ids=["60", "0.5", "never"]
)
def test_the_bound_from_the_environment(
    raw: str, expected: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KF_NATS_GIVE_UP", raw)
    assert Settings().nats_give_up_s == expected


def test_the_default_bound_is_a_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KF_NATS_GIVE_UP", raising=False)
    assert Settings().nats_give_up_s == 60.0


@pytest.mark.parametrize("raw", ["-1", "inf", "nan", "soon", ""])
def test_a_bound_that_is_not_seconds_is_refused(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_NATS_GIVE_UP", raw)
    with pytest.raises(SettingsError, match=r"KF_NATS_GIVE_UP=.*expected seconds"):
        Settings()


def test_a_flag_that_is_not_seconds_is_one_line() -> None:
    result = run_cli("daemon", "--nats-url", "nats://127.0.0.1:9", "--nats-give-up", "-5")
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr == (
        "kernelflow: --nats-give-up='-5': expected seconds (0: never give up)\n"
    )
