"""What this machine allows a sandbox, probed once per process: whether a GPU is usable,
which namespaces cut a process off the network, and the strongest isolation under which
a sandbox's runtime still works (its :class:`SandboxPlan`).

Parent side: runs in the daemon, never imports torch (initialising CUDA here would break
forking and tie the daemon to the GPU); every question is asked in a short subprocess.
"""

from __future__ import annotations

import functools
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from kernelflow.actors.sandbox.process import isolated_module, sandbox_env

__all__ = [
    "GPU_DEVICE_FILES",
    "PROBE_TIMEOUT_S",
    "SandboxPlan",
    "detect_device",
    "device_env",
    "network_prefixes",
    "probed_once",
    "run_quiet",
    "sandbox_plan",
]

PROBE_TIMEOUT_S = 180.0
# NVIDIA's control device, AMD ROCm's compute device, WSL2's GPU paravirtualisation: where
# none exists (and a container passes them through when it passes a GPU), no torch build
# can see a GPU.
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/dxg")

P = ParamSpec("P")
R = TypeVar("R")


def device_env(home: str, device: str, gpu: str | None = None) -> dict[str, str]:
    """:func:`sandbox_env` for a process that runs kernels on ``device``: on the CPU,
    Triton kernels run in its numpy interpreter."""
    env = sandbox_env(home, gpu)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    return env


def run_quiet(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> str | None:
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


def probed_once(probe: Callable[P, R]) -> Callable[P, R]:
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


@probed_once
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
    out = run_quiet([python, "-I", "-c", code], PROBE_TIMEOUT_S, env)
    return "cuda" if out is not None and out.strip().endswith("cuda") else "cpu"


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
    working = [p for p in candidates if run_quiet([*p, "true"], 10.0) is not None]
    return (*working, ())


@dataclass(frozen=True)
class SandboxPlan:
    prefix: tuple[str, ...]  # command prefix giving network isolation, or ()
    # "as", "data" or "none": see kernelflow.actors.sandbox.limits.apply_limits
    memory_kind: str
    # Read-only file system but for the sandbox's work dir (sandbox.filesystem).
    fs_isolation: bool = False
    filesystem: str = "not isolated: mount namespaces are not available here"


@probed_once
def sandbox_plan(python: str, device: str, memory_mb: int, entry: str) -> SandboxPlan:
    """The strongest isolation under which the sandbox module ``entry`` still works here
    (probed once). ``python -I -m ENTRY --probe DEVICE MEMORY_KIND MEMORY_MB [fs]`` must
    apply the limits (with ``fs``, inside :func:`~kernelflow.actors.sandbox.filesystem.
    probe_isolation`), ready its runtime and print ``ok`` last.

    Network: the first of :func:`network_prefixes` that the runtime accepts. Memory:
    RLIMIT_AS on CPU; on CUDA, RLIMIT_AS would refuse the driver's huge virtual address
    reservations, so RLIMIT_DATA is tried there, then no memory limit. File system: each
    combination is tried first with the sandbox's read-only mount namespace, then without
    (``plan.fs_isolation`` / ``plan.filesystem`` say which; reports note its absence).
    """
    kinds = ("as", "none") if device == "cpu" else ("data", "none")
    env = device_env(tempfile.gettempdir(), device)
    for prefix in network_prefixes():
        for kind in kinds:
            for fs in (True, False):
                probe = ("--probe", device, kind, str(memory_mb), *(["fs"] if fs else []))
                cmd = [*prefix, *isolated_module(python, entry, *probe)]
                out = run_quiet(cmd, PROBE_TIMEOUT_S, env)
                if out is not None and out.strip().endswith("ok"):
                    if not fs:
                        return SandboxPlan(prefix, kind)
                    said = [ln for ln in out.splitlines() if ln.startswith("filesystem: ")]
                    return SandboxPlan(prefix, kind, True, said[0][12:] if said else "isolated")
    # Nothing worked (torch missing?): run unconfined; the sandbox will report the real error.
    return SandboxPlan((), kinds[0])
