"""Parent side of the verifier: run one candidate in a sandboxed child process.

This module runs inside the daemon and never imports or executes candidate code (nor torch:
initialising CUDA here would break forking and tie the daemon to the GPU). Each
verification gets a private temp dir, a fresh ``python -I sandbox_child.py`` in its own
session (process group), resource limits, no network when the machine allows it, a wall
clock timeout that kills the whole group, and bounded output capture.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from actors.verifier.taskfile import (
    CandidateError,
    TaskFileError,
    check_candidate_source,
    check_task_source,
)
from events.model import VerificationReport

__all__ = ["SUPPORTED_BACKENDS", "VerifierConfig", "detect_device", "verify"]

SANDBOX_CHILD = Path(__file__).with_name("sandbox_child.py")
SUPPORTED_BACKENDS = frozenset({"triton", "cuda"})
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    # (atol, rtol) per output dtype, as in KernelBench.
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
# Environment variables a CUDA/Triton toolchain may need to find the driver, the compiler or
# its thread count; everything else from the daemon's environment stays out of the sandbox.
_PASSTHROUGH_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_PTXAS_PATH",
    "OMP_NUM_THREADS",
)
_PROBE_TIMEOUT_S = 180.0
_FEEDBACK_LINES = 30


@dataclass(frozen=True)
class VerifierConfig:
    timeout_s: float = 300.0
    memory_mb: int = 16384
    trials: int = 3
    seed: int = 0
    max_output_bytes: int = 64_000
    python: str = sys.executable
    tolerances: dict[str, tuple[float, float]] | None = None  # None: DEFAULT_TOLERANCES


DEFAULT_CONFIG = VerifierConfig()


class _Signed(msgspec.Struct):
    nonce: str = ""


# --------------------------------------------------------------------------- probes


def _base_env(home: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
    }
    for name in _PASSTHROUGH_ENV:
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _run_quiet(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str | None:
    """Run a short probe command; its stdout, or None if it failed in any way."""
    try:
        done = subprocess.run(
            cmd,
            env=env if env is not None else _base_env(tempfile.gettempdir()),
            cwd=tempfile.gettempdir(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            start_new_session=True,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.decode(errors="replace") if done.returncode == 0 else None


@functools.cache
def detect_device(python: str = sys.executable) -> str:
    """Return "cuda" if ``python`` sees a usable CUDA GPU, else "cpu".

    Asked in a short subprocess (once per interpreter, then cached) so the daemon itself
    never initialises CUDA.
    """
    code = (
        "import torch\n"
        "ok = torch.cuda.is_available() and torch.cuda.device_count() > 0\n"
        "print('cuda' if ok else 'cpu')\n"
    )
    out = _run_quiet([python, "-I", "-c", code], _PROBE_TIMEOUT_S)
    return "cuda" if out is not None and out.strip().endswith("cuda") else "cpu"


@dataclass(frozen=True)
class _SandboxPlan:
    prefix: tuple[str, ...]  # command prefix giving network isolation, or ()
    memory_kind: str  # "as", "data" or "none": see sandbox_child.apply_limits


@functools.cache
def _sandbox_plan(python: str, device: str, memory_mb: int) -> _SandboxPlan:
    """The strongest isolation under which torch+triton still work here (probed once).

    Network: ``unshare --net --map-root-user`` (unprivileged user + network namespace; no
    capabilities in the real namespace either), else ``unshare --net`` (works as root), else
    nothing: containers often forbid namespaces, and isolation must not make the verifier
    fragile. Memory: RLIMIT_AS on CPU; on CUDA, RLIMIT_AS would refuse the driver's huge
    virtual address reservations, so RLIMIT_DATA is tried there, then no memory limit.
    """
    prefixes: list[tuple[str, ...]] = []
    if shutil.which("unshare"):
        prefixes += [("unshare", "--net", "--map-root-user"), ("unshare", "--net")]
    prefixes.append(())
    kinds = ("as", "none") if device == "cpu" else ("data", "none")
    env = _base_env(tempfile.gettempdir())
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    for prefix in prefixes:
        # Cheap pre-check: when namespaces are not allowed, unshare fails immediately.
        if prefix and _run_quiet([*prefix, "true"], 10.0) is None:
            continue
        for kind in kinds:
            cmd = [
                *prefix,
                python,
                "-I",
                str(SANDBOX_CHILD),
                "--probe",
                device,
                kind,
                str(memory_mb),
            ]
            out = _run_quiet(cmd, _PROBE_TIMEOUT_S, env)
            if out is not None and out.strip().endswith("ok"):
                return _SandboxPlan(prefix, kind)
    # Nothing worked (torch missing?): run unconfined; the child will report the real error.
    return _SandboxPlan((), kinds[0])


# --------------------------------------------------------------------------- child process


class _TailBuffer:
    """Keeps the last ``limit`` bytes of a stream (the end of a traceback matters most)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.data = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        self.data += chunk
        excess = len(self.data) - self.limit
        if excess > 0:
            del self.data[:excess]
            self.dropped += excess

    def text(self) -> str:
        body = self.data.decode(errors="replace")
        return f"[... {self.dropped} bytes dropped ...]\n{body}" if self.dropped else body


def _drain(stream: object, buf: _TailBuffer) -> None:
    fd = stream.fileno()  # type: ignore[attr-defined]
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buf.feed(chunk)


@dataclass
class _Outcome:
    returncode: int | None  # None: killed on timeout
    output: str


