"""What a test of each tier may start, held by the tier's conftest (README, Development):

- ``tests/unit``: pure code and the in-memory adapters. No process (no subprocess, no
  fork), no network connection: ``make test-fast`` runs this tier alone, in under two
  minutes.
- ``tests/sandbox``: the verifier's processes and the compilers they run, and nothing of
  a deployment: no NATS server, no ``kernelflow`` command, no connection to a server.
- ``tests/integration``: servers, daemons, the CLI as installed, and everything above.

A test that starts what its tier does not allow fails, naming what it started and where
it belongs: a test that drifts into a slower tier moves, and the fast tier stays fast.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from kernelflow.sandbox.warm import WarmProcess


def _argv(args: Any) -> list[str]:
    return [str(a) for a in args] if isinstance(args, list | tuple) else [str(args)]


def is_kernelflow_command(argv: Sequence[str]) -> bool:
    """``python -m kernelflow …`` or the installed ``kernelflow`` script (not a module of
    the package run as a process of its own: the sandbox's child)."""
    run_as_module = any(a == "-m" and b == "kernelflow" for a, b in itertools.pairwise(argv))
    return run_as_module or os.path.basename(argv[0]) == "kernelflow"


def is_nats_server(argv: Sequence[str]) -> bool:
    return os.path.basename(argv[0]).startswith("nats-server")


def guard(
    monkeypatch: pytest.MonkeyPatch,
    tier: str,
    *,
    refuse_process: Callable[[Sequence[str]], bool],
    processes_go_to: str,
    network: bool,
) -> None:
    """Refuse, for the rest of the test, the processes ``refuse_process`` names, forks if
    it refuses every process, and (``network`` False) TCP connections."""

    def refused(what: str, belongs: str) -> AssertionError:
        return AssertionError(f"a test in tests/{tier} {what}: it belongs in {belongs}")

    popen_init = subprocess.Popen.__init__

    def checked_popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> None:
        argv = _argv(args)
        if refuse_process(argv):
            raise refused(f"started {' '.join(argv[:3])}", processes_go_to)
        popen_init(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_popen)
    if refuse_process(["any process"]):

        def no_fork() -> int:
            raise refused("forked", processes_go_to)

        monkeypatch.setattr(os, "fork", no_fork)
    if not network:
        connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

        def checked(real: Callable[..., Any]) -> Callable[..., Any]:
            def call(self: socket.socket, address: Any) -> Any:
                if self.family in (socket.AF_INET, socket.AF_INET6):
                    raise refused(f"connected to {address}", "tests/integration")
                return real(self, address)

            return call

        monkeypatch.setattr(socket.socket, "connect", checked(connect))
        monkeypatch.setattr(socket.socket, "connect_ex", checked(connect_ex))


def unit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    where = "tests/sandbox (a verifier, a compiler) or tests/integration"
    guard(
        monkeypatch, "unit", refuse_process=lambda argv: True, processes_go_to=where, network=False
    )

    # A warm sandbox started by an earlier test runs candidates without a new process.
    def no_warm_run(*_: Any, **__: Any) -> Any:
        raise AssertionError(
            f"a test in tests/unit ran a candidate in a sandbox: it belongs in {where}"
        )

    monkeypatch.setattr(WarmProcess, "run", no_warm_run)
    yield


def sandbox(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    guard(
        monkeypatch,
        "sandbox",
        refuse_process=lambda argv: is_kernelflow_command(argv) or is_nats_server(argv),
        processes_go_to="tests/integration",
        network=False,
    )
    yield
