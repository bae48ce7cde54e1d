"""The unit tier's guard (tests/tiers.py) refuses what a unit test may not start, naming
where such a test belongs: a process, a fork, a TCP connection."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest


def test_a_process_is_refused() -> None:
    with pytest.raises(AssertionError, match=r"started true: it belongs in tests/sandbox"):
        subprocess.run(["true"], check=False)


def test_a_fork_is_refused() -> None:
    with pytest.raises(AssertionError, match="forked"):
        os.fork()


def test_a_tcp_connection_is_refused() -> None:
    with socket.socket() as s, pytest.raises(AssertionError, match="belongs in tests/integration"):
        s.connect(("127.0.0.1", 9))


def test_a_local_socket_pair_is_allowed() -> None:
    """What an event loop makes for itself (asyncio's self-pipe)."""
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"x")
        assert b.recv(1) == b"x"


def test_the_sandbox_tier_tells_the_cli_from_the_sandbox_s_child() -> None:
    from tests.tiers import is_kernelflow_command

    assert is_kernelflow_command(["python", "-m", "kernelflow", "run", "t.py"])
    assert is_kernelflow_command(["/venv/bin/kernelflow", "status"])
    assert not is_kernelflow_command(["python", "-m", "kernelflow.verification.child"])
