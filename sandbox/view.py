"""What a sandbox sees of the file system: nothing to read but what its runtime needs.

On top of the read-only mount namespace of :mod:`.filesystem`, every top-level directory
but the system's own (``/usr``, ``/etc``, ``/dev``, ...) is covered by an empty read-only
tmpfs: home directories, ``/root``, ``/tmp``, ``/var``, ``/srv``, ``/run``, ``/mnt``, ``/opt``,
checkouts... So are the secret files and directories of ``/etc`` (``shadow``, ``gshadow``,
ssh host keys, kernelflow's own ``/etc/kernelflow`` with its API keys: empty files and
directories in their place), the daemon's home, data dir and config (named by the parent
in ``KF_SANDBOX_HIDE``), the temp dir and the work dir's parent (other sandboxes' dirs,
other daemons' stores). Then only what the Python runtime needs is bound back, read-only:
the interpreter's prefixes, the venv, ``sys.path`` and the kernelflow packages, the CUDA
paths the environment names, the GPU toolchains of ``/opt`` and the library dirs of
``/etc/ld.so.conf``; and the work dir, writable. ``/proc`` is a fresh one, showing only the
sandbox's own PID namespace (where it is PID 1 of one), and ``/dev/shm`` a private tmpfs.

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kernelflow.sandbox.filesystem import (
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    SHM_OPTIONS,
    make_read_only,
    mount,
)

__all__ = [
    "HIDE_ENV",
    "Op",
    "View",
    "build_view",
    "hidden_paths",
    "mount_proc",
    "plan_view",
    "runtime_paths",
]

# Set by the parent (``sandbox_env``): more paths to hide, os.pathsep-separated.
HIDE_ENV = "KF_SANDBOX_HIDE"
# Top-level directories a sandbox keeps seeing (read-only): the system's programs,
# libraries and configuration, devices and kernel file systems. Everything else at ``/`` is
# hidden.
SYSTEM_DIRS = frozenset(
    {"bin", "sbin", "lib", "lib32", "lib64", "libx32", "usr", "etc", "dev", "proc", "sys"}
    | {"nix", "gnu"}  # NixOS's and Guix's stores: their programs and libraries
)
# GPU toolchains that live in /opt (hidden otherwise): kept where they exist.
TOOLCHAINS = ("/opt/rocm", "/opt/nvidia", "/opt/cuda", "/opt/intel")
LD_SO_CONF = "/etc/ld.so.conf"
# What the fallback /proc shows besides the process itself: the machine's, no process's.
FALLBACK_PROC = ("cpuinfo", "meminfo", "stat", "loadavg", "uptime", "version", "sys", "driver")
STAGING = "/dev/shm"  # where the fallback /proc is put together (a private tmpfs by then)
MS_MOVE = 0x2000
SECRET_FILES = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/sudoers",
    *(f"/etc/ssh/ssh_host_{kind}_key" for kind in ("rsa", "dsa", "ecdsa", "ed25519")),
)
SECRET_DIRS = ("/etc/kernelflow", "/etc/ssl/private", "/etc/sudoers.d")
# Paths of toolchains a sandbox may need, from its (minimal) environment.
RUNTIME_ENV = ("CUDA_HOME", "CUDA_PATH", "TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH")
RUNTIME_ENV_LISTS = ("LD_LIBRARY_PATH",)
MASK_OPTIONS = "size=1m,mode=755"
# The layers of kernelflow: each may be a directory of its own (an editable install).
LAYERS = (
    "kernelflow",
    "kernelflow.events",
    "kernelflow.actors",
    "kernelflow.projections",
    "kernelflow.workflows",
)


@dataclass(frozen=True)
class Op:
    """One step of a view: ``mask`` a directory (an empty tmpfs) or a file (an empty
    file), ``keep`` a path hidden by a mask (bound back read-only), ``work`` the work dir
    (bound back writable), ``shm`` a private writable tmpfs, ``link`` a symlink recreated
    inside a mask (to ``target``)."""

    path: str
    kind: str
    target: str = ""


@dataclass
class View:
    """What :func:`build_view` did: the paths it hid, those it bound back, how ``/proc``
    is (``own``: only the sandbox's PID namespace; ``hidepid``: only the processes of its
    user; ``self``: only its own entry), and the mounts it could not make read-only."""

    hidden: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    proc: str = ""
    left_writable: list[str] = field(default_factory=list)

    def describe(self) -> str:
        shown = ", ".join(sorted(self.hidden)[:8]) + (" ..." if len(self.hidden) > 8 else "")
        left = f"; left writable: {', '.join(self.left_writable)}" if self.left_writable else ""
        return (
            f"read-only outside the work dir; {len(self.hidden)} paths hidden ({shown}); "
            f"/proc: {self.proc}{left}"
        )


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if p and os.path.isabs(p) and os.path.lexists(p)]


def runtime_paths() -> list[str]:
    """What this process's Python runtime needs to see (absolute, existing; unresolved):
    its prefixes, its interpreter, ``sys.path`` (a checkout's root only through its
    kernelflow packages), the kernelflow packages, the toolchain paths of the environment."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths.append(os.path.realpath(sys.executable))
    ours = set()
    # The layers' packages (not sys.modules: walking it in a forked worker would touch, and
    # copy, the page of every module imported).
    for name in LAYERS:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.submodule_search_locations:
                ours.update(spec.submodule_search_locations)
    paths += sorted(ours)
    package = {os.path.realpath(p) for p in ours}
    for entry in sys.path:
        if not entry or os.path.realpath(os.path.join(entry, "kernelflow")) in package:
            continue  # the root of a checkout: only its packages are needed
        paths.append(entry)
    for name in RUNTIME_ENV:
        paths.append(os.environ.get(name, ""))
    for name in RUNTIME_ENV_LISTS:
        paths += os.environ.get(name, "").split(os.pathsep)
    paths += TOOLCHAINS
    paths += _library_dirs(LD_SO_CONF)
    return _existing([os.path.abspath(p) for p in paths if p])


