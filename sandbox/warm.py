"""The warm process, client side: the parent's pool of pre-started warm processes (one per
interpreter, device, network isolation, GPU and sandbox module), running one job in one
(see :mod:`kernelflow.sandbox.warm_server` for the protocol), and the sandbox plan of a
warm process's sandboxes, probed in its forks (:func:`warm_sandbox_plan`).

A process dies with the thread that started it (Linux sends PR_SET_PDEATHSIG when that
thread ends): start processes from a thread that outlives their jobs.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from kernelflow.sandbox.probe import (
    PROBE_TIMEOUT_S,
    SandboxPlan,
    device_env,
    plan_from,
    probe_args,
    probe_failure,
    probed_once,
)
from kernelflow.sandbox.process import (
    ProcessOutcome,
    TailBuffer,
    drain,
    isolated_module,
    read_tail,
)
from kernelflow.sandbox.warm_server import OUTPUT_LOG, PROBE_OUTPUT

__all__ = [
    "WarmKey",
    "WarmProcess",
    "WarmProcessLost",
    "discard_warm_process",
    "run_in_warm_process",
    "shutdown_warm_processes",
    "warm_process_for",
    "warm_sandbox_plan",
]


class WarmProcessLost(Exception):
    """The warm process died or stopped answering; it is replaced by a fresh one."""


class WarmKey(NamedTuple):
    """Which process: ``python -I -m ENTRY --serve DEVICE`` under the network isolation
    ``prefix``, seeing CUDA device ``gpu`` only (None: all of them)."""

    python: str
    device: str
    prefix: tuple[str, ...]
    gpu: str | None
    entry: str


class WarmProcess:
    """A pre-started warm process (its runtime imported, CUDA untouched). It forks one
    sandbox per job; one job at a time (hold ``lock``)."""

    def __init__(self, cmd: list[str], env: dict[str, str], home: str) -> None:
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            cmd,
            cwd=home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        self.stderr = TailBuffer(16_000)
        self._drainer = threading.Thread(
            target=drain, args=(self.proc.stderr, self.stderr), daemon=True
        )
        self._drainer.start()
        self.pending = b""
        ready = self._read_line(PROBE_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise WarmProcessLost("the warm process did not start: " + self.last_words())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def last_words(self) -> str:
        """The end of what the process wrote to stderr, all of it once it has exited (its
        stdout closing first does not mean its stderr was read)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        self._drainer.join(timeout=5)
        return self.stderr.text()[-2000:]

    def _read_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WarmProcessLost("the warm process stopped answering")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise WarmProcessLost("the warm process exited: " + self.last_words())
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise WarmProcessLost(f"the warm process said something odd: {line[:200]!r}") from exc
        return value if isinstance(value, dict) else {}

    def run(self, workdir: str, timeout_s: float, probe: list[str] | None = None) -> dict[str, Any]:
        """Run the job in ``workdir`` in a forked sandbox (or, given ``probe``, the sandbox
        module's probe with those arguments); the process's status line."""
        assert self.proc.stdin is not None
        job: dict[str, Any] = {"workdir": workdir, "timeout_s": timeout_s}
        if probe is not None:
            job["probe"] = probe
        line = json.dumps(job)
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise WarmProcessLost(f"the warm process is gone: {exc}") from exc
        # The process enforces the timeout itself; the grace covers killing and reaping.
        return self._read_line(timeout_s + 30.0)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


WARM_PROCESSES: dict[WarmKey, WarmProcess] = {}
_WARM_LOCK = threading.Lock()


def warm_process_for(key: WarmKey) -> WarmProcess:
    """The running process for ``key``, started now if there is none (or it died)."""
    with _WARM_LOCK:
        process = WARM_PROCESSES.get(key)
        if process is not None and process.alive():
            return process
        if process is not None:
            process.close()
        home = tempfile.gettempdir()
        cmd = [*key.prefix, *isolated_module(key.python, key.entry, "--serve", key.device)]
        process = WarmProcess(cmd, device_env(home, key.device, key.gpu), home)
        WARM_PROCESSES[key] = process
        return process


def discard_warm_process(process: WarmProcess) -> None:
    with _WARM_LOCK:
        for key, value in list(WARM_PROCESSES.items()):
            if value is process:
                del WARM_PROCESSES[key]
    process.close()


def shutdown_warm_processes() -> None:
    """Stop every warm process this one started (they also die with it)."""
    with _WARM_LOCK:
        processes = list(WARM_PROCESSES.values())
        WARM_PROCESSES.clear()
    for process in processes:
        process.close()


def run_in_warm_process(
    key: WarmKey, workdir: str, timeout_s: float, max_output_bytes: int
) -> ProcessOutcome:
    """Run the job in ``workdir`` in a sandbox forked from the process for ``key``: its
    exit (None on timeout) and the tail of its ``output.log``. A process that died before
    the job started is replaced once; raises :class:`WarmProcessLost` if that fails too, and
    OSError if the process could not fork."""
    for attempt in range(2):
        process = warm_process_for(key)
        with process.lock:
            try:
                reply = process.run(workdir, timeout_s)
            except WarmProcessLost:
                discard_warm_process(process)
                if attempt == 0 and not Path(workdir, OUTPUT_LOG).exists():
                    continue  # died before this job started: try once more on a fresh one
                raise
        if reply.get("outcome") == "spawn_error":
            raise OSError(str(reply.get("error")))
        output = read_tail(Path(workdir, OUTPUT_LOG), max_output_bytes)
        if reply.get("outcome") == "timeout":
            return ProcessOutcome(None, output)
        code = -int(reply["signal"]) if "signal" in reply else int(reply.get("code", 0))
        result = str(reply.get("result", "")).encode()
        return ProcessOutcome(code, output, bool(reply.get("intermediate_lost")), result)
    raise AssertionError("unreachable")


@probed_once
def warm_sandbox_plan(
    python: str, device: str, gpu: str | None, entry: str, memory_mb: int
) -> SandboxPlan:
    """The strongest isolation under which the sandboxes a warm process of ``entry`` forks
    still work here (:func:`~kernelflow.sandbox.probe.plan_from`; probed once): each
    combination is the sandbox module's probe run in a sandbox forked from the warm process
    of that network isolation, as every job under the plan will be, so that readying a
    verifier imports torch once, not once more for a probe. The plan's warm process is left
    running, ready for the first job; those of the isolations it did not pick are stopped.
    """
    tried: set[WarmKey] = set()

    def forked(prefix: tuple[str, ...], kind: str, fs: bool) -> tuple[str | None, str]:
        key = WarmKey(python, device, prefix, gpu, entry)
        tried.add(key)
        workdir = tempfile.mkdtemp(prefix="kf-warm-probe-")
        try:
            process = warm_process_for(key)
            with process.lock:
                reply = process.run(
                    workdir, PROBE_TIMEOUT_S, probe_args(device, kind, memory_mb, fs)
                )
        except WarmProcessLost as exc:
            return None, f"error: {exc}\n"
        else:
            out = read_tail(Path(workdir, PROBE_OUTPUT), 64 * 1024)
            if reply.get("outcome") == "done" and reply.get("code") == 0:
                return out, ""
            stderr = read_tail(Path(workdir, OUTPUT_LOG), 16 * 1024)
            return None, probe_failure(out, stderr, f"the probe ended so: {reply}")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    plan = plan_from(forked, device)
    for key in tried - {WarmKey(python, device, plan.prefix, gpu, entry)}:
        unused = WARM_PROCESSES.get(key)
        if unused is not None:
            discard_warm_process(unused)
    return plan
