"""Sandboxed verification of one candidate kernel against a KernelBench reference.

Never imported by the daemon. Standalone on purpose (stdlib + torch/triton/numpy only):
run with ``python -I``, nothing from the kernelflow checkout is importable, and candidate
code never shares a process with the daemon. Three modes:

``sandbox_child.py --serve DEVICE``
    The warm worker: imports torch and triton once (never initialising CUDA), prints a
    ``{"ready": ...}`` line, then for every job line on stdin
    (``{"workdir", "nonce", "timeout_s"}``) forks a fresh sandbox, waits for it with the
    timeout, kills its whole process group, and answers one status line on stdout. The
    fork goes through an intermediate process that moves the sandbox into a new PID
    namespace when the machine allows it: the sandbox is PID 1 there, sees no process
    outside it, and everything it starts dies with it.
``sandbox_child.py WORKDIR``
    One fresh process for one job (the nonce comes on stdin): the naive, slower path.
``sandbox_child.py --probe DEVICE MEMORY_KIND MEMORY_MB [fs]``
    Applies the limits, imports torch and triton, prints ``ok``; with ``fs``, first makes
    the file system read-only but for a temp work dir, as a sandbox would (and prints a
    ``filesystem: ...`` line), so the parent learns whether that isolation works here.

Each sandbox, before any candidate code runs, gets (where the machine allows) its own
mount namespace in which everything but its work dir and a private ``/dev/shm`` is
read-only, then drops to ``nobody`` or, still uid 0, loses every capability: a write
outside the work dir fails with EROFS whatever path the candidate builds at runtime.

A job reads ``WORKDIR/job.json`` and writes ``WORKDIR/result.json``: the fields of
``VerificationReport`` plus the nonce, so a candidate cannot forge a verdict by writing the
file. Anything else (a crash, a timeout, no result) is turned into a verdict by the parent.
"""

from __future__ import annotations

import contextlib
import faulthandler
import fcntl
import importlib.util
import json
import math
import os
import random
import resource
import select
import signal
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

MAX_TRACEBACK_LINES = 30
MAX_LINE_CHARS = 400
MAX_MISMATCHES = 5
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    # (atol, rtol), as in KernelBench.
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
TIMING_WARMUP = 5
TIMING_REPS = 50
FILE_SIZE_LIMIT = 64 * 1024 * 1024
NOBODY = 65534
NPROC_LIMIT = 256  # threads count too; generous for torch, fatal for a fork bomb
CLONE_NEWPID = 0x20000000
PLAUSIBLE_SPEEDUP = 10.0

# ATen ops a candidate's forward may run outside its kernels: allocation, views, copies,
# dtype/device moves. Anything else is PyTorch computing in the kernel's place.
GLUE_OPS = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "zeros",
    "zeros_like",
    "new_zeros",
    "ones",
    "ones_like",
    "new_ones",
    "full",
    "full_like",
    "new_full",
    "fill_",
    "zero_",
    "arange",
    "scalar_tensor",
    "lift_fresh",
    "lift_fresh_copy",
    "view",
    "_unsafe_view",
    "reshape",
    "as_strided",
    "expand",
    "permute",
    "transpose",
    "t",
    "unsqueeze",
    "squeeze",
    "slice",
    "select",
    "narrow",
    "split",
    "split_with_sizes",
    "unbind",
    "chunk",
    "flatten",
    "unflatten",
    "alias",
    "detach",
    "clone",
    "contiguous",
    "copy_",
    "_to_copy",
    "to",
    "cat",
    "stack",
    "constant_pad_nd",
    "_local_scalar_dense",
    "is_same_size",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_contiguous",
    "resize_",
    "set_",
    "view_as",
    "expand_as",
    "movedim",
    "_reshape_alias",
}


# --------------------------------------------------------------------------- limits


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies: the parent's timeout is
    what bounds a candidate, so an orphan must not outlive it."""
    parent = os.getppid()
    try:
        _libc().prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # not Linux: the process-group kill is the only guard
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def apply_limits(memory_kind: str, memory_mb: int) -> None:
    """Limit this process before any untrusted code runs.

    Soft and hard limits are both lowered so the candidate cannot raise them again.
    ``memory_kind`` is "as" (address space: exact, fine for CPU torch and the Triton
    interpreter), "data" (RLIMIT_DATA: CUDA reserves terabytes of virtual address space,
    which RLIMIT_AS would refuse) or "none".
    """
    die_with_parent()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
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
        for root, dirs, files in os.walk(workdir):
            for name in [*dirs, *files]:
                os.chown(os.path.join(root, name), NOBODY, NOBODY)
        os.chown(workdir, NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    except OSError:
        return False
    resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
    return True


def _open_to_others(path: Path) -> bool:
    """Whether a user other than the owner can reach and read ``path``."""
    import stat

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


PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))


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


# --------------------------------------------------------------------------- file system

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
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_VERSION_3 = 0x20080522


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    import ctypes

    libc = _libc()
    rc = libc.mount(
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
    import re

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
    anything untrusted runs, then :func:`drop_privileges` / :func:`drop_capabilities` so
    the candidate cannot remount. Raises OSError if it cannot isolate; returns the mount
    points under /proc or /sys it had to leave writable.
    """
    import ctypes
    import errno

    wd = os.path.realpath(workdir)  # as /proc/self/mountinfo spells it
    if _libc().unshare(CLONE_NEWNS) != 0:
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


