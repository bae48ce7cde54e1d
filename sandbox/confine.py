"""Confinement of one sandboxed process, in the order it must happen, and the probe that
tells whether it works on this machine.

:func:`confine_candidate` is the whole of it, for one process about to run untrusted code
(best called as PID 1 of a new PID namespace, see
:func:`~kernelflow.sandbox.namespaces.unshare_pid_namespace`):

1. new mount, IPC and network namespaces (in a user namespace of its own where the process
   holds no privilege: a non-root daemon), refused (:class:`SandboxUnavailable`) where
   the machine allows none or no network isolation, unless the operator opted in
   (``KF_SANDBOX_ALLOW_NETWORK=1``);
2. the file-system view of :mod:`.view`: read-only, secrets and other sandboxes hidden,
   the work dir writable, a private ``/dev/shm``, a fresh ``/proc``;
3. the work dir as cwd and cache home;
4. the user ``nobody`` with no capability and no new privileges through exec;
5. the resource limits (and death with the parent).

:func:`confine` is the same for today's single-process sandbox, with the legacy fallback
where the probe found no mount namespace.

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kernelflow.sandbox.filesystem import PROBE_PREFIX, point_caches_at
from kernelflow.sandbox.limits import (
    JUDGE_FILE_SIZE_LIMIT,
    NPROC_LIMIT,
    apply_limits,
    drop_capabilities,
    drop_privileges,
)
from kernelflow.sandbox.namespaces import (
    become_nobody,
    enter_namespaces,
    network_isolated,
    unshare_pid_namespace,
)
from kernelflow.sandbox.view import HIDE_ENV, View, build_view

__all__ = [
    "ALLOW_NETWORK_ENV",
    "Confinement",
    "SandboxUnavailable",
    "confine",
    "confine_candidate",
    "confine_judge",
    "network_opted_in",
    "probe_isolation",
]

# The operator's opt-in to run candidates where the sandbox cannot isolate them (README,
# Configuration); passed on to sandboxes by ``sandbox_env``.
ALLOW_NETWORK_ENV = "KF_SANDBOX_ALLOW_NETWORK"
_YES = frozenset({"1", "true", "yes", "on"})


class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate a candidate (no namespaces, or no network namespace)
    and the operator did not opt in; ``reason`` says what is missing. The process is left
    half-confined: it must not run the candidate."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def network_opted_in(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``KF_SANDBOX_ALLOW_NETWORK`` (in ``env``, default this process's) opts in
    to running candidates without namespace isolation."""
    value = (os.environ if env is None else env).get(ALLOW_NETWORK_ENV, "")
    return value.strip().lower() in _YES


def unavailable_reason(missing: str) -> str:
    return (
        f"the sandbox cannot isolate candidates on this machine: {missing}; set "
        f"{ALLOW_NETWORK_ENV}=1 to run them anyway (they can then reach the network, and "
        "without a mount namespace read what the daemon's user can)"
    )


@dataclass
class Confinement:
    """What :func:`confine_candidate` did: the notes a report shows, the file-system view
    (None: not isolated), whether the network is cut off, who the process became."""

    notes: list[str] = field(default_factory=list)
    view: View | None = None
    network: bool = False
    user: str = ""
    user_namespace: bool = False


def confine_candidate(
    workdir: Path, *, memory_kind: str, memory_mb: int, allow_network: bool
) -> list[str]:
    """Confine this process, which is about to run candidate code, to ``workdir`` (see the
    module docstring); returns the notes for the verification report (what isolation is
    missing; none when complete).

    Call it in a freshly forked, single-threaded process that still holds the daemon's
    privileges (real root, or root of a user namespace; a non-root one works too where the
    kernel allows unprivileged user namespaces), before anything untrusted runs. As PID 1
    of a new PID namespace its ``/proc`` shows only that namespace; otherwise (as real root)
    only the processes of ``nobody``, or (else) nothing. ``workdir`` becomes the
    candidate's: give it a directory of its own, the only one it can see and write.
    ``memory_kind``/``memory_mb`` as in :func:`~kernelflow.sandbox.limits.
    apply_limits`. ``allow_network``: run even where the machine has no network (or no)
    namespaces, noting it; otherwise raises :class:`SandboxUnavailable` there."""
    return _confine(workdir, memory_kind, memory_mb, allow_network).notes


