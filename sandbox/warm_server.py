"""The warm process, server side: a process that readied its runtime once (torch and
triton imported, CUDA never initialised) and forks a fresh sandbox for every job.

Protocol: it prints ``{"ready": true, "pid": ...}``, then for every job line on stdin
(``{"workdir", "timeout_s"}``, and ``"probe"``: the sandbox module's probe arguments for a
sandbox that runs its probe instead of a job) forks an intermediate process, waits for it with the
timeout, kills its whole process group and answers one status line on stdout (``outcome``
``done``/``timeout``/``spawn_error``, the sandbox's exit ``code`` or ``signal``, whether it
had a PID namespace, and the ``result`` the sandbox wrote on its result pipe, fd 3). The
intermediate starts a session, moves its future children into a new PID namespace and a
pids cgroup when the machine allows them, and forks the sandbox: PID 1 there, it sees no
process outside it, and everything it starts dies with it. The sandbox's stdout and stderr
go to ``WORKDIR/output.log`` (a probe's stdout to ``WORKDIR/probe.out``).

Child side: stdlib only (the job runner brings its own imports).
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelflow.sandbox.limits import (
    NPROC_LIMIT,
    die_with_parent,
    enter_pids_cgroup,
    libc,
    remove_pids_cgroup,
    sweep_pids_cgroups,
)

__all__ = ["JobRunner", "serve"]

CLONE_NEWPID = 0x20000000
OUTPUT_LOG = "output.log"  # in the job's work dir: the sandbox's stdout and stderr
PROBE_OUTPUT = "probe.out"  # in a probe's work dir: the probe's stdout

# Runs one job in the (not yet confined) sandbox process: ``(workdir, result_fd)``, writing
# its result on the pipe ``result_fd``; never returns.
JobRunner = Callable[[Path, int], None]
# Runs the sandbox module's probe (``--probe ARGS``) in the sandbox process: its exit status.
Prober = Callable[[list[str]], int]
RESULT_FD = 3
# A result is read once the sandbox has exited: it must fit in the pipe's buffer.
_MAX_RESULT_BYTES = 64 * 1024


def fork_sandbox(
    job: dict[str, Any], status_w: int, result_w: int, run_job: JobRunner, probe: Prober
) -> int:
    """Fork the intermediate process; returns its pid (also its process group id).

    The intermediate reports the sandbox's wait status (and whether it got a PID
    namespace) on ``status_w``.
    """
    workdir = Path(job["workdir"])
    sys.stdout.flush()
    sys.stderr.flush()
    worker = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # intermediate
        os.setsid()
        die_with_parent(worker)
        pidns = libc().unshare(CLONE_NEWPID) == 0
        enter_pids_cgroup(NPROC_LIMIT)
        # The sandbox's parent as it will see it: outside its PID namespace, a parent is 0.
        intermediate = 0 if pidns else os.getpid()
        child = os.fork()
        if child == 0:  # the sandbox
            # It dies with the intermediate (which dies with the worker, which dies with
            # its verifier): a verifier killed mid-check leaves no judge behind, nor the
            # candidate the judge holds, to run on past the time limit nobody enforces.
            die_with_parent(intermediate)
            os.close(status_w)
            log = os.open(workdir / OUTPUT_LOG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.dup2(result_w, RESULT_FD)
            os.closerange(RESULT_FD + 1, 4096)  # nothing else of the worker's stays reachable
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            faulthandler.enable()
            if "probe" in job:
                out = os.open(workdir / PROBE_OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(out, 1)
                os.close(out)
                code = probe([str(arg) for arg in job["probe"]])
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            run_job(workdir, RESULT_FD)
        _, status = os.waitpid(child, 0)
        os.write(status_w, json.dumps({"status": status, "pidns": pidns}).encode())
        os._exit(0)
    except BaseException:
        os._exit(71)


def _read_all(fd: int) -> bytes:
    """What a pipe holds, its writers all gone; closes it."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while len(data) < _MAX_RESULT_BYTES and (chunk := os.read(fd, _MAX_RESULT_BYTES)):
            data += chunk
    os.close(fd)
    return data


def serve(preload: Callable[[], None], run_job: JobRunner, probe: Prober) -> int:
    """The warm process loop (see the module docstring): ``preload`` readies the runtime
    every sandbox shares, ``run_job`` runs one job in a forked sandbox, ``probe`` the
    sandbox module's probe in one (what isolation its sandboxes get here)."""
    die_with_parent()
    preload()
    out = sys.stdout
    print(json.dumps({"ready": True, "pid": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        timeout = float(job.get("timeout_s", 300.0))
        started = time.monotonic()
        status_r, status_w = os.pipe()
        result_r, result_w = os.pipe()
        try:
            pid = fork_sandbox(job, status_w, result_w, run_job, probe)
        except OSError as exc:
            for fd in (status_r, status_w, result_r, result_w):
                os.close(fd)
            print(json.dumps({"outcome": "spawn_error", "error": str(exc)}), file=out, flush=True)
            continue
        os.close(status_w)
        os.close(result_w)
        timed_out = False
        deadline = started + timeout
        delay = 0.002
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        # Before reaping: the group id cannot be reused while the leader is a zombie.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _, istatus = os.waitpid(pid, 0)
        remove_pids_cgroup(pid)
        sweep_pids_cgroups()
        report: dict[str, Any] = {"outcome": "timeout" if timed_out else "done"}
        report["result"] = _read_all(result_r).decode("utf-8", "replace")
        ready, _, _ = select.select([status_r], [], [], 0)
        raw = os.read(status_r, 4096) if ready else b""
        os.close(status_r)
        if raw:
            info = json.loads(raw)
            status = int(info["status"])
            report["pidns"] = bool(info["pidns"])
        else:  # the intermediate itself was killed (by the candidate, or on timeout)
            status = istatus
            report["intermediate_lost"] = True
        if os.WIFSIGNALED(status):
            report["signal"] = os.WTERMSIG(status)
        else:
            report["code"] = os.WEXITSTATUS(status)
        report["duration_s"] = time.monotonic() - started
        print(json.dumps(report), file=out, flush=True)
    return 0