def drop_capabilities() -> None:
    """For a sandbox still running as uid 0 (real root that could not become ``nobody``,
    or root of a user namespace): empty its capability sets and bounding set, so it can
    neither undo the read-only mounts nor regain privileges through exec."""
    import ctypes

    libc = _libc()
    last = _read(Path("/proc/sys/kernel/cap_last_cap")).strip()
    for cap in range(int(last) + 1 if last.isdigit() else 64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last one: harmless
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: all empty
    if libc.capset(header, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def point_caches_at(workdir: Path) -> None:
    """Every tool cache and temp dir inside the (only writable) work dir."""
    import tempfile

    os.environ["HOME"] = os.environ["TMPDIR"] = str(workdir)
    os.environ["TRITON_HOME"] = str(workdir)
    os.environ["TRITON_CACHE_DIR"] = str(workdir / ".triton" / "cache")
    os.environ["CUPY_CACHE_DIR"] = str(workdir / ".cupy" / "kernel_cache")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / ".inductor")
    tempfile.tempdir = None  # the warm worker cached the daemon's temp dir on import


def confine(workdir: Path, job: dict[str, Any]) -> None:
    isolated = bool(job.get("fs_isolation"))
    if isolated:
        # Fails closed: the probe said it works here, so a failure now is an error.
        isolate_filesystem(workdir)
    os.chdir(workdir)  # after the bind mount: the cwd must be the writable mount
    point_caches_at(workdir)
    if not drop_privileges(workdir) and os.geteuid() == 0:
        try:
            drop_capabilities()
        except OSError:
            if isolated:
                raise  # root with CAP_SYS_ADMIN could remount everything writable
    apply_limits(job.get("memory_kind", "as"), int(job.get("memory_mb", 0)))


def probe(device: str, memory_kind: str, memory_mb: int, fs: bool = False) -> int:
    """Check that torch and triton work under the limits (and, with ``fs``, inside the
    read-only file system of :func:`isolate_filesystem`, in a forked child whose temp work
    dir this process removes afterwards). Prints ``ok`` last on success."""
    if not fs:
        return _probe_imports(device, memory_kind, memory_mb, fs=False)
    import shutil
    import tempfile

    workdir = Path(tempfile.mkdtemp(prefix="kf-probe-")).resolve()
    # Locked while in use, as ``kernelflow.actors.workdirs`` locks the verifications' work dirs: a
    # daemon killed during its warm-up leaves this one behind; the next daemon removes it.
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
            code = _probe_imports(device, memory_kind, memory_mb, fs=True)
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


PROBE_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)
"""


def _probe_imports(device: str, memory_kind: str, memory_mb: int, fs: bool) -> int:
    apply_limits(memory_kind, memory_mb)
    import torch
    import triton  # noqa: F401  (importing is the check)

    if device == "cuda":
        x = torch.ones(1024, device="cuda")
        torch.cuda.synchronize()
        assert float(x.sum()) == 1024.0
        if fs:  # compiling a kernel writes Triton's cache and temp files: must still work
            # Loaded from a file like a candidate: compiled Triton resolves the kernel's
            # globals (tl) in its module, and needs its source.
            path = Path.cwd() / "probe_kernel.py"
            path.write_text(PROBE_KERNEL)
            kernel = load_module(path, "kf_probe_kernel").probe_kernel
            kernel[(1,)](x, x.numel(), BLOCK=1024)
            torch.cuda.synchronize()
            assert float(x.sum()) == 2048.0
    print("ok", flush=True)
    return 0


# --------------------------------------------------------------------------- helpers


class VerificationFailure(Exception):
    """The candidate ran but its results (or behaviour) are not acceptable."""

    def __init__(
        self,
        summary: str,
        errors: list[str],
        *,
        verdict: str = "mismatch",
        rule: str = "mismatch",
        **fields: Any,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.errors = errors
        self.verdict = verdict
        self.rule = rule
        self.fields = fields


def rejected(rule: str, message: str) -> VerificationFailure:
    return VerificationFailure(message, [message], verdict="rejected_runtime", rule=rule)


def _finite(x: float | None) -> float | None:
    # result.json must be strict JSON (msgspec rejects NaN/Infinity).
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def format_exception(exc: BaseException, workdir: str) -> list[str]:
    """A traceback an LLM coder can act on: its own frames, the raising frame, the error.

    Library frames (torch, triton internals) between them are elided; the exception chain
    is kept because Triton wraps the real error (e.g. an InterpreterError caused by a
    NameError inside the kernel). Paths are made relative to the work dir, so the coder
    reads ``candidate.py``.
    """
    chain: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    chain.reverse()

    prefix = workdir.rstrip("/") + "/"
    lines: list[str] = []
    for i, err in enumerate(chain):
        if i:
            direct = chain[i - 1] is err.__cause__
            lines.append(
                "The above exception was the direct cause of the following exception:"
                if direct
                else "During handling of the above exception, another exception occurred:"
            )
        frames = traceback.extract_tb(err.__traceback__)
        if frames:
            lines.append("Traceback (most recent call last):")
            skipped = 0
            for j, frame in enumerate(frames):
                if frame.filename.startswith(prefix) or j == len(frames) - 1:
                    if skipped:
                        lines.append(f"  ... {skipped} library frame(s) ...")
                        skipped = 0
                    lines.extend("".join(traceback.format_list([frame])).rstrip("\n").split("\n"))
                else:
                    skipped += 1
        lines.extend(
            "".join(traceback.format_exception_only(type(err), err)).rstrip("\n").split("\n")
        )
    cleaned = [(ln.replace(prefix, "")[:MAX_LINE_CHARS]) for ln in lines if ln.strip() != ""]
    if len(cleaned) > MAX_TRACEBACK_LINES:
        cleaned = ["... (earlier lines trimmed)", *cleaned[-MAX_TRACEBACK_LINES:]]
    return cleaned


def load_module(path: Path, name: str) -> Any:
    """Import a module from a file under a unique name.

    Registered in ``sys.modules`` before execution: dataclasses, pickling and Triton's
    source lookup (``inspect.getsource`` for ``@triton.jit``) expect a real module.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # numpy is optional for the check itself
        pass