def _library_dirs(conf: str, depth: int = 0) -> list[str]:
    """The directories the dynamic linker searches (``/etc/ld.so.conf`` and its includes):
    the libraries of ``ld.so.cache`` must stay loadable (a driver's under /opt...)."""
    dirs: list[str] = []
    try:
        lines = Path(conf).read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include") and depth < 3:
            pattern = line.split(None, 1)[1] if " " in line else ""
            base = (
                pattern if os.path.isabs(pattern) else os.path.join(os.path.dirname(conf), pattern)
            )
            for name in sorted(glob.glob(base)):
                dirs += _library_dirs(name, depth + 1)
        elif line.startswith("/"):
            dirs.append(line)
    return dirs


def hidden_paths(workdir: Path) -> list[str]:
    """What a sandbox in ``workdir`` must not see (absolute, existing): every top-level
    entry but :data:`SYSTEM_DIRS`, the secrets of ``/etc``, the paths the parent named in
    :data:`HIDE_ENV`, the temp dirs and the work dir's parent."""
    paths = []
    with contextlib.suppress(OSError), os.scandir("/") as entries:
        for entry in entries:
            if entry.name not in SYSTEM_DIRS and not entry.is_symlink():
                paths.append(entry.path)
    paths += SECRET_FILES
    paths += SECRET_DIRS
    paths += os.environ.get(HIDE_ENV, "").split(os.pathsep)
    # (Not tempfile.gettempdir(): with everything read-only it would search for a temp dir.)
    paths += ["/tmp", "/var/tmp", tempfile.tempdir or "", os.environ.get("TMPDIR", "")]
    paths.append(os.path.dirname(os.path.abspath(workdir)))
    return _existing([os.path.abspath(p) for p in paths if p and os.path.abspath(p) != "/"])


def _parts(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.split("/") if part)


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def plan_view(workdir: str, keep: list[str], hide: list[str]) -> list[Op]:
    """The steps that hide ``hide`` from a sandbox in ``workdir`` but for ``keep`` (all
    absolute), parents first; steps that would change nothing are left out (a mask inside
    a mask, a path kept that nothing hides). ``keep`` wins where a path is in both."""
    wd = os.path.realpath(workdir)
    wanted: dict[str, Op] = {}
    for path in hide:
        real = os.path.realpath(path)
        if real != "/":
            wanted[real] = Op(real, "mask")
    wanted["/dev/shm"] = Op("/dev/shm", "shm")
    for path in keep:
        real = os.path.realpath(path)
        wanted[real] = Op(real, "keep")
        if real != path and path not in wanted:
            wanted[path] = Op(path, "link", real)  # the path as the runtime spells it
    wanted[wd] = Op(wd, "work")
    plan: list[Op] = []
    for path in sorted(wanted, key=_parts):
        op = wanted[path]
        around = [p for p in plan if p.kind != "link" and _within(path, p.path) and p.path != path]
        enclosing = max(around, key=lambda p: len(p.path), default=None)
        hidden = enclosing is not None and enclosing.kind in ("mask", "shm")
        if op.kind == "mask" and hidden:
            continue  # hidden already
        if op.kind in ("keep", "work", "link") and not hidden:
            continue  # visible already (the work dir has its own writable mount)
        plan.append(op)
    return plan


