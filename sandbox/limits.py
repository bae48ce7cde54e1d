"""Limits a sandboxed process puts on itself before untrusted code runs: death with its
parent, resource limits, the unprivileged ``nobody`` user or an empty capability set, and
a pids cgroup against fork bombs.

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import signal
import stat
import sys
import time
from pathlib import Path
from typing import Any

__all__ = [
    "FILE_SIZE_LIMIT",
    "JUDGE_FILE_SIZE_LIMIT",
    "NOBODY",
    "NPROC_LIMIT",
    "apply_limits",
    "die_with_parent",
    "drop_bounding_set",
    "drop_capabilities",
    "drop_privileges",
    "enter_pids_cgroup",
    "give_to_nobody",
    "libc",
    "remove_pids_cgroup",
    "sweep_pids_cgroups",
]

FILE_SIZE_LIMIT = 64 * 1024 * 1024
# The judge's: torch.compile of the reference (the second baseline) builds a precompiled
# header of torch's on the CPU, well over the candidate's limit.
JUDGE_FILE_SIZE_LIMIT = 1024 * 1024 * 1024
NOBODY = 65534
# Threads count too, and for the real ``nobody`` every sandbox's on the machine together: a
# torch process holds a thread per core, so a pool of sandboxes on a many-core node needs
# thousands (256 failed a sandbox's own `fork` while a few others ran). Still a wall for a
# fork bomb, which the timeout then ends.
NPROC_LIMIT = 4096
PR_SET_PDEATHSIG = 1
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
CAP_VERSION_3 = 0x20080522
PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


@functools.cache
def libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies: the parent's timeout is
    what bounds a candidate, so an orphan must not outlive it. ``parent``: the pid this
    process's parent is known to have (taken before the fork, or named by the spawner);
    without it, the parent at the call, which is init already if the parent died just
    before: the orphan would then run on for good."""
    expected = os.getppid() if parent is None else parent
    try:
        libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the process-group kill is the only guard
    if os.getppid() != expected:  # the parent died before the request took effect
        os._exit(1)


def apply_limits(
    memory_kind: str, memory_mb: int, parent: int | None = None, file_size: int = FILE_SIZE_LIMIT
) -> None:
    """Limit this process before any untrusted code runs.

    Soft and hard limits are both lowered so the candidate cannot raise them again.
    ``memory_kind`` is "as" (address space: exact, fine for CPU torch and the Triton
    interpreter), "data" (RLIMIT_DATA: CUDA reserves terabytes of virtual address space,
    which RLIMIT_AS would refuse) or "none". ``parent``: as for :func:`die_with_parent`
    (a change of user since the last request cleared it); ``file_size``: the largest file
    it may write.
    """
    die_with_parent(parent)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
    if memory_kind != "none" and memory_mb > 0:
        which = resource.RLIMIT_AS if memory_kind == "as" else resource.RLIMIT_DATA
        limit = memory_mb * 1024 * 1024
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        resource.setrlimit(which, (limit, limit))


def drop_privileges(workdir: Path) -> bool:
    """As real root (not in a user namespace that maps only root), become ``nobody``: the
    candidate then cannot signal the daemon or the worker, cannot write anywhere but its
    work dir (and world-writable dirs), and RLIMIT_NPROC stops fork bombs. Returns whether
    the drop happened; elsewhere the PID namespace and the timeout contain a candidate."""
    if os.geteuid() != 0 or not all(
        _open_to_others(Path(p)) for p in {sys.base_prefix, sys.prefix, *sys.path} if p
    ):
        # As nobody the interpreter could not load its own (lazily imported) modules.
        return False
    try:
        give_to_nobody(workdir)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except OSError:
        return False
    resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
    return True


def give_to_nobody(workdir: Path) -> None:
    """Make ``workdir`` the user ``nobody``'s to work in: what it holds becomes nobody's,
    the directory itself stays its owner's (so that a daemon still finds it its own to
    clean up after a crash) but writable to group ``nogroup`` only (65534: no one else's
    group)."""
    for root, dirs, files in os.walk(workdir):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), NOBODY, NOBODY, follow_symlinks=False)
    os.chown(workdir, -1, NOBODY)
    os.chmod(workdir, 0o770)


def _open_to_others(path: Path) -> bool:
    """Whether a user other than the owner can reach and read ``path``."""
    try:
        path = path.resolve()
        if not path.exists():
            return True
        for part in [path, *path.parents]:
            mode = part.stat().st_mode
            if not mode & stat.S_IXOTH or (part == path and not mode & stat.S_IROTH):
                return False
    except OSError:
        return False
    return True


def drop_bounding_set() -> None:
    """Empty the capability bounding set, so that no exec can bring a capability back
    (needs CAP_SETPCAP; without it this changes nothing)."""
    c = libc()
    last = _read(Path("/proc/sys/kernel/cap_last_cap")).strip()
    for cap in range(int(last) + 1 if last.isdigit() else 64):
        c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: harmless


def drop_capabilities() -> None:
    """Empty this process's capability sets (bounding and ambient included) and forbid new
    privileges through exec (setuid binaries, file capabilities), so that it can neither
    undo its mounts nor regain a privilege; for a sandbox still running as uid 0 (real root
    that could not become ``nobody``, or root of a user namespace), and after any switch
    to ``nobody``."""
    import ctypes

    c = libc()
    drop_bounding_set()
    c.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    if c.capset(header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def enter_pids_cgroup(limit: int) -> Path | None:
    """Move this process into a fresh pids cgroup capped at ``limit`` tasks (threads
    included), so a fork bomb hits a wall even where RLIMIT_NPROC cannot apply (root).
    Returns the cgroup dir (removed by the worker afterwards), or None if not allowed."""
    for root in PIDS_CGROUPS:
        if not (root / "cgroup.procs").exists():
            continue
        if root.name != "pids" and "pids" not in _read(root / "cgroup.subtree_control"):
            continue
        group = root / f"kf-sandbox-{os.getpid()}"
        try:
            group.mkdir(exist_ok=True)
            (group / "pids.max").write_text(str(limit))
            (group / "cgroup.procs").write_text(str(os.getpid()))
            return group
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
    return None


def remove_pids_cgroup(pid: int) -> None:
    for root in PIDS_CGROUPS:
        group = root / f"kf-sandbox-{pid}"
        if group.exists():
            for _ in range(50):  # the last tasks may take a moment to leave
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)


def sweep_pids_cgroups() -> None:
    """Remove leftover sandbox cgroups whose intermediate process is gone (a cgroup can
    stay busy for a moment after its last task was reaped)."""
    for root in PIDS_CGROUPS:
        for group in root.glob("kf-sandbox-*"):
            try:
                os.kill(int(group.name.rsplit("-", 1)[1]), 0)
                continue  # still running (ours or another worker's)
            except (ValueError, ProcessLookupError):
                pass
            except PermissionError:
                continue
            with contextlib.suppress(OSError):
                group.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