def to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(clone(v) for v in value)
    return value


def flatten(value: Any, path: str) -> list[tuple[str, Any]]:
    """Leaves of an output: tensors, or tuples/lists of them (nested), with a path name."""
    if isinstance(value, list | tuple):
        out: list[tuple[str, Any]] = []
        for i, v in enumerate(value):
            out.extend(flatten(v, f"{path}[{i}]"))
        return out
    return [(path, value)]


def structure(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def same_values(a: Any, b: Any) -> bool:
    """Exact equality, NaN-aware (used for the input-mutation check)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
    return bool(torch.equal(a, b))


# --------------------------------------------------------------------------- comparison


def compare_tensor(
    name: str, expected: Any, got: Any, tolerances: dict[str, tuple[float, float]]
) -> tuple[float, float]:
    """Raise VerificationFailure if ``got`` differs from ``expected``; return (abs, rel) err."""
    import torch

    if type(got) is not torch.Tensor:
        # Tensor subclasses and lazy wrappers can fake comparisons; demand a plain tensor.
        raise rejected(
            "output_type",
            f"{name} must be a plain torch.Tensor, got {type(got).__module__}."
            f"{type(got).__qualname__}",
        )
    if got.shape != expected.shape:
        raise VerificationFailure(
            f"{name}: shape mismatch: expected {tuple(expected.shape)}, got {tuple(got.shape)}",
            [
                f"{name} has shape {tuple(got.shape)} but the reference returns shape "
                f"{tuple(expected.shape)}"
            ],
        )
    if got.dtype != expected.dtype:
        raise VerificationFailure(
            f"{name}: dtype mismatch: expected {expected.dtype}, got {got.dtype}",
            [f"{name} has dtype {got.dtype} but the reference returns {expected.dtype}"],
        )
    if got.device != expected.device:
        raise VerificationFailure(
            f"{name}: device mismatch: expected {expected.device}, got {got.device}",
            [f"{name} is on device {got.device} but the reference output is on {expected.device}"],
        )
    if got.numel() == 0:
        return 0.0, 0.0

    dtype_name = str(expected.dtype).removeprefix("torch.")
    exact = not (expected.is_floating_point() or expected.is_complex())
    atol, rtol = (0.0, 0.0) if exact else tolerances.get(dtype_name, tolerances["float32"])

    exp64 = expected.detach().to(torch.complex128 if expected.is_complex() else torch.float64)
    got64 = got.detach().to(exp64.dtype)
    # NaN and +/-Inf must appear at the same positions; elsewhere compare with tolerances.
    special_bad = (
        (torch.isnan(exp64) != torch.isnan(got64))
        | (torch.isinf(exp64) & (exp64 != got64))
        | (torch.isinf(got64) & (exp64 != got64))
    )
    finite = torch.isfinite(exp64) & torch.isfinite(got64)
    diff = torch.where(
        finite, (got64 - exp64).abs(), torch.zeros((), dtype=torch.float64, device=exp64.device)
    )
    rel = diff / exp64.abs().clamp_min(1e-6)
    bad = special_bad | (finite & (diff > atol + rtol * exp64.abs()))
    max_abs = float(diff.max())
    max_rel = float(torch.where(finite, rel, torch.zeros_like(rel)).max())

    n_bad = int(bad.sum())
    if n_bad:
        idx = torch.nonzero(bad)[:MAX_MISMATCHES].tolist()
        mismatches = []
        for pos in idx:
            key = tuple(pos)
            e, g = exp64[key].item(), got64[key].item()
            where = ", ".join(str(p) for p in pos)
            mismatches.append(
                f"{name}[{where}]: expected {_fmt(e) if not exact else e}, "
                f"got {_fmt(g) if not exact else g}"
            )
        total = got.numel()
        tol = "exact match" if exact else f"atol={atol:g}, rtol={rtol:g}"
        n_nan = int(special_bad.sum())
        detail = (
            f"{name}: {n_bad} of {total} elements ({100.0 * n_bad / total:.3g}%) differ from "
            f"the reference ({tol}); max abs err {_fmt(max_abs)}, max rel err {_fmt(max_rel)}"
        )
        if n_nan:
            detail += f"; {n_nan} element(s) have NaN/Inf where the reference does not (or "
            detail += "vice versa)"
        raise VerificationFailure(
            detail,
            [detail, "first mismatching positions: " + "; ".join(mismatches)],
            max_abs_err=max_abs,
            max_rel_err=max_rel,
            mismatches=mismatches,
        )
    return max_abs, max_rel


def compare_outputs(
    expected: Any, got: Any, tolerances: dict[str, tuple[float, float]]
) -> tuple[float, float]:
    import torch

    exp_leaves, got_leaves = flatten(expected, "output"), flatten(got, "output")
    if len(exp_leaves) != len(got_leaves) or (
        isinstance(expected, list | tuple) != isinstance(got, list | tuple)
    ):
        msg = (
            f"output structure mismatch: reference returns {structure(expected)}, "
            f"candidate returns {structure(got)}"
        )
        raise VerificationFailure(msg, [msg])
    max_abs = max_rel = 0.0
    for (name, exp), (_, out) in zip(exp_leaves, got_leaves, strict=True):
        if isinstance(exp, torch.Tensor):
            a, r = compare_tensor(name, exp, out, tolerances)
            max_abs, max_rel = max(max_abs, a), max(max_rel, r)
        elif exp != out:
            msg = f"{name}: expected {exp!r}, got {out!r}"
            raise VerificationFailure(msg, [msg])
    return max_abs, max_rel


# --------------------------------------------------------------------------- runtime guards


def os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def child_processes() -> list[int]:
    kids: list[int] = []
    try:
        for tid in os.listdir("/proc/self/task"):
            text = Path(f"/proc/self/task/{tid}/children").read_text().split()
            kids.extend(int(k) for k in text)
    except OSError:
        pass
    return kids


class Launches:
    """Counts kernel launches, Triton (compiled or interpreted) and CuPy raw kernels, and
    tells the op guard to look away while a launch runs (the interpreter copies tensors
    around)."""

    count = 0
    depth = 0

    @classmethod
    def launching(cls) -> contextlib.AbstractContextManager[None]:
        @contextlib.contextmanager
        def scope() -> Any:
            cls.count += 1
            cls.depth += 1
            try:
                yield
            finally:
                cls.depth -= 1

        return scope()

    @classmethod
    def install_cupy(cls, cupy: Any) -> None:
        """Make ``cupy.RawKernel`` / ``cupy.RawModule`` count their launches: both names are
        replaced by subclasses before the candidate is imported (``isinstance`` still
        holds); kernels from ``RawModule.get_function`` come back wrapped."""
        if getattr(cupy.RawKernel, "_kf_counted", False):
            return

        class CountedRawKernel(cupy.RawKernel):
            _kf_counted = True

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                with cls.launching():
                    return super().__call__(*args, **kwargs)

        class CountedFunction:
            """A kernel of a RawModule: launches are counted, the rest is the kernel's."""

            def __init__(self, kernel: Any) -> None:
                self._kf_kernel = kernel

            def __call__(self, *args: Any, **kwargs: Any) -> Any:
                with cls.launching():
                    return self._kf_kernel(*args, **kwargs)

            def __getattr__(self, name: str) -> Any:
                return getattr(self._kf_kernel, name)

        class CountedRawModule(cupy.RawModule):
            _kf_counted = True

            def get_function(self, name: str) -> Any:
                return CountedFunction(super().get_function(name))

        for klass, name in ((CountedRawKernel, "RawKernel"), (CountedRawModule, "RawModule")):
            klass.__name__ = klass.__qualname__ = name
            klass.__module__ = "cupy"
        cupy.RawKernel, cupy.RawModule = CountedRawKernel, CountedRawModule

    @classmethod
    def install(cls) -> None:
        classes: list[Any] = []
        try:
            from triton.runtime.jit import JITFunction

            classes.append(JITFunction)
        except ImportError:
            return
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for klass in classes:
            original = klass.run
            if getattr(original, "_kf_counted", False):
                continue

            def run(self: Any, *args: Any, _orig: Any = original, **kwargs: Any) -> Any:
                cls.count += 1
                cls.depth += 1
                try:
                    return _orig(self, *args, **kwargs)
                finally:
                    cls.depth -= 1

            run._kf_counted = True  # type: ignore[attr-defined]
            klass.run = run


def make_op_guard() -> Any:
    """A TorchDispatchMode that records every non-glue ATen op run outside a kernel launch:
    PyTorch computing in the kernel's place, whatever Python spelling reached it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpGuard(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bad: dict[str, int] = {}

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if Launches.depth == 0:
                name = func.overloadpacket.__name__
                if name not in GLUE_OPS and name.rstrip("_") not in GLUE_OPS:
                    self.bad[name] = self.bad.get(name, 0) + 1
            return func(*args, **(kwargs or {}))

    return OpGuard()


def storages(value: Any) -> list[tuple[int, int]]:
    """(start, end) byte ranges of the storages behind every tensor leaf of ``value``."""
    import torch

    spans = []
    for _, t in flatten(value, "x"):
        if isinstance(t, torch.Tensor) and t.device.type != "meta":
            st = t.untyped_storage()
            if st.nbytes():
                spans.append((st.data_ptr(), st.data_ptr() + st.nbytes()))
    return spans


def overlaps(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    return any(s1 < e2 and s2 < e1 for s1, e1 in a for s2, e2 in b)


def check_output_storage(got: Any, inputs: Any, model: Any) -> None:
    import torch

    for name, t in flatten(got, "output"):
        if not isinstance(t, torch.Tensor):
            continue
        if type(t) is not torch.Tensor:
            raise rejected(
                "output_type",
                f"{name} must be a plain torch.Tensor, got {type(t).__module__}."
                f"{type(t).__qualname__} (tensor subclasses and lazy tensors are not allowed)",
            )
        if t.is_meta or getattr(t, "_is_zerotensor", lambda: False)():
            raise rejected("output_type", f"{name} is a meta/zero tensor without data")
        mine = storages(t)
        if overlaps(mine, storages(inputs)):
            raise rejected(
                "output_aliasing",
                f"{name} shares memory with an input: outputs must have their own storage",
            )
        params = (
            [p for p in model.parameters()] + [b for b in model.buffers()]
            if hasattr(model, "parameters")
            else []
        )
        if overlaps(mine, storages(params)):
            raise rejected(
                "output_aliasing",
                f"{name} shares memory with a parameter or buffer of ModelNew",
            )


def poison(value: Any, keep: Any) -> None:
    """Overwrite the reference's outputs (memory the allocator may hand to the candidate
    next) and a few fresh blocks of the same sizes with NaN / all-ones bits, so a candidate
    that returns uninitialised memory cannot pick up the reference's result."""
    import torch

    keep_spans = storages(keep)
    for _, t in flatten(value, "x"):
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        with torch.no_grad():
            if not overlaps(storages(t), keep_spans):
                fill_poison(t)
            for _ in range(2):
                junk = torch.empty_like(t)
                fill_poison(junk)
                del junk


