"""The sandbox's file system, first layer: a private mount namespace in which everything is
read-only but the sandbox's work dir and a private ``/dev/shm``, and caches pointed into the
work dir. (:mod:`.view` hides what a sandbox must not read on top of it.)

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import tempfile
from pathlib import Path

from kernelflow.sandbox.limits import libc

__all__ = [
    "PROBE_PREFIX",
    "make_read_only",
    "mount",
    "point_caches_at",
    "private_shm",
    "remount_read_only",
]

# Temp dirs of the file-system probe; locked while in use like every sandbox work dir
# (``kernelflow.sandbox.workdirs`` removes those a killed daemon left behind).
PROBE_PREFIX = "kf-probe-"
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


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
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


def make_read_only(workdir: Path) -> list[str]:
    """In this process's (already private) mount namespace: make ``/`` rprivate, give
    ``workdir`` a mount of its own that stays writable, and remount every other mount
    read-only, keeping the flags a user namespace locks. Returns the mount points under
    /proc or /sys it had to leave writable; raises OSError for any other."""
    wd = os.path.realpath(workdir)  # as /proc/self/mountinfo spells it
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount(wd, wd, None, MS_BIND | MS_REC)  # its own mount: stays writable below
    left: list[str] = []
    done: set[str] = set()
    for point, options in _mount_table():
        if point == wd or point.startswith(wd.rstrip("/") + "/") or point in done:
            continue
        done.add(point)  # stacked mounts: only the top one is reachable by path
        if "ro" in options:
            continue
        try:
            remount_read_only(point, options)
        except OSError as exc:
            if exc.errno == errno.ENOENT or point.startswith(TOLERATED_MOUNTS):
                left.append(point)
                continue
            raise
    return left


def remount_read_only(point: str, options: set[str]) -> None:
    """Remount the mount at ``point`` read-only, keeping its per-mount ``options`` a user
    namespace may have locked."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for name, flag in KEPT_MOUNT_FLAGS.items():
        if name in options:
            flags |= flag
    mount(None, point, None, flags)


def private_shm() -> None:
    """A fresh, private tmpfs on ``/dev/shm`` (it stays read-only if that fails)."""
    if os.path.isdir("/dev/shm"):
        with contextlib.suppress(OSError):
            mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, SHM_OPTIONS)


def point_caches_at(workdir: Path) -> None:
    """Every tool cache and temp dir inside the (only writable) work dir."""
    os.environ["HOME"] = os.environ["TMPDIR"] = str(workdir)
    os.environ["TRITON_HOME"] = str(workdir)
    os.environ["TRITON_CACHE_DIR"] = str(workdir / ".triton" / "cache")
    os.environ["CUPY_CACHE_DIR"] = str(workdir / ".cupy" / "kernel_cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / ".inductor")
    tempfile.tempdir = None  # the warm process cached the daemon's temp dir on import