def _make_mount_point(path: str, directory: bool) -> None:
    if directory:
        os.makedirs(path, mode=0o755, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if not os.path.lexists(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o444))


def build_view(workdir: Path, hide: list[str] | None = None) -> View:
    """Build the sandbox's view (see the module docstring) in this process's fresh mount
    namespace, holding CAP_SYS_ADMIN over it; ``hide`` adds to :func:`hidden_paths`. Call
    before anything untrusted runs, then give up every privilege. Raises OSError if a step
    fails: a half-built view must not be used."""
    wd = os.path.realpath(workdir)
    view = View(left_writable=make_read_only(Path(wd)))
    hidden = hidden_paths(Path(wd)) + _existing(list(hide or []))
    plan = plan_view(wd, runtime_paths(), hidden)
    # Opened before the masks go up: a path kept is bound back from what the fd holds.
    sources = {op.path: os.open(op.path, os.O_PATH) for op in plan if op.kind in ("keep", "work")}
    masks: list[str] = []
    files: list[str] = []
    old_umask = os.umask(0o022)
    try:
        for op in plan:
            if op.kind == "mask" and not os.path.isdir(op.path):
                files.append(op.path)  # after the directories: an empty file of a mask's
            elif op.kind == "mask":
                mount("tmpfs", op.path, "tmpfs", MS_NOSUID | MS_NODEV, MASK_OPTIONS)
                masks.append(op.path)
            elif op.kind == "shm":
                _make_mount_point(op.path, True)
                mount("tmpfs", op.path, "tmpfs", MS_NOSUID | MS_NODEV, SHM_OPTIONS)
            elif op.kind == "link":
                _make_mount_point(os.path.dirname(op.path), True)
                if not os.path.lexists(op.path):
                    os.symlink(op.target, op.path)
            else:
                _make_mount_point(op.path, os.path.isdir(f"/proc/self/fd/{sources[op.path]}"))
                mount(f"/proc/self/fd/{sources[op.path]}", op.path, None, MS_BIND | MS_REC)
                if op.kind == "keep":
                    view.kept.append(op.path)
        _mask_files(files, masks)
        for point in masks:  # their mount points made: nothing may be added now
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    finally:
        os.umask(old_umask)
        for fd in sources.values():
            os.close(fd)
    view.hidden = sorted([*masks, *files])
    view.proc = mount_proc()
    return view


def _mask_files(files: list[str], masks: list[str]) -> None:
    """Bind an empty read-only file over each of ``files``. The empty file is made in the
    first mask's tmpfs and removed again: only the binds keep it."""
    if not files:
        return
    if masks:
        empty = os.path.join(masks[0], ".kf-empty")
        os.close(os.open(empty, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444))
    else:
        empty = "/dev/null"
    try:
        for path in files:
            mount(empty, path, None, MS_BIND)
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            mount(None, path, None, flags)
    finally:
        if masks:
            os.unlink(empty)


def mount_proc() -> str:
    """A fresh ``/proc``: as PID 1 of a PID namespace, one that shows only that namespace
    ("own"); else, where allowed (real root), one that shows a process only the processes
    of its own user once it has become ``nobody`` ("hidepid"); else ("self") an empty one
    but for ``/proc/self``, this process's own entry (the host's ``/proc`` would show every
    process's command line)."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if os.getpid() == 1:
        with contextlib.suppress(OSError):
            mount("proc", "/proc", "proc", flags)
            return "own"
    for option in ("hidepid=invisible", "hidepid=2"):
        with contextlib.suppress(OSError):
            mount("proc", "/proc", "proc", flags, option)
            return "hidepid"
    # Built on a staging tmpfs (stacked on the private /dev/shm for a moment) while the
    # host's /proc still names this process, then moved over /proc.
    me = os.path.join("/proc", os.readlink("/proc/self"))
    entries = {"self": me, **{name: f"/proc/{name}" for name in FALLBACK_PROC}}
    sources = {n: os.open(p, os.O_PATH) for n, p in entries.items() if os.path.exists(p)}
    try:
        mount("tmpfs", STAGING, "tmpfs", flags, MASK_OPTIONS)
        for name, fd in sources.items():
            point = os.path.join(STAGING, name)
            _make_mount_point(point, os.path.isdir(f"/proc/self/fd/{fd}"))
            mount(f"/proc/self/fd/{fd}", point, None, MS_BIND)
        # Its own entry writable again (the user namespace's id maps are written there).
        mount(None, os.path.join(STAGING, "self"), None, MS_REMOUNT | MS_BIND | flags)
    finally:
        for fd in sources.values():
            os.close(fd)
    mount(STAGING, "/proc", None, MS_MOVE)
    mount(None, "/proc", None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    return "self"