def fill_poison(t: Any) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype.is_signed:
        t.fill_(-1)
    else:
        t.fill_(1)


def run_candidate(model: Any, inputs: Any, device: str, baseline_threads: int) -> Any:
    """One guarded forward call: ops, launches, threads and processes are all watched."""
    import torch

    guard = make_op_guard()
    Launches.count = 0
    with torch.no_grad(), guard:
        got = model(*inputs)
    if device == "cuda":
        torch.cuda.synchronize()  # device-wide: work on side streams is finished too
    if guard.bad:
        ops = ", ".join(f"{k}" for k in sorted(guard.bad)[:6])
        raise rejected(
            "torch_compute",
            f"forward() ran PyTorch compute ops outside the kernel: {ops} (only allocation, "
            "views, reshapes and copies may surround the kernel)",
        )
    if Launches.count == 0 and LAUNCH_CHECK[0]:
        raise rejected(
            "no_kernel_launch",
            f"forward() launched no {LAUNCH_CHECK[0]}: the kernel must do the work",
        )
    threads = os_threads()
    if threads > baseline_threads:
        raise rejected(
            "threads",
            f"forward() left {threads - baseline_threads} extra thread(s) running "
            "(work escaping the timer or the check)",
        )
    kids = child_processes()
    if kids:
        raise rejected("processes", f"forward() started {len(kids)} child process(es)")
    return got


