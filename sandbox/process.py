"""Running a sandboxed process from the parent: its minimal environment, a wall-clock
timeout that kills its whole process group, and bounded output (the tail is kept: the end
of a traceback matters most)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kernelflow.sandbox.confine import ALLOW_NETWORK_ENV, network_opted_in
from kernelflow.sandbox.view import HIDE_ENV

__all__ = [
    "ProcessOutcome",
    "TailBuffer",
    "daemon_paths",
    "drain",
    "isolated_module",
    "read_tail",
    "run_process",
    "sandbox_env",
]

# Where the kernelflow this process runs was imported from (site-packages, or a checkout
# whose layers its editable install maps): the folder holding the package, which is
# imported already as this module's parent.
_PACKAGE_ROOT = str(Path(sys.modules["kernelflow"].__file__ or ".").resolve().parent.parent)
# ``python -I`` ignores PYTHONPATH and the user's site, so ``-m`` alone would run whatever
# kernelflow that interpreter's site-packages hold: this runs the module of ours instead.
_RUN_OURS = (
    "import runpy, sys; sys.path.insert(0, sys.argv[1]); module = sys.argv[2]; "
    "sys.argv[:3] = [module]; runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def isolated_module(python: str, module: str, *args: str) -> list[str]:
    """The command that runs ``module`` of this very kernelflow, as ``python -I -m``
    would: an isolated interpreter (nothing of the environment's Python settings)."""
    return [python, "-I", "-c", _RUN_OURS, _PACKAGE_ROOT, module, *args]


# Environment variables a CUDA/Triton toolchain may need to find the driver, the compiler or
# its thread count; everything else from the daemon's environment stays out of the sandbox.
PASSTHROUGH_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    "TRITON_LIBCUDA_PATH",
    "TRITON_PTXAS_PATH",
    "OMP_NUM_THREADS",
)


def sandbox_env(home: str, gpu: str | None = None) -> dict[str, str]:
    """The whole environment of a sandboxed process: a minimal one, with ``home`` as its
    HOME and TMPDIR; nothing of the daemon's (API keys, tokens) leaks in. With ``gpu``,
    the process sees that CUDA device only. It also tells the sandbox what to hide from the
    candidate (``KF_SANDBOX_HIDE``: the daemon's home, data dir and config, which the
    sandbox removes from its environment before anything untrusted runs) and whether the
    operator opted in to running candidates unisolated (``KF_SANDBOX_ALLOW_NETWORK``)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
    }
    for name in PASSTHROUGH_ENV:
        if name in os.environ:
            env[name] = os.environ[name]
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    hidden = daemon_paths()
    if hidden:
        env[HIDE_ENV] = os.pathsep.join(hidden)
    if network_opted_in():
        env[ALLOW_NETWORK_ENV] = "1"
    return env


# Environment variables naming the daemon's own files and directories (its data, config,
# caches, LLM provider file): hidden from sandboxes, wherever they are.
_DAEMON_PATH_ENV = (
    "KF_DATA_DIR",
    "KF_LLM_CONFIG",
    "XDG_DATA_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
)


def daemon_paths() -> list[str]:
    """The daemon's home (``$HOME`` and its user's home), data dir, config and cache dirs:
    what no sandbox may see (absolute paths, "/" left out)."""
    paths = [os.environ.get("HOME", "")]
    with contextlib.suppress(KeyError, ImportError):
        import pwd

        paths.append(pwd.getpwuid(os.getuid()).pw_dir)
    paths += [os.environ.get(name, "") for name in _DAEMON_PATH_ENV]
    found = []
    for path in paths:
        if path and os.path.isabs(path) and os.path.abspath(path) != "/":
            found.append(os.path.abspath(path))
    return sorted(set(found))


class TailBuffer:
    """Keeps the last ``limit`` bytes of a stream."""

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
        return _marked(self.data, self.dropped)


def _marked(data: bytes | bytearray, dropped: int) -> str:
    body = data.decode(errors="replace")
    return f"[... {dropped} bytes dropped ...]\n{body}" if dropped else body


def drain(stream: IO[bytes] | None, buf: TailBuffer) -> None:
    """Feed ``buf`` everything ``stream`` yields until it closes."""
    if stream is None:
        return
    fd = stream.fileno()
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            return
        if not chunk:
            return
        buf.feed(chunk)


def read_tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of a file a sandbox wrote its output to ("" if none)."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - limit))
            data = fh.read()
    except OSError:
        return ""
    return _marked(data, max(0, size - limit))


@dataclass
class ProcessOutcome:
    returncode: int | None  # None: killed on timeout; negative: killed by that signal
    output: str
    supervisor_lost: bool = False  # the sandbox's parent process was killed from inside
    result: bytes = b""  # what the sandbox wrote on its result pipe, if it has one


def run_process(
    cmd: list[str],
    workdir: str,
    env: dict[str, str],
    timeout_s: float,
    max_bytes: int,
    stdin: bytes = b"",
    pass_fds: tuple[int, ...] = (),
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
        pass_fds=pass_fds,
    )
    buf = TailBuffer(max_bytes)
    reader = threading.Thread(target=drain, args=(proc.stdout, buf), daemon=True)
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
