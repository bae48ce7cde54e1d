"""Parent side of the verifier: run one candidate in a sandboxed child process.

This module runs inside the daemon and never imports or executes candidate code (nor torch:
initialising CUDA here would break forking and tie the daemon to the GPU). Before anything
runs, the candidate passes the static reward-hack gate (:mod:`kernelflow.actors.verifier.gate`).
Then each verification gets a private temp dir and a sandbox process: by default forked
from a warm worker (``sandbox_child.py --serve``, torch and triton already imported, CUDA
never initialised) that lives in its own network namespace when the machine allows it;
the sandbox gets resource limits, its own PID namespace and the ``nobody`` user where
possible, a wall-clock timeout that kills its whole process group, and bounded output.
Where mount namespaces work (probed once, ``_SandboxPlan.fs_isolation``), everything but
its temp dir is read-only to it, so writes elsewhere fail at runtime whatever the gate
missed; elsewhere each report notes that the file system is not isolated.
``VerifierConfig(warm=False)`` starts a fresh ``python -I sandbox_child.py`` instead.
The agents' command tools run in the same sandbox (``kernelflow.actors.tools.sandboxed``) through
the public pieces here: :func:`network_prefixes`, :func:`sandbox_env`, :func:`run_process`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import inspect
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import msgspec

from kernelflow.actors.verifier.gate import check_candidate
from kernelflow.actors.verifier.taskfile import (
    CandidateError,
    TaskFileError,
    check_candidate_source,
    check_task_source,
    size_constants,
)
from kernelflow.actors.workdirs import VERIFY_PREFIX, locked_workdir
from kernelflow.events.model import VerificationReport

__all__ = [
    "SANDBOX_CHILD",
    "SUPPORTED_BACKENDS",
    "ProcessOutcome",
    "VerifierConfig",
    "auto_shape_sets",
    "detect_device",
    "feedback_text",
    "network_prefixes",
    "run_process",
    "sandbox_env",
    "shutdown_workers",
    "verify",
    "warm_up",
]

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
# NVIDIA's control device, AMD ROCm's compute device, WSL2's GPU paravirtualisation: where
# none exists (and a container passes them through when it passes a GPU), no torch build
# can see a GPU.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
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
    # Size overrides of the task's module-level int constants, one dict per shape set;
    # None: automatic (the task's sizes, capped on the CPU, plus a perturbed set that
    # catches shape-specialised code). ``({},)`` checks the task's own sizes only.
    shapes: tuple[dict[str, int], ...] | None = None
    cpu_max_size: int = 1024  # on the CPU, larger size constants are scaled down
    static_gate: bool = True  # the AST reward-hack gate (disable only to test the sandbox)
    warm: bool = True  # fork from a warm worker instead of starting a fresh interpreter
    device: str | None = None  # "cpu" / "cuda" to require one; None: whatever is here
    # The CUDA device (index or UUID) this verifier owns; its sandboxes see only that one
    # (``kernelflow daemon --gpus``: one verifier actor per device). None: all of them.
    gpu: str | None = None
    timing: bool = True  # on a GPU: time candidate vs baseline
    timing_reps: int = 50
    baseline: str = "eager"  # or "compile" (torch.compile of the reference)
    feedback_chars: int = 2000


DEFAULT_CONFIG = VerifierConfig()


class _Signed(msgspec.Struct):
    nonce: str = ""


# --------------------------------------------------------------------------- probes


def sandbox_env(home: str, gpu: str | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed process: a minimal one, with ``home`` as its
    HOME and TMPDIR; nothing of the daemon's (API keys, tokens) leaks in. With ``gpu``,
    the process sees that CUDA device only."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
    }
    for name in _PASSTHROUGH_ENV:
        if name in os.environ:
            env[name] = os.environ[name]
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def _run_quiet(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str | None:
    """Run a short probe command; its stdout, or None if it failed in any way."""
    try:
        done = subprocess.run(
            cmd,
            env=env if env is not None else sandbox_env(tempfile.gettempdir()),
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


P = ParamSpec("P")
R = TypeVar("R")


def _probed_once(probe: Callable[P, R]) -> Callable[P, R]:
    """Cache ``probe``'s answer per argument values (defaults included: ``f()`` and
    ``f(default)`` are one probe), computed once even when threads ask at the same time:
    a probe takes seconds, and a verification that starts during the daemon's warm-up
    waits for its answer rather than probing again beside it."""
    signature = inspect.signature(probe)
    answers: dict[tuple[Any, ...], R] = {}
    lock = threading.Lock()

    @functools.wraps(probe)
    def cached(*args: P.args, **kwargs: P.kwargs) -> R:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = tuple(bound.arguments.values())
        with lock:
            if key not in answers:
                answers[key] = probe(*args, **kwargs)
            return answers[key]

    return cached


@_probed_once
def detect_device(python: str = sys.executable, gpu: str | None = None) -> str:
    """Return "cuda" if ``python`` sees a usable CUDA GPU (``gpu``, if given), else "cpu".

    Asked in a short subprocess (once per interpreter and GPU, then cached) so the daemon
    itself never initialises CUDA; not asked (two seconds of importing torch) on a
    machine without the device files any GPU torch could use needs.
    """
    if not any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        return "cpu"
    code = (
        "import torch\n"
        "ok = torch.cuda.is_available() and torch.cuda.device_count() > 0\n"
        "print('cuda' if ok else 'cpu')\n"
    )
    env = sandbox_env(tempfile.gettempdir(), gpu)
    out = _run_quiet([python, "-I", "-c", code], _PROBE_TIMEOUT_S, env)
    return "cuda" if out is not None and out.strip().endswith("cuda") else "cpu"


@dataclass(frozen=True)
class _SandboxPlan:
    prefix: tuple[str, ...]  # command prefix giving network isolation, or ()
    memory_kind: str  # "as", "data" or "none": see sandbox_child.apply_limits
    # Read-only file system but for the sandbox's work dir (sandbox_child.isolate_filesystem).
    fs_isolation: bool = False
    filesystem: str = "not isolated: mount namespaces are not available here"


@functools.cache
def network_prefixes() -> tuple[tuple[str, ...], ...]:
    """Command prefixes that cut a process off the network and work here (probed once),
    strongest first; the last one is always ``()``, no isolation.

    ``unshare --net --map-root-user`` (unprivileged user + network namespace; no
    capabilities in the real namespace either), else ``unshare --net`` (works as root), else
    nothing: containers often forbid namespaces, and isolation must not make the sandbox
    fragile. When namespaces are not allowed, unshare fails immediately.
    """
    candidates: list[tuple[str, ...]] = []
    if shutil.which("unshare"):
        # As real root, plain --net keeps the sandbox able to drop to `nobody`.
        pair = [("unshare", "--net", "--map-root-user"), ("unshare", "--net")]
        candidates += pair[::-1] if os.geteuid() == 0 else pair
    working = [p for p in candidates if _run_quiet([*p, "true"], 10.0) is not None]
    return (*working, ())


@_probed_once
def _sandbox_plan(python: str, device: str, memory_mb: int) -> _SandboxPlan:
    """The strongest isolation under which torch+triton still work here (probed once).

    Network: the first of :func:`network_prefixes` that torch+triton accept. Memory:
    RLIMIT_AS on CPU; on CUDA, RLIMIT_AS would refuse the driver's huge virtual address
    reservations, so RLIMIT_DATA is tried there, then no memory limit. File system: each
    combination is tried first with the sandbox's read-only mount namespace, then without
    (``plan.fs_isolation`` / ``plan.filesystem`` say which; reports note its absence).
    """
    kinds = ("as", "none") if device == "cpu" else ("data", "none")
    env = sandbox_env(tempfile.gettempdir())
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    for prefix in network_prefixes():
        for kind in kinds:
            for fs in (True, False):
                cmd = [
                    *prefix,
                    python,
                    "-I",
                    str(SANDBOX_CHILD),
                    "--probe",
                    device,
                    kind,
                    str(memory_mb),
                    *(["fs"] if fs else []),
                ]
                out = _run_quiet(cmd, _PROBE_TIMEOUT_S, env)
                if out is not None and out.strip().endswith("ok"):
                    if not fs:
                        return _SandboxPlan(prefix, kind)
                    said = [ln for ln in out.splitlines() if ln.startswith("filesystem: ")]
                    return _SandboxPlan(prefix, kind, True, said[0][12:] if said else "isolated")
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
class ProcessOutcome:
    returncode: int | None  # None: killed on timeout; negative: killed by that signal
    output: str
    supervisor_lost: bool = False  # the sandbox's parent process was killed from inside


def run_process(
    cmd: list[str],
    workdir: str,
    env: dict[str, str],
    timeout_s: float,
    max_bytes: int,
    stdin: bytes = b"",
) -> ProcessOutcome:
    """Run ``cmd`` in its own process group with ``stdin`` as its whole input; keep the
    last ``max_bytes`` of its combined stdout/stderr. On timeout, and also after a normal
    exit, the whole group is killed: nothing it started outlives the call."""
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
        proc.stdin.write(stdin)
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
    return ProcessOutcome(None if timed_out else returncode, buf.text())


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


# --------------------------------------------------------------------------- warm worker


class _WorkerLost(Exception):
    """The warm worker died or stopped answering; it is replaced by a fresh one."""


class _WarmWorker:
    """A pre-started ``sandbox_child.py --serve`` process: torch and triton imported, CUDA
    untouched. It forks one sandbox per job; one job at a time."""

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
        self.stderr = _TailBuffer(16_000)
        self._drainer = threading.Thread(
            target=_drain, args=(self.proc.stderr, self.stderr), daemon=True
        )
        self._drainer.start()
        self.pending = b""
        ready = self._read_line(_PROBE_TIMEOUT_S)
        if not ready.get("ready"):
            self.close()
            raise _WorkerLost("the warm worker did not start: " + self.last_words())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def last_words(self) -> str:
        """The end of what the worker wrote to stderr, all of it once it has exited (its
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
                raise _WorkerLost("the warm worker stopped answering")
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _WorkerLost("the warm worker exited: " + self.last_words())
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        try:
            value = json.loads(line)
        except ValueError as exc:
            raise _WorkerLost(f"the warm worker said something odd: {line[:200]!r}") from exc
        return value if isinstance(value, dict) else {}

    def run(self, workdir: str, nonce: str, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        line = json.dumps({"workdir": workdir, "nonce": nonce, "timeout_s": timeout_s})
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except OSError as exc:
            raise _WorkerLost(f"the warm worker is gone: {exc}") from exc
        # The worker enforces the timeout itself; the grace covers killing and reaping.
        return self._read_line(timeout_s + 30.0)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


_WORKERS: dict[tuple[str, str, tuple[str, ...], str | None], _WarmWorker] = {}
_WORKERS_LOCK = threading.Lock()


def _worker_for(python: str, device: str, prefix: tuple[str, ...], gpu: str | None) -> _WarmWorker:
    """The warm worker for ``device`` started under the network isolation ``prefix`` (the
    sandbox plan's other limits apply to each job's forked child, not to the worker)."""
    key = (python, device, prefix, gpu)
    with _WORKERS_LOCK:
        worker = _WORKERS.get(key)
        if worker is not None and worker.alive():
            return worker
        if worker is not None:
            worker.close()
        home = tempfile.gettempdir()
        env = sandbox_env(home, gpu)
        if device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        cmd = [*prefix, python, "-I", str(SANDBOX_CHILD), "--serve", device]
        worker = _WarmWorker(cmd, env, home)
        _WORKERS[key] = worker
        return worker


def _discard_worker(worker: _WarmWorker) -> None:
    with _WORKERS_LOCK:
        for key, value in list(_WORKERS.items()):
            if value is worker:
                del _WORKERS[key]
    worker.close()


def warm_up(config: VerifierConfig = DEFAULT_CONFIG) -> str:
    """Do now what the first verification under ``config`` would otherwise do first: find
    the device, probe the sandbox and start the warm worker (seconds of importing torch
    and triton each). What was readied, in words.

    A daemon's verifier calls this as it starts, so that its first candidate, which comes
    only after the designer's and coder's LLM calls, waits for none of it. Raises what
    those steps raise (no python with torch, a worker that cannot start): the
    verification would then report the same problem itself. Call it from a thread that
    outlives the verifications: the worker dies with the thread that started it (Linux
    sends PR_SET_PDEATHSIG when that thread ends). Verifiers of a pool that
    share a configuration probe once and share the worker: each step is done once, and
    a verification that asks meanwhile waits for it."""
    device = detect_device(config.python, config.gpu)
    if config.device == "cuda" and device != "cuda":
        return "nothing to ready: no CUDA GPU here, every verification answers unsupported"
    if config.device == "cpu":
        device = "cpu"
    if not config.warm:
        _sandbox_plan(config.python, device, config.memory_mb)
    else:
        # The probe and the worker each spend seconds importing torch and triton: the
        # worker starts beside the probe, under the network isolation the probe picks
        # whenever torch works under it at all (the strongest that works here), and is
        # replaced in the rare case the probe picked another.
        with concurrent.futures.ThreadPoolExecutor(1, "kf-sandbox-probe") as probing:
            planned = probing.submit(_sandbox_plan, config.python, device, config.memory_mb)
            likely = network_prefixes()[0]
            early = None
            with contextlib.suppress(_WorkerLost):  # the probe finds out what works instead
                early = _worker_for(config.python, device, likely, config.gpu)
            plan = planned.result()
        if early is not None and plan.prefix != likely:
            _discard_worker(early)
        _worker_for(config.python, device, plan.prefix, config.gpu)
    return f"{device}, " + ("warm worker up" if config.warm else "a fresh sandbox per candidate")


def shutdown_workers() -> None:
    """Stop every warm worker of this process (they also die with it)."""
    with _WORKERS_LOCK:
        workers = list(_WORKERS.values())
        _WORKERS.clear()
    for worker in workers:
        worker.close()


def _run_warm(
    python: str, device: str, plan: _SandboxPlan, workdir: str, nonce: str, config: VerifierConfig
) -> ProcessOutcome:
    for attempt in range(2):
        worker = _worker_for(python, device, plan.prefix, config.gpu)
        with worker.lock:
            try:
                reply = worker.run(workdir, nonce, config.timeout_s)
            except _WorkerLost:
                _discard_worker(worker)
                if attempt == 0 and not Path(workdir, "output.log").exists():
                    continue  # died before this job started: try once more on a fresh one
                raise
        if reply.get("outcome") == "spawn_error":
            raise OSError(str(reply.get("error")))
        output = _read_tail(Path(workdir, "output.log"), config.max_output_bytes)
        if reply.get("outcome") == "timeout":
            return ProcessOutcome(None, output)
        code = -int(reply["signal"]) if "signal" in reply else int(reply.get("code", 0))
        return ProcessOutcome(code, output, bool(reply.get("intermediate_lost")))
    raise AssertionError("unreachable")


def _read_tail(path: Path, limit: int) -> str:
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    dropped = max(0, size - limit)
    body = data.decode(errors="replace")
    return f"[... {dropped} bytes dropped ...]\n{body}" if dropped else body


# --------------------------------------------------------------------------- shapes


def auto_shape_sets(task_source: str, device: str, cpu_max_size: int) -> list[dict[str, int]]:
    """Shape sets for a task: its own sizes (scaled down on the CPU: a constant above
    ``cpu_max_size`` becomes a smaller, non-power-of-two one), then every size of at least
    4 shrunk to about two thirds plus one, so code written for one shape fails."""
    consts = size_constants(task_source)
    if not consts:
        return [{}]
    first: dict[str, int] = {}
    if device == "cpu":
        for name, value in consts.items():
            if value > cpu_max_size:
                first[name] = cpu_max_size - cpu_max_size // 10 + 3
    current = {**consts, **first}
    second = {name: v * 2 // 3 + 1 for name, v in current.items() if v >= 4}
    return [first, second] if second else [first]


# --------------------------------------------------------------------------- verify


_VERDICT_ADVICE = {
    "compile_error": "The module or a kernel does not compile; fix the error below.",
    "runtime_error": "The candidate crashed while running; fix the error below.",
    "timeout": "The candidate did not finish in time (endless loop, or far too slow).",
    "mismatch": "The kernel runs but its results differ from the reference.",
    "rejected_static": "The code breaks a verifier rule; the kernel itself must do the work.",
    "rejected_runtime": "The candidate broke a rule while running; see the reason below.",
    "unsupported": "This backend cannot run on this device.",
}


def feedback_text(report: VerificationReport, limit: int = 2000) -> str:
    """A concise text for the coder: verdict, rule(s) broken, key error lines, mismatches."""
    if report.passed:
        return f"pass: {report.summary}"[:limit]
    parts = [f"Verdict: {report.verdict}. {_VERDICT_ADVICE.get(report.verdict, '')}"]
    parts.append(report.summary)
    if report.reasons and report.verdict.startswith("rejected"):
        parts.append("Rules broken:\n" + "\n".join(f"- {r}" for r in report.reasons[:8]))
    if report.mismatches:
        parts.append("First mismatching positions:\n" + "\n".join(report.mismatches[:5]))
    shown = set(report.reasons) | {report.summary}
    body = "\n".join(e for e in report.errors if e and e not in shown)
    if body:
        lines = body.splitlines()
        if len(lines) > 20:
            lines = ["...", *lines[-20:]]
        parts.append("\n".join(lines))
    text = "\n".join(p for p in parts if p)
    return text if len(text) <= limit else text[: limit - 15] + "\n[... trimmed]"


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
    device = detect_device(config.python, config.gpu)

    def finish(report: VerificationReport) -> VerificationReport:
        return msgspec.structs.replace(
            report,
            device=device,
            backend=backend,
            duration_s=time.perf_counter() - started,
            feedback=feedback_text(report, config.feedback_chars),
        )

    def report(
        verdict: str,
        summary: str,
        errors: list[str] | None = None,
        reasons: list[str] | None = None,
    ) -> VerificationReport:
        return finish(
            VerificationReport(
                verdict=verdict,  # type: ignore[arg-type]
                summary=summary,
                errors=errors if errors is not None else [summary],
                reasons=reasons if reasons is not None else [f"{verdict}: {summary}"],
            )
        )

    try:
        check_candidate_source(candidate_source)
    except CandidateError as exc:
        return report("compile_error", str(exc))
    if backend not in SUPPORTED_BACKENDS:
        supported = ", ".join(sorted(SUPPORTED_BACKENDS))
        return report("unsupported", f"backend {backend!r} is unsupported (supported: {supported})")
    if config.device == "cuda" and device != "cuda":
        where = f"GPU {config.gpu} is not visible" if config.gpu else "no CUDA GPU"
        return report("unsupported", f"device 'cuda' is unsupported here ({where})")
    if backend == "cuda" and device != "cuda":
        return report("unsupported", "backend 'cuda' is unsupported on this device (no CUDA GPU)")
    if config.device == "cpu" and device != "cpu":
        # A GPU machine asked to check on the CPU: the interpreter covers Triton only.
        if backend != "triton":
            return report("unsupported", f"backend {backend!r} cannot run on the CPU")
        device = "cpu"
    try:
        check_task_source(task_source, "task.py")
    except TaskFileError as exc:
        return report("runtime_error", str(exc), reasons=[f"task_error: {exc}"])
    if config.static_gate:
        violations = check_candidate(candidate_source, backend=backend, task_source=task_source)
        if violations:
            first = violations[0]
            return report(
                "rejected_static",
                f"static check: {first.rule} at line {first.line}: {first.message}"
                + (f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""),
                errors=[v.text() for v in violations[:10]],
                reasons=[v.text() for v in violations],
            )

    shapes = (
        [dict(s) for s in config.shapes]
        if config.shapes is not None
        else auto_shape_sets(task_source, device, config.cpu_max_size)
    )
    plan = _sandbox_plan(config.python, device, config.memory_mb)
    with locked_workdir(VERIFY_PREFIX) as workdir:
        Path(workdir, "task.py").write_text(task_source)
        Path(workdir, "candidate.py").write_text(candidate_source)
        job = {
            "task_file": "task.py",
            "candidate_file": "candidate.py",
            "trials": config.trials,
            "seed": config.seed,
            "device": device,
            "backend": backend,
            "shapes": shapes,
            "auto_shapes": config.shapes is None,
            "tolerances": config.tolerances or DEFAULT_TOLERANCES,
            "memory_kind": plan.memory_kind,
            "fs_isolation": plan.fs_isolation,
            "memory_mb": config.memory_mb,
            "timing": config.timing,
            "timing_reps": config.timing_reps,
            "baseline": config.baseline,
        }
        Path(workdir, "job.json").write_text(json.dumps(job))
        nonce = secrets.token_hex(16)
        try:
            if config.warm:
                outcome = _run_warm(config.python, device, plan, workdir, nonce, config)
            else:
                env = sandbox_env(workdir, config.gpu)
                env["TRITON_CACHE_DIR"] = str(Path(workdir, ".triton", "cache"))
                if device == "cpu":
                    env["TRITON_INTERPRET"] = "1"  # Triton kernels run in the numpy interpreter
                cmd = [*plan.prefix, config.python, "-I", str(SANDBOX_CHILD), workdir]
                outcome = run_process(
                    cmd,
                    workdir,
                    env,
                    config.timeout_s,
                    config.max_output_bytes,
                    stdin=nonce.encode() + b"\n",
                )
        except (OSError, _WorkerLost) as exc:
            return report("runtime_error", f"could not run the sandbox: {exc}")
        return finish(_interpret(outcome, workdir, nonce, config))


def _interpret(
    outcome: ProcessOutcome, workdir: str, nonce: str, config: VerifierConfig
) -> VerificationReport:
    """Turn what the sandbox left behind into a report."""
    if outcome.returncode is None:
        summary = f"timeout: verification exceeded the {config.timeout_s:g} s limit and was killed"
        errors = [
            summary + " (an endless loop in forward() or in the kernel, or a kernel far "
            "too slow for the input size?)"
        ]
        if outcome.output.strip():
            errors.append("last output:\n" + _tail(outcome.output, workdir, 10))
        return VerificationReport(
            verdict="timeout", summary=summary, errors=errors, reasons=[f"timeout: {summary}"]
        )
    result_path = Path(workdir, "result.json")
    try:
        raw = result_path.read_bytes() if result_path.is_file() else b""
    except OSError:
        raw = b""
    parsed: VerificationReport | None = None
    if raw:
        try:
            if msgspec.json.decode(raw, type=_Signed).nonce == nonce:
                parsed = msgspec.json.decode(raw, type=VerificationReport)
        except msgspec.DecodeError:
            parsed = None
    if parsed is not None and outcome.returncode == 0:
        return parsed
    tail = (
        ["output of the sandbox (tail):\n" + _tail(outcome.output, workdir)]
        if outcome.output.strip()
        else []
    )
    if raw and parsed is None:
        summary = "the sandbox wrote an invalid or unsigned result (candidate tampering?)"
        return VerificationReport(
            verdict="rejected_runtime",
            summary=summary,
            errors=[summary, *tail],
            reasons=[f"tampering: {summary}"],
        )
    if outcome.supervisor_lost:
        summary = (
            "the candidate killed the process supervising it (os.kill of its parent or its "
            "process group?)"
        )
        return VerificationReport(
            verdict="rejected_runtime",
            summary=summary,
            errors=[summary, *tail],
            reasons=[f"hostile: {summary}"],
        )
    summary = _describe_exit(outcome.returncode)
    return VerificationReport(
        verdict="runtime_error",
        summary=summary,
        errors=[summary, *tail],
        reasons=[f"crash: {summary}"],
    )