# What forward() must launch at least once ("" turns the check off).
LAUNCH_CHECK = ["Triton kernel"]


# --------------------------------------------------------------------------- timing


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(p * (len(ordered) - 1))))]

    return {
        "min": ordered[0],
        "p20": q(0.2),
        "median": statistics.median(ordered),
        "p80": q(0.8),
        "mean": statistics.fmean(ordered),
    }


def time_cuda(
    ref: Any, cand: Any, inputs: list[Any], reps: int, baseline: Any = None
) -> dict[str, Any]:
    """Candidate and baseline timed interleaved with CUDA events: warm-up, an L2 flush
    before every repetition, device-wide sync before each end event is read."""
    import torch

    base = baseline if baseline is not None else ref
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")
    ref_in, cand_in = clone(inputs), clone(inputs)
    with torch.no_grad():
        for _ in range(TIMING_WARMUP):
            base(*ref_in)
            cand(*cand_in)
        torch.cuda.synchronize()
        base_ms: list[float] = []
        cand_ms: list[float] = []
        for i in range(reps):
            order = ((base, ref_in, base_ms), (cand, cand_in, cand_ms))
            for model, args, sink in order if i % 2 == 0 else order[::-1]:
                flush.zero_()  # evict the L2 cache: no rep profits from the previous one
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                model(*args)
                end.record()
                torch.cuda.synchronize()  # device-wide: side-stream work is counted
                sink.append(start.elapsed_time(end))
    return {"candidate_ms": quantiles(cand_ms), "baseline_ms": quantiles(base_ms)}