def _confine(workdir: Path, memory_kind: str, memory_mb: int, allow_network: bool) -> Confinement:
    # The parent now, while this process's request to die with it holds (becoming nobody
    # clears it; the limits renew it): a parent gone by then is seen as gone.
    parent = os.getppid()
    workdir = Path(os.path.realpath(workdir))
    hide = [p for p in os.environ.pop(HIDE_ENV, "").split(os.pathsep) if p]
    done = Confinement()
    got = enter_namespaces()
    done.user_namespace = got.user
    if not got.mount:
        missing = "no namespaces (" + "; ".join(got.problems) + ")"
        if not allow_network:
            raise SandboxUnavailable(unavailable_reason(missing))
        done.notes.append(
            f"sandbox: NOT isolated ({missing}; {ALLOW_NETWORK_ENV}=1): the candidate can "
            "reach the network and read whatever the daemon's user can"
        )
        done.user = _unisolated(workdir, memory_kind, memory_mb, parent)
        return done
    done.network = got.network or network_isolated()
    if not done.network:
        if not allow_network:
            why = "; ".join(got.problems) or "refused"
            raise SandboxUnavailable(unavailable_reason(f"no network namespace ({why})"))
        done.notes.append(
            f"sandbox: the candidate can reach the network ({ALLOW_NETWORK_ENV}=1: no network "
            "namespace on this machine)"
        )
    try:
        done.view = build_view(workdir, hide)
        os.chdir(workdir)  # after the binds: the cwd must be the writable mount
        point_caches_at(workdir)
        done.user = become_nobody(workdir)
        _check_runtime_readable()
    except OSError as exc:
        raise SandboxUnavailable(f"the sandbox could not confine the candidate: {exc}") from exc
    if done.view.proc != "own":
        done.notes.append(
            "sandbox: no PID namespace of its own for the candidate: its /proc "
            + (
                "shows the processes of user nobody"
                if done.view.proc == "hidepid"
                else "shows only its own entry"
            )
        )
    _limit_processes()
    apply_limits(memory_kind, memory_mb, parent)
    return done


def _unisolated(workdir: Path, memory_kind: str, memory_mb: int, parent: int | None = None) -> str:
    """Without namespaces (the operator opted in): the work dir as cwd and cache home,
    ``nobody`` where the interpreter is readable to it, else no capabilities; the limits."""
    os.chdir(workdir)
    point_caches_at(workdir)
    user = "nobody" if drop_privileges(workdir) else f"uid {os.geteuid()}"
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            drop_capabilities()
            user += " without capabilities"
    apply_limits(memory_kind, memory_mb, parent)
    return user


def _check_runtime_readable() -> None:
    """As ``nobody`` in the view, the interpreter must still load its own modules."""
    with open(os.__file__, "rb"):
        pass
    os.listdir(os.path.dirname(os.__file__))


def _limit_processes() -> None:
    """RLIMIT_NPROC against fork bombs, unless a pids cgroup already caps this sandbox: for
    the real ``nobody`` it counts every process of that user on the machine (the other
    sandboxes too); in a user namespace of its own, the namespace's."""
    try:
        in_pids_cgroup = "kf-sandbox-" in Path("/proc/self/cgroup").read_text()
    except OSError:
        in_pids_cgroup = False
    if not in_pids_cgroup:
        resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))