def _run_child(
    cmd: list[str],
    workdir: str,
    env: dict[str, str],
    timeout_s: float,
    max_bytes: int,
    nonce: str,
) -> _Outcome:
    proc = subprocess.Popen(
        cmd,
        cwd=workdir,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # own process group: one killpg reaches every descendant
        close_fds=True,
    )
    buf = _TailBuffer(max_bytes)
    reader = threading.Thread(target=_drain, args=(proc.stdout, buf), daemon=True)
    reader.start()
    try:
        assert proc.stdin is not None
        proc.stdin.write(nonce.encode() + b"\n")
        proc.stdin.close()
    except OSError:  # the child died before reading: its exit status tells why
        pass

    # Wait without reaping (WNOWAIT): while the child is an unreaped zombie its pid, which
    # is also the process group id, cannot be reused, so the killpg below is always safe.
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    timed_out = False
    try:
        while os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    except ChildProcessError:  # reaped elsewhere (SIGCHLD ignored?): it has exited anyway
        pass
    finally:
        # Also after a normal exit, or if this thread is interrupted: nothing the candidate
        # started may outlive the verification.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    returncode = proc.wait()
    reader.join(timeout=5.0)
    if proc.stdout is not None:
        proc.stdout.close()
    return _Outcome(None if timed_out else returncode, buf.text())


def _tail(text: str, workdir: str, lines: int = _FEEDBACK_LINES) -> str:
    """Last lines of the child's output, with sandbox paths shortened to ``candidate.py``."""
    text = text.replace(workdir.rstrip("/") + "/", "")
    kept = [ln[:400] for ln in text.strip().splitlines()[-lines:]]
    return "\n".join(kept)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the sandbox process was killed by {name}"
    return f"the sandbox process exited with status {returncode} before reporting a result"


# --------------------------------------------------------------------------- verify


def verify(
    task_source: str,
    candidate_source: str,
    *,
    backend: str = "triton",
    config: VerifierConfig = DEFAULT_CONFIG,
) -> VerificationReport:
    """Check ``candidate_source`` (defines ModelNew) against ``task_source`` (defines Model).

    Never raises for problems of the candidate or the task: every outcome is a report.
    """
    started = time.perf_counter()
    device = detect_device(config.python)

    def report(verdict: str, summary: str, errors: list[str] | None = None) -> VerificationReport:
        return VerificationReport(
            verdict=verdict,  # type: ignore[arg-type]
            summary=summary,
            errors=errors if errors is not None else [summary],
            device=device,
            backend=backend,
            duration_s=time.perf_counter() - started,
        )

    try:
        check_candidate_source(candidate_source)
    except CandidateError as exc:
        return report("error", str(exc))
    if backend == "cuda" and device != "cuda":
        return report("unsupported", "backend 'cuda' is unsupported on this device (no CUDA GPU)")
    if backend not in SUPPORTED_BACKENDS:
        supported = ", ".join(sorted(SUPPORTED_BACKENDS))
        return report("unsupported", f"backend {backend!r} is unsupported (supported: {supported})")
    try:
        check_task_source(task_source, "task.py")
    except TaskFileError as exc:
        return report("error", str(exc))

    plan = _sandbox_plan(config.python, device, config.memory_mb)
    workdir = tempfile.mkdtemp(prefix="kf-verify-")
    try:
        Path(workdir, "task.py").write_text(task_source)
        Path(workdir, "candidate.py").write_text(candidate_source)
        job = {
            "task_file": "task.py",
            "candidate_file": "candidate.py",
            "trials": config.trials,
            "seed": config.seed,
            "device": device,
            "tolerances": config.tolerances or DEFAULT_TOLERANCES,
            "memory_kind": plan.memory_kind,
            "memory_mb": config.memory_mb,
        }
        Path(workdir, "job.json").write_text(json.dumps(job))
        env = _base_env(workdir)
        env["TRITON_CACHE_DIR"] = str(Path(workdir, ".triton", "cache"))
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"  # Triton kernels run in the numpy interpreter
        cmd = [*plan.prefix, config.python, "-I", str(SANDBOX_CHILD), workdir]
        nonce = secrets.token_hex(16)
        try:
            outcome = _run_child(
                cmd, workdir, env, config.timeout_s, config.max_output_bytes, nonce
            )
        except OSError as exc:
            return report("error", f"could not start the sandbox: {exc}")

        if outcome.returncode is None:
            summary = (
                f"timeout: verification exceeded the {config.timeout_s:g} s limit and was killed"
            )
            errors = [
                summary + " (an endless loop in forward() or in the kernel, or a kernel far "
                "too slow for the input size?)"
            ]
            if outcome.output.strip():
                errors.append("last output:\n" + _tail(outcome.output, workdir, 10))
            return report("timeout", summary, errors)

        result_path = Path(workdir, "result.json")
        raw = result_path.read_bytes() if result_path.is_file() else b""
        parsed: VerificationReport | None = None
        if raw:
            try:
                if msgspec.json.decode(raw, type=_Signed).nonce == nonce:
                    parsed = msgspec.json.decode(raw, type=VerificationReport)
            except msgspec.DecodeError:
                parsed = None
        if parsed is None:
            if raw:
                summary = "the sandbox wrote an invalid or unsigned result (candidate tampering?)"
            else:
                summary = _describe_exit(outcome.returncode)
            errors = [summary]
            if outcome.output.strip():
                errors.append("output of the sandbox (tail):\n" + _tail(outcome.output, workdir))
            return report("error", summary, errors)
        return msgspec.structs.replace(
            parsed,
            device=device,
            backend=backend,
            duration_s=time.perf_counter() - started,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