def copy_bandwidth_gbs() -> float:
    """Achievable device memory bandwidth (GB/s), measured with a large copy."""
    import torch

    n = 128 * 1024 * 1024 // 4
    a = torch.empty(n, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / 5
    return 2 * a.nbytes / seconds / 1e9


def tensor_bytes(value: Any) -> int:
    import torch

    return sum(t.nbytes for _, t in flatten(value, "x") if isinstance(t, torch.Tensor))


def timing_report(
    ref: Any, cand: Any, inputs: list[Any], expected: Any, job: dict[str, Any]
) -> tuple[float | None, dict[str, Any]]:
    """Speedup over eager (or torch.compile) PyTorch, with plausibility flags: a speedup
    above 10x, or a candidate moving its bytes faster than the device's copy bandwidth,
    is re-timed with more repetitions and flagged."""
    reps = int(job.get("timing_reps", TIMING_REPS))
    baseline_kind = str(job.get("baseline", "eager"))
    baseline = None
    if baseline_kind == "compile":
        import torch

        baseline = torch.compile(ref)
    stats = time_cuda(ref, cand, inputs, reps, baseline)
    flags: list[str] = []
    speedup = stats["baseline_ms"]["median"] / max(stats["candidate_ms"]["median"], 1e-9)
    moved = tensor_bytes(inputs) + tensor_bytes(expected)
    bandwidth = copy_bandwidth_gbs()
    implied = moved / (stats["candidate_ms"]["median"] / 1000) / 1e9
    suspicious = speedup > PLAUSIBLE_SPEEDUP or implied > 1.5 * bandwidth
    if suspicious:
        stats = time_cuda(ref, cand, inputs, reps * 4, baseline)
        speedup = stats["baseline_ms"]["median"] / max(stats["candidate_ms"]["median"], 1e-9)
        implied = moved / (stats["candidate_ms"]["median"] / 1000) / 1e9
        if speedup > PLAUSIBLE_SPEEDUP:
            flags.append(f"implausible speedup {speedup:.1f}x (> {PLAUSIBLE_SPEEDUP:g}x): re-timed")
        if implied > 1.5 * bandwidth:
            flags.append(
                f"candidate moves its inputs and outputs at {implied:.0f} GB/s, above the "
                f"device's measured copy bandwidth ({bandwidth:.0f} GB/s)"
            )
    return speedup, {**stats, "baseline": baseline_kind, "reps": reps, "flags": flags}


# --------------------------------------------------------------------------- main check


def classify_exception(exc: BaseException) -> str:
    names = {type(e).__name__ for e in exception_chain(exc)}
    if names & {"CompilationError", "CompileException", "NVRTCError", "SyntaxError"}:
        return "compile_error"
    return "runtime_error"


def exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return chain


def wrote_outside(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a write the read-only sandbox file system refused (an
    OSError, or a library's own error quoting it, as torch.save's RuntimeError does)."""
    import errno

    text = os.strerror(errno.EROFS)
    return any(
        (isinstance(e, OSError) and e.errno == errno.EROFS) or text in str(e)
        for e in exception_chain(exc)
    )


WROTE_OUTSIDE = "filesystem: the candidate tried to write outside its sandbox work dir: "


def start_cuda_backend(device: str) -> Any:
    """CuPy for the ``cuda`` backend, ready to count raw-kernel launches; raises (the
    caller answers ``unsupported``) if CuPy is missing or sees no CUDA GPU."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    if count < 1:
        raise RuntimeError("CuPy sees no CUDA device")
    Launches.install_cupy(cupy)
    if device == "cuda":
        import torch

        # RawKernel launches go to CuPy's current stream: it must be torch's current stream,
        # so the kernel is ordered with the reference, the input copies and the CUDA-event
        # timer (the checks also synchronise the whole device after every call). Both
        # default to the legacy default stream (pointer 0); bind them if torch's differs.
        ptr = torch.cuda.current_stream().cuda_stream
        if ptr != 0:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # ExternalStream is deprecated in CuPy 14
                cupy.cuda.ExternalStream(ptr).use()
    return cupy


def run_job(workdir: Path, job: dict[str, Any]) -> dict[str, Any]:
    import torch

    device: str = job.get("device", "cpu")
    backend: str = job.get("backend", "triton")
    trials = max(1, int(job.get("trials", 3)))
    seed = int(job.get("seed", 0))
    shape_sets: list[dict[str, int]] = list(job.get("shapes") or [{}])
    auto_shapes = bool(job.get("auto_shapes", False))
    tolerances = dict(DEFAULT_TOLERANCES)
    for key, value in (job.get("tolerances") or {}).items():
        tolerances[key] = (float(value[0]), float(value[1]))
    tolerances.setdefault("float64", tolerances["float32"])
    LAUNCH_CHECK[0] = {"triton": "Triton kernel", "cuda": "CUDA kernel (cupy.RawKernel)"}.get(
        backend, ""
    )
    Launches.install()

    if device == "cuda":
        # Full-precision fp32 reference: TF32 would loosen it beyond the tolerances.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    wd = str(workdir)
    base: dict[str, Any] = {"device": device, "trials": 0, "shapes": []}
    notes: list[str] = []
    if not job.get("fs_isolation"):
        notes.append(
            "sandbox: no file-system isolation on this machine (mount namespaces are not "
            "available): writes outside the work dir are not blocked"
        )

    def failed(
        verdict: str, summary: str, lines: list[str], reason: str, trials_done: int = 0
    ) -> dict[str, Any]:
        # One feedback entry: the (trimmed) traceback reads best as a single block.
        return {
            **base,
            "verdict": verdict,
            "summary": summary,
            "errors": ["\n".join(lines)],
            "reasons": [reason],
            "trials": trials_done,
        }

    def refused(
        failure: VerificationFailure, trial: int, label: str, shapes: list[dict[str, int]]
    ) -> dict[str, Any]:
        """A check the candidate failed on trial ``trial``, with what it measured."""
        return {
            **base,
            "verdict": failure.verdict,
            "max_abs_err": _finite(failure.fields.get("max_abs_err")),
            "max_rel_err": _finite(failure.fields.get("max_rel_err")),
            "mismatches": failure.fields.get("mismatches", []),
            "trials": trial + 1,
            "summary": f"{label}: {failure.summary}",
            "errors": failure.errors,
            "reasons": [f"{failure.rule}: {failure.summary}"],
            "shapes": shapes,
        }

    # The reference comes first: a broken task is not the coder's fault.
    try:
        task = load_module(workdir / job["task_file"], f"kf_task_{tag}")
    except BaseException as exc:
        tb = format_exception(exc, wd)
        return failed(
            "runtime_error", "the reference task failed to import", tb, "task_error: " + tb[-1]
        )
    if backend == "cuda":
        try:
            start_cuda_backend(device)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            msg = (
                f"backend 'cuda' is unsupported on this device ({device}): CuPy cannot "
                f"compile and launch CUDA kernels here ({type(exc).__name__}: {exc})"
            )
            return failed("unsupported", msg, [msg], "unsupported: " + msg)
    try:
        cand_mod = load_module(workdir / job["candidate_file"], f"kf_candidate_{tag}")
    except BaseException as exc:
        tb = format_exception(exc, wd)
        last = tb[-1] if tb else type(exc).__name__
        if wrote_outside(exc):
            return failed("rejected_runtime", f"candidate import: {last}", tb, WROTE_OUTSIDE + last)
        return failed("compile_error", f"candidate failed to import: {last}", tb, "import: " + last)
    model_cls = getattr(task, "Model", None)
    new_cls = getattr(cand_mod, "ModelNew", None)
    if model_cls is None:
        return failed(
            "runtime_error",
            "the reference task defines no Model",
            ["no Model"],
            "task_error: no Model",
        )
    if new_cls is None:
        msg = "candidate module defines no ModelNew after import"
        return failed("compile_error", msg, [msg], "no_modelnew: " + msg)

    defaults = {name: getattr(task, name) for s in shape_sets for name in s if hasattr(task, name)}
    usable: list[dict[str, int]] = []
    max_abs = max_rel = 0.0
    ref_model = cand_model = None
    inputs: list[Any] = []
    expected: Any = None
    baseline_threads = 0
    n_runs = max(trials, len(shape_sets))
    skipped: set[int] = set()
    done = 0
    for trial in range(n_runs):
        set_index = trial % len(shape_sets)
        if set_index in skipped:
            continue
        shapes = shape_sets[set_index]
        for name, value in defaults.items():
            setattr(task, name, value)
        for name, value in shapes.items():
            setattr(task, name, value)
        label = f"trial {trial + 1}/{n_runs}" + (
            f" (shapes {', '.join(f'{k}={v}' for k, v in shapes.items())})" if shapes else ""
        )
        trial_seed = seed * 1_000_003 + trial
        stage = "reference"
        try:
            # Same seed before each constructor: parameters initialised in the same order
            # come out identical, as KernelBench does.
            seed_all(trial_seed)
            ref_model = model_cls(*task.get_init_inputs())
            ref_model = ref_model.to(device).eval()
            seed_all(trial_seed + 7919)  # a different stream for the inputs
            inputs = list(to_device(task.get_inputs(), device))
            ref_in, cand_in = clone(inputs), clone(inputs)
            with torch.no_grad():
                ref_out = ref_model(*ref_in)
            if device == "cuda":
                torch.cuda.synchronize()
            expected = clone(ref_out)
            poison(ref_out, ref_in)
            del ref_out
            baseline_threads = max(baseline_threads, os_threads())
            stage = "ModelNew(...) construction"
            seed_all(trial_seed)
            cand_model = new_cls(*task.get_init_inputs())
            if hasattr(cand_model, "to"):
                cand_model = cand_model.to(device)
            if hasattr(cand_model, "eval"):
                cand_model = cand_model.eval()
            baseline_threads = max(baseline_threads, os_threads())
            stage = "ModelNew.forward"
            got = run_candidate(cand_model, cand_in, device, baseline_threads)
        except VerificationFailure as failure:
            return refused(failure, trial, label, [*usable, shapes])
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            tb = format_exception(exc, wd)
            last = tb[-1] if tb else type(exc).__name__
            if stage == "reference":
                if auto_shapes and set_index > 0:
                    skipped.add(set_index)
                    notes.append(f"shape set {shapes} skipped: the reference fails there ({last})")
                    continue
                return failed(
                    "runtime_error",
                    f"the reference model failed ({label}): {last}",
                    tb,
                    "task_error: " + last,
                    trial,
                )
            verdict = classify_exception(exc)
            if any(isinstance(e, BlockingIOError) for e in exception_chain(exc)):
                verdict, reason = "rejected_runtime", "processes: process limit reached: " + last
            elif wrote_outside(exc):
                verdict, reason = "rejected_runtime", WROTE_OUTSIDE + last
            elif isinstance(exc, MemoryError) or "alloc" in last.lower():
                reason = "memory: " + last
            else:
                reason = f"{'compile' if verdict == 'compile_error' else 'exception'}: {last}"
            return failed(
                verdict, f"candidate raised in {stage} ({label}): {last}", tb, reason, trial
            )

        try:
            # Kernels must not write to their inputs. Compared with the reference's inputs
            # after its run, so a task whose reference is itself in-place stays checkable.
            for i, (before, after) in enumerate(
                zip(flatten(ref_in, "input"), flatten(cand_in, "input"), strict=True)
            ):
                if isinstance(before[1], torch.Tensor) and not same_values(before[1], after[1]):
                    raise rejected(
                        "input_mutation",
                        f"input mutation: the candidate modified input #{i} in place (the "
                        "reference does not); kernels must not write to their inputs",
                    )
            check_output_storage(got, cand_in, cand_model)
            a, r = compare_outputs(expected, got, tolerances)
            # A second call on fresh copies of the same inputs must agree with the first
            # and return new memory: no state or cached results carried between calls.
            again_in = clone(inputs)
            got2 = run_candidate(cand_model, again_in, device, baseline_threads)
            check_output_storage(got2, again_in, cand_model)
            if overlaps(storages(got2), storages(got)):
                raise rejected(
                    "second_run",
                    "the second forward() call returned the memory of the first call's "
                    "output (a cached or reused result); allocate a new output per call",
                )
            try:
                compare_outputs(got, got2, tolerances)
            except VerificationFailure as drift:
                raise rejected(
                    "second_run",
                    "a second forward() call on the same inputs disagrees with the first: "
                    + drift.summary,
                ) from None
        except VerificationFailure as failure:
            return refused(failure, trial, label, [*usable, shapes])
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            tb = format_exception(exc, wd)
            last = tb[-1] if tb else type(exc).__name__
            outside = wrote_outside(exc)
            return failed(
                "rejected_runtime" if outside else classify_exception(exc),
                f"candidate raised in its second forward() call ({label}): {last}",
                tb,
                (WROTE_OUTSIDE if outside else "exception: ") + last,
                trial,
            )
        if shapes not in usable:
            usable.append(shapes)
        done += 1
        max_abs, max_rel = max(max_abs, a), max(max_rel, r)

    speedup: float | None = None
    timing: dict[str, Any] | None = None
    # Interpreted Triton on CPU has no meaningful timing: speedup stays null there.
    if device == "cuda" and job.get("timing", True):
        try:
            speedup, timing = timing_report(ref_model, cand_model, inputs, expected, job)
            speedup = _finite(speedup)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            notes.append("timing failed: " + " | ".join(format_exception(exc, wd)[-3:]))
    summary = f"all {done} trial(s) match the reference (max abs err {_fmt(max_abs)})"
    if len(usable) > 1:
        summary += f" on {len(usable)} shape sets"
    if speedup is not None:
        summary += f"; speedup {speedup:.2f}x"
    return {
        **base,
        "verdict": "pass",
        "summary": summary,
        "errors": notes,
        "reasons": [f"flag: {f}" for f in (timing or {}).get("flags", [])],
        "max_abs_err": _finite(max_abs),
        "max_rel_err": _finite(max_rel),
        "trials": done,
        "speedup": speedup,
        "timing": timing,
        "shapes": usable,
    }


def execute(workdir: Path, nonce: str) -> None:
    """Run the job of ``workdir`` in this (already confined) process; never returns."""
    job: dict[str, Any] = {}
    started = time.perf_counter()
    me = os.getpid()
    try:
        job = json.loads((workdir / "job.json").read_text())
        confine(workdir, job)
        result = run_job(workdir, job)
    except BaseException as exc:  # a bug here must still produce a readable verdict
        result = {
            "verdict": "runtime_error",
            "summary": f"verifier internal error: {exc!r}",
            "errors": ["\n".join(format_exception(exc, str(workdir)))],
            "reasons": [f"internal: {exc!r}"],
            "device": str(job.get("device") or ""),
        }
    if os.getpid() != me:  # a process the candidate forked: only the sandbox reports
        os._exit(0)
    result["duration_s"] = time.perf_counter() - started
    result["nonce"] = nonce
    try:
        (workdir / "result.json").write_text(json.dumps(result, allow_nan=False))
    except BaseException:
        os._exit(70)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip atexit handlers and interpreter teardown: candidate code may have registered
    # some (to rewrite result.json, or to hang).
    os._exit(0)


# --------------------------------------------------------------------------- warm worker


def fork_sandbox(job: dict[str, Any], status_w: int) -> int:
    """Fork the intermediate process; returns its pid (also its process group id).

    The intermediate starts a session, moves its future children into a new PID namespace
    when allowed, forks the sandbox and reports the sandbox's wait status on ``status_w``.
    """
    workdir = Path(job["workdir"])
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    try:  # intermediate
        os.setsid()
        die_with_parent()
        pidns = _libc().unshare(CLONE_NEWPID) == 0
        enter_pids_cgroup(NPROC_LIMIT)
        child = os.fork()
        if child == 0:  # the sandbox
            os.close(status_w)
            log = os.open(workdir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.closerange(3, 4096)  # nothing of the worker's pipes stays reachable
            sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            faulthandler.enable()
            execute(workdir, str(job["nonce"]))
        _, status = os.waitpid(child, 0)
        os.write(status_w, json.dumps({"status": status, "pidns": pidns}).encode())
        os._exit(0)
    except BaseException:
        os._exit(71)


def serve(device: str) -> int:
    """The warm worker loop (see the module docstring)."""
    die_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    import numpy  # noqa: F401
    import torch
    import torch._dynamo  # entering a TorchDispatchMode imports it lazily: 2+ s
    import torch.utils._python_dispatch
    import triton
    import triton.language

    with contextlib.suppress(ImportError):
        import triton.runtime.interpreter
    del torch, triton
    out = sys.stdout
    print(json.dumps({"ready": True, "pid": os.getpid()}), file=out, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        timeout = float(job.get("timeout_s", 300.0))
        started = time.monotonic()
        status_r, status_w = os.pipe()
        try:
            pid = fork_sandbox(job, status_w)
        except OSError as exc:
            os.close(status_r)
            os.close(status_w)
            print(json.dumps({"outcome": "spawn_error", "error": str(exc)}), file=out, flush=True)
            continue
        os.close(status_w)
        timed_out = False
        deadline = started + timeout
        delay = 0.002
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
        # Before reaping: the group id cannot be reused while the leader is a zombie.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        _, istatus = os.waitpid(pid, 0)
        remove_pids_cgroup(pid)
        sweep_pids_cgroups()
        report: dict[str, Any] = {"outcome": "timeout" if timed_out else "done"}
        ready, _, _ = select.select([status_r], [], [], 0)
        raw = os.read(status_r, 4096) if ready else b""
        os.close(status_r)
        if raw:
            info = json.loads(raw)
            status = int(info["status"])
            report["pidns"] = bool(info["pidns"])
        else:  # the intermediate itself was killed (by the candidate, or on timeout)
            status = istatus
            report["intermediate_lost"] = True
        if os.WIFSIGNALED(status):
            report["signal"] = os.WTERMSIG(status)
        else:
            report["code"] = os.WEXITSTATUS(status)
        report["duration_s"] = time.monotonic() - started
        print(json.dumps(report), file=out, flush=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[1] == "--probe":
        return probe(argv[2], argv[3], int(argv[4]), fs=argv[5:6] == ["fs"])
    if len(argv) == 3 and argv[1] == "--serve":
        return serve(argv[2])
    if len(argv) != 2:
        print("usage: sandbox_child.py WORKDIR | --serve DEVICE | --probe ...", file=sys.stderr)
        return 2
    # Candidate prints must survive a crash (os._exit, segfault) to be shown as feedback.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    # A segfault in a kernel then still prints the Python stack (candidate.py line).
    faulthandler.enable()
    # Read before anything untrusted runs; the nonce then only lives in this frame.
    nonce = sys.stdin.readline().strip()
    execute(Path(argv[1]).resolve(), nonce)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