def confine(
    workdir: Path, *, fs_isolation: bool = False, memory_kind: str = "as", memory_mb: int = 0
) -> list[str]:
    """Confine this process to ``workdir`` before any untrusted code runs: with
    ``fs_isolation`` (the probe found mount namespaces work here), all of
    :func:`confine_candidate` (the operator's opt-in read from ``KF_SANDBOX_ALLOW_NETWORK``
    in the environment); without, the work dir as cwd and cache home, ``nobody`` or no
    capabilities, the limits. Returns the notes for the report."""
    if fs_isolation:
        # Fails closed: the probe said it works here, so a failure now is an error.
        return confine_candidate(
            workdir,
            memory_kind=memory_kind,
            memory_mb=memory_mb,
            allow_network=network_opted_in(),
        )
    os.environ.pop(HIDE_ENV, None)
    _unisolated(workdir, memory_kind, memory_mb)
    return ["sandbox: no file-system isolation (no mount namespace)"]


def confine_judge(workdir: Path, *, fs_isolation: bool, memory_kind: str, memory_mb: int) -> None:
    """Confine the process that judges a candidate (it runs the task's reference): with
    ``fs_isolation``, new mount, IPC and network namespaces and the candidate's view of the
    file system around ``workdir``; its work dir as cwd; no capability; the limits. Unlike
    the candidate it keeps its user (root without capabilities, or the daemon's): the
    candidate, ``nobody``, then cannot signal or trace it even where the machine gives it
    no PID namespace of its own."""
    hide = [p for p in os.environ.pop(HIDE_ENV, "").split(os.pathsep) if p]
    if fs_isolation:
        if not enter_namespaces().mount:
            raise SandboxUnavailable("the judge's mount namespace was refused")
        build_view(Path(os.path.realpath(workdir)), hide)
    os.chdir(workdir)
    point_caches_at(workdir)
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            drop_capabilities()
    apply_limits(memory_kind, memory_mb, file_size=JUDGE_FILE_SIZE_LIMIT)


def probe_isolation(check: Callable[[], int]) -> int:
    """Whether :func:`confine_candidate` works here: in a forked child (PID 1 of a new PID
    namespace where possible), confine a fresh temp work dir (removed afterwards; the
    network opt-in assumed, so that what is missing is reported rather than refused), make
    sure a write outside it fails, one inside works and the secrets are hidden, print a
    ``filesystem: ...`` line and ``isolation: KEY=VALUE`` lines (``network``, ``user``,
    ``proc``), then run ``check`` (what must still work in there) and exit with its
    status. Where it cannot confine, prints ``isolation: unavailable: REASON``."""
    workdir = Path(tempfile.mkdtemp(prefix=PROBE_PREFIX)).resolve()
    lock = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    sys.stdout.flush()
    pid_namespace = unshare_pid_namespace()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _probe_child(workdir, check, pid_namespace)
        except SandboxUnavailable as exc:
            print(f"isolation: unavailable: {exc.reason}", flush=True)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    shutil.rmtree(workdir, ignore_errors=True)
    os.close(lock)
    return os.waitstatus_to_exitcode(status)


def _probe_child(workdir: Path, check: Callable[[], int], pid_namespace: bool) -> int:
    done = _confine(workdir, "none", 0, allow_network=True)
    assert done.view is not None  # with namespaces, or _confine raised
    outside = workdir.parent / f"kf-probe-escape-{os.getpid()}"
    try:
        outside.write_text("x")
    except OSError:
        pass
    else:
        outside.unlink()
        raise RuntimeError(f"{outside} was writable: no isolation")
    (workdir / "inside").write_text("x")  # must work
    for secret in ("/etc/shadow", "/etc/gshadow"):
        with contextlib.suppress(OSError), open(secret, "rb") as fh:
            if fh.read(1):
                raise RuntimeError(f"{secret} is readable in the sandbox")
    proc = done.view.proc + ("" if pid_namespace else " (no PID namespace)")
    print(f"filesystem: {done.view.describe()}", flush=True)
    print(f"isolation: network={'isolated' if done.network else 'reachable'}", flush=True)
    print(f"isolation: user={done.user}", flush=True)
    print(f"isolation: proc={proc}", flush=True)
    return check()
