"""The sandbox's file system: a private mount namespace in which everything is read-only
but the sandbox's work dir and a private ``/dev/shm``; caches pointed into the work dir;
and the child side of the probe that tells whether that isolation works on this machine.

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from kernelflow.actors.sandbox.limits import libc

__all__ = ["PROBE_PREFIX", "isolate_filesystem", "point_caches_at", "probe_isolation"]

# Temp dirs of the file-system probe; locked while in use like every sandbox work dir
# (``kernelflow.actors.workdirs`` removes those a killed daemon left behind).
PROBE_PREFIX = "kf-probe-"
CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
# Per-mount flags a read-only remount must keep: in a user namespace they are locked, and
# dropping one is refused (EPERM). Atime flags are kept by the kernel when none is given.
KEPT_MOUNT_FLAGS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}
# Kernel pseudo file systems: a mount there that cannot be made read-only is tolerated
# (reported), anything else makes the isolation fail.
TOLERATED_MOUNTS = ("/proc", "/sys")
SHM_OPTIONS = "size=64m,mode=1777"


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    import ctypes

    rc = libc().mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount({target!r}): {os.strerror(err)}")


def _mount_table() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) of every mount this process sees, parents first."""
    table = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        table.append((point, set(fields[5].split(","))))
    return table


def isolate_filesystem(workdir: Path) -> list[str]:
    """Give this process a private mount namespace in which every mount is read-only but
    ``workdir`` (bind-mounted onto itself, still writable) and a fresh, private tmpfs on
    ``/dev/shm``. Nothing propagates back to the host (``/`` is made rprivate first), and
    the namespace, its tmpfs included, vanishes with the sandbox.

    Needs CAP_SYS_ADMIN in the current user namespace (real root, or root of the
    ``unshare --map-root-user`` namespace) and a single-threaded process: call it before
    anything untrusted runs, then drop privileges or capabilities
    (:mod:`kernelflow.actors.sandbox.limits`) so the candidate cannot remount. Raises
    OSError if it cannot isolate; returns the mount points under /proc or /sys it had to
    leave writable.
    """
    import ctypes

    wd = os.path.realpath(workdir)  # as /proc/self/mountinfo spells it
    if libc().unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount(wd, wd, None, MS_BIND | MS_REC)  # its own mount: stays writable below
    left: list[str] = []
    done: set[str] = set()
    for point, options in _mount_table():
        if point == wd or point.startswith(wd.rstrip("/") + "/") or point in done:
            continue
        done.add(point)  # stacked mounts: only the top one is reachable by path
        if "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for name, flag in KEPT_MOUNT_FLAGS.items():
            if name in options:
                flags |= flag
        try:
            _mount(None, point, None, flags)
        except OSError as exc:
            if exc.errno == errno.ENOENT or point.startswith(TOLERATED_MOUNTS):
                left.append(point)
                continue
            raise
    if os.path.isdir("/dev/shm"):
        with contextlib.suppress(OSError):  # stays read-only then
            _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, SHM_OPTIONS)
    return left


def point_caches_at(workdir: Path) -> None:
    """Every tool cache and temp dir inside the (only writable) work dir."""
    os.environ["HOME"] = os.environ["TMPDIR"] = str(workdir)
    os.environ["TRITON_HOME"] = str(workdir)
    os.environ["TRITON_CACHE_DIR"] = str(workdir / ".triton" / "cache")
    os.environ["CUPY_CACHE_DIR"] = str(workdir / ".cupy" / "kernel_cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / ".inductor")
    tempfile.tempdir = None  # the warm worker cached the daemon's temp dir on import


def probe_isolation(check: Callable[[], int]) -> int:
    """Whether :func:`isolate_filesystem` works here: in a forked child, isolate a fresh
    temp work dir (removed afterwards), make sure a write outside it fails and one inside
    works, print a ``filesystem: ...`` line, then run ``check`` (what must still work in
    there) and exit with its status."""
    workdir = Path(tempfile.mkdtemp(prefix=PROBE_PREFIX)).resolve()
    lock = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(lock, fcntl.LOCK_EX)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            left = isolate_filesystem(workdir)
            os.chdir(workdir)
            point_caches_at(workdir)
            outside = workdir.parent / f"kf-probe-escape-{os.getpid()}"
            try:
                outside.write_text("x")
            except OSError:
                pass
            else:
                outside.unlink()
                raise RuntimeError(f"{outside} was writable: no isolation")
            (workdir / "inside").write_text("x")  # must work
            print(
                "filesystem: read-only outside the work dir"
                + (f" (left writable: {', '.join(left)})" if left else ""),
                flush=True,
            )
            code = check()
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
