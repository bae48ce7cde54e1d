"""What this machine allows a sandbox, probed once per process: whether a GPU is usable,
which namespaces cut a process off the network, the strongest isolation under which a
sandbox's runtime still works (its :class:`SandboxPlan`: a mount namespace with the view
that hides secrets, ``nobody``, its own ``/proc``, no network; or what is missing, and
whether candidates must then be refused), and the same without the runtime for
``kernelflow health`` (:func:`isolation_status`).

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

from kernelflow.sandbox.confine import (
    ALLOW_NETWORK_ENV,
    network_opted_in,
    unavailable_reason,
)
from kernelflow.sandbox.process import isolated_module, sandbox_env

__all__ = [
    "GPU_DEVICE_FILES",
    "PROBE_TIMEOUT_S",
    "IsolationStatus",
    "ProbeAttempt",
    "SandboxPlan",
    "detect_device",
    "device_env",
    "isolation_status",
    "network_prefixes",
    "plan_from",
    "probe_args",
    "probe_failure",
    "probed_once",
    "run_quiet",
    "sandbox_plan",
    "visible_gpus",
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


def run_quiet(
    cmd: list[str],
    timeout: float,
    env: dict[str, str] | None = None,
    failed: list[str] | None = None,
) -> str | None:
    """Run a short probe command; its stdout, or None if it failed in any way (then its
    stdout and the last line of its stderr, or the error, are appended to ``failed`` if
    given)."""
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
    except (OSError, subprocess.SubprocessError) as exc:
        if failed is not None:
            failed.append(f"isolation: unavailable: {exc}")
        return None
    out = done.stdout.decode(errors="replace")
    if done.returncode == 0:
        return out
    if failed is not None:
        failed.append(probe_failure(out, done.stderr.decode(errors="replace")))
    return None


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


@probed_once
def visible_gpus(python: str = sys.executable) -> tuple[str, ...]:
    """The CUDA devices a sandbox of ``python`` can use here, named as
    ``CUDA_VISIBLE_DEVICES`` names them (what ``kernelflow daemon --devices all`` gives
    one verifier each): the entries of this process's own ``CUDA_VISIBLE_DEVICES`` where
    it sets one (a sandbox pinned to one of them sees that device, not the device of that
    index), else the indices of the devices torch counts. None on a machine without the
    device files a GPU needs, or whose torch sees none. Asked as ``detect_device`` asks,
    once per interpreter."""
    if not any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        return ()
    code = "import torch\nprint(torch.cuda.device_count() if torch.cuda.is_available() else 0)\n"
    out = run_quiet([python, "-I", "-c", code], PROBE_TIMEOUT_S, sandbox_env(tempfile.gettempdir()))
    last = out.strip().splitlines()[-1] if out and out.strip() else ""
    count = int(last) if last.isdigit() else 0
    masked = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if masked:
        # CUDA stops at the first entry it cannot use: torch's count is of the first ones.
        return tuple(name.strip() for name in masked.split(","))[:count]
    return tuple(str(index) for index in range(count))


def probe_failure(out: str, stderr: str, otherwise: str = "") -> str:
    """What a failed probe said, as ``run_quiet`` reports it: its stdout, then the last line
    of its stderr (or ``otherwise``) as an ``error:`` line."""
    errors = stderr.strip().splitlines()
    why = errors[-1][:300] if errors else otherwise
    return out + (f"error: {why}\n" if why else "")


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
    # "as", "data" or "none": see kernelflow.sandbox.limits.apply_limits
    memory_kind: str
    # The sandbox's whole confinement works (sandbox.confine.confine_candidate): its own
    # mount namespace with the read-only view that hides secrets, ``nobody``.
    fs_isolation: bool = False
    filesystem: str = "not isolated: mount namespaces are not available here"
    # The sandbox is cut off every network (a namespace of its own, or its worker's).
    network_isolated: bool = False
    # What the probe found, in words: "network=...", "user=...", "proc=...".
    isolation: tuple[str, ...] = ()
    # Why the confinement does not work here ("" when it does).
    problem: str = ""

    @property
    def refusal(self) -> str | None:
        """Why a verifier must answer ``unsupported`` instead of running candidates here
        (the isolation is incomplete and ``KF_SANDBOX_ALLOW_NETWORK`` does not opt in),
        or None."""
        if network_opted_in():
            return None
        if not self.fs_isolation:
            return unavailable_reason(self.problem or "no mount namespace")
        if not self.network_isolated:
            return unavailable_reason("no network namespace")
        return None

    @property
    def notes(self) -> tuple[str, ...]:
        """What each verification report under this plan says of its missing isolation
        (only ever non-empty where the operator opted in)."""
        missing = []
        if not self.fs_isolation:
            missing.append("no mount namespace: it can read whatever the daemon's user can")
        if not self.network_isolated:
            missing.append("no network namespace: it can reach the network")
        if not missing or not network_opted_in():
            return ()
        return (f"sandbox: NOT isolated ({ALLOW_NETWORK_ENV}=1): " + "; ".join(missing),)


def _said(out: str, prefix: str) -> list[str]:
    return [ln[len(prefix) :].strip() for ln in out.splitlines() if ln.startswith(prefix)]


# One way of trying a sandbox plan's combination (:func:`plan_from`): under network
# ``prefix``, memory limit ``kind``, with the whole confinement or not (``fs``), run the
# probe (``--probe DEVICE KIND MEMORY_MB [fs]``); what it printed on stdout if it
# succeeded (else None), and what it said when it failed (as ``run_quiet``'s ``failed``).
ProbeAttempt = Callable[[tuple[str, ...], str, bool], tuple[str | None, str]]


@probed_once
def sandbox_plan(python: str, device: str, memory_mb: int, entry: str) -> SandboxPlan:
    """The strongest isolation under which the sandbox module ``entry``, started fresh
    for each candidate, still works here (probed once, in short processes). ``python -I
    -m ENTRY --probe DEVICE MEMORY_KIND MEMORY_MB [fs]`` must apply the limits (with
    ``fs``, inside :func:`~kernelflow.sandbox.confine.probe_isolation`: the whole
    confinement of a candidate), ready its runtime and print ``ok`` last. (A warm
    process's sandboxes are probed in its forks instead: ``warm.warm_sandbox_plan``.)"""
    env = device_env(tempfile.gettempdir(), device)
    env[ALLOW_NETWORK_ENV] = "1"  # the probe reports what is missing rather than refusing

    def fresh(prefix: tuple[str, ...], kind: str, fs: bool) -> tuple[str | None, str]:
        args = ["--probe", *probe_args(device, kind, memory_mb, fs)]
        cmd = [*prefix, *isolated_module(python, entry, *args)]
        failed: list[str] = []
        return run_quiet(cmd, PROBE_TIMEOUT_S, env, failed=failed), "".join(failed)

    return plan_from(fresh, device)


def probe_args(device: str, kind: str, memory_mb: int, fs: bool) -> list[str]:
    """The sandbox module's probe arguments, after ``--probe``."""
    return [device, kind, str(memory_mb), *(["fs"] if fs else [])]


def plan_from(attempt: ProbeAttempt, device: str) -> SandboxPlan:
    """The first combination ``attempt`` finds working, strongest first.

    Network: the first of :func:`network_prefixes` that the runtime accepts (the sandbox
    also unshares a network namespace of its own). Memory: RLIMIT_AS on CPU; on CUDA,
    RLIMIT_AS would refuse the driver's huge virtual address reservations, so RLIMIT_DATA
    is tried there, then no memory limit. Confinement: each combination is tried first with
    the whole of it (its mount namespace and view, ``nobody``, a fresh ``/proc``), then
    without (``plan.fs_isolation``, ``plan.filesystem``, ``plan.isolation`` say which;
    ``plan.refusal`` says whether candidates may run at all).
    """
    kinds = ("as", "none") if device == "cpu" else ("data", "none")
    problems: list[str] = []
    crashes: list[str] = []  # what a probe died of, where it did not say what was missing
    for prefix in network_prefixes():
        for kind in kinds:
            for fs in (True, False):
                out, failed = attempt(prefix, kind, fs)
                problems += _said(failed, "isolation: unavailable:")
                crashes += _said(failed, "error:")
                if out is None or not out.strip().endswith("ok"):
                    continue
                if not fs:
                    problem = problems[0] if problems else "the confined runtime failed"
                    return SandboxPlan(prefix, kind, network_isolated=bool(prefix), problem=problem)
                said = _said(out, "filesystem:")
                found = tuple(_said(out, "isolation:"))
                return SandboxPlan(
                    prefix,
                    kind,
                    True,
                    said[0] if said else "isolated",
                    network_isolated="network=isolated" in found,
                    isolation=found,
                )
    # Nothing worked (torch missing?): run unconfined; the sandbox will report the real error.
    why = problems[0] if problems else "the probe failed" + (f": {crashes[0]}" if crashes else "")
    return SandboxPlan((), kinds[0], problem=why)


@dataclass(frozen=True)
class IsolationStatus:
    """How this machine isolates candidates (the tools' and a verifier's sandboxes), for
    ``kernelflow health``: whether completely, what the probe said, the operator's opt-in,
    and the refusal a verifier answers (None: candidates run)."""

    isolated: bool
    said: tuple[str, ...]
    opted_in: bool
    refusal: str | None


def isolation_status(python: str = sys.executable) -> IsolationStatus:
    """How this machine isolates a candidate (probed once, without its runtime: the stdlib
    sandbox of ``python -I -m kernelflow.sandbox.confined_exec --probe`` under the
    strongest network prefix; a fraction of a second), and what the operator's opt-in
    makes of it now."""
    confined, said, problem = _probe_confinement(python)
    network = "network=isolated" in said
    plan = SandboxPlan(
        network_prefixes()[0],
        "none",
        fs_isolation=confined,
        network_isolated=network,
        problem=problem,
    )
    return IsolationStatus(confined and network, said, network_opted_in(), plan.refusal)


@functools.cache
def _probe_confinement(python: str) -> tuple[bool, tuple[str, ...], str]:
    from kernelflow.sandbox.confined_exec import MODULE, PROBE

    env = sandbox_env(tempfile.gettempdir())
    env[ALLOW_NETWORK_ENV] = "1"  # to learn what is missing rather than be refused
    cmd = [*network_prefixes()[0], *isolated_module(python, MODULE, PROBE)]
    failed: list[str] = []
    out = run_quiet(cmd, 60.0, env, failed=failed)
    text = out if out is not None else "".join(failed)
    said = tuple(_said(text, "filesystem:") + _said(text, "isolation:"))
    unavailable = _said(text, "isolation: unavailable:")
    problem = unavailable[0] if unavailable else "" if out is not None else "the probe failed"
    return out is not None and not unavailable, said, problem
