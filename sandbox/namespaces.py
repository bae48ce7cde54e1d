"""Linux namespaces and identity for one sandboxed process: what it may do here (its
capabilities, the ids its user namespace maps), the namespaces it enters (with a user
namespace of its own when it holds no privilege), whether it is cut off the network, and
the switch to the unprivileged user ``nobody`` with no capability left.

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from kernelflow.sandbox.limits import (
    NOBODY,
    drop_bounding_set,
    drop_capabilities,
    give_to_nobody,
    libc,
)

__all__ = [
    "CLONE_NEWIPC",
    "CLONE_NEWNET",
    "CLONE_NEWNS",
    "CLONE_NEWPID",
    "CLONE_NEWUSER",
    "Namespaces",
    "become_nobody",
    "enter_namespaces",
    "enter_user_namespace",
    "has_capability",
    "id_mapped",
    "network_isolated",
    "unshare",
    "unshare_pid_namespace",
]

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
CAP_CHOWN = 0
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SYS_ADMIN = 21
SIOCGIFFLAGS = 0x8913
IFF_UP = 0x1
KEYCTL_JOIN_SESSION_KEYRING = 1
KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219}  # keyctl(2) is not in glibc


def unshare(flags: int) -> None:
    """``unshare(2)``; raises OSError."""
    if libc().unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}): {os.strerror(err)}")


def _effective_capabilities() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def has_capability(cap: int) -> bool:
    """Whether this process holds ``cap`` (effective) in its user namespace."""
    try:
        return bool(_effective_capabilities() >> cap & 1)
    except (OSError, ValueError):
        return False


def id_mapped(kind: str, value: int) -> bool:
    """Whether user (``kind`` "uid") or group ("gid") id ``value`` exists in this
    process's user namespace (a setuid to an unmapped id fails)."""
    try:
        lines = Path(f"/proc/self/{kind}_map").read_text().splitlines()
    except OSError:
        return value == 0
    for line in lines:
        inside, _outside, count = (int(f) for f in line.split())
        if inside <= value < inside + count:
            return True
    return False


def enter_user_namespace(extra_flags: int = 0, inside: int = NOBODY) -> None:
    """Unshare a user namespace (with ``extra_flags``: namespaces it then owns) in which
    this process's user and group are ``inside``; it holds every capability there, none
    outside. Works unprivileged where the kernel allows user namespaces; raises OSError."""
    uid, gid = os.geteuid(), os.getegid()  # as the parent namespace sees them
    unshare(CLONE_NEWUSER | extra_flags)
    # Unprivileged, a gid map needs setgroups denied first (the supplementary groups stay).
    with contextlib.suppress(FileNotFoundError):
        Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{inside} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{inside} {gid} 1")


def unshare_pid_namespace() -> bool:
    """For a process about to fork a sandbox: put its next children in a new PID namespace
    (the first one forked is PID 1 there, sees only its namespace, and takes everything in
    it down when it dies). Without the privilege (a non-root daemon), in a new user
    namespace mapping this process's user as root, which the kernel allows where
    unprivileged user namespaces are on; the sandbox then holds the capabilities it needs to
    confine itself. Returns whether the children get a PID namespace."""
    try:
        unshare(CLONE_NEWPID)
        return True
    except OSError:
        pass
    if has_capability(CAP_SYS_ADMIN):
        return False
    try:
        enter_user_namespace(CLONE_NEWPID, inside=0)
    except OSError:
        return False
    return True


@dataclass
class Namespaces:
    """What :func:`enter_namespaces` got: a mount and an IPC namespace, a network
    namespace, a user namespace of its own (this process was unprivileged) and why not
    when something failed."""

    mount: bool = False
    network: bool = False
    user: bool = False
    problems: tuple[str, ...] = ()


def enter_namespaces() -> Namespaces:
    """Unshare new mount, IPC and network namespaces for this (single-threaded) process.

    With CAP_SYS_ADMIN (real root, or root of a user namespace) directly; otherwise
    together with a new user namespace in which this process is ``nobody`` holding every
    capability (only over the namespaces it owns). Where the network namespace is refused,
    the others are tried alone."""
    privileged = has_capability(CAP_SYS_ADMIN)
    problems: list[str] = []
    for net in (CLONE_NEWNET, 0):
        flags = CLONE_NEWNS | CLONE_NEWIPC | net
        try:
            if privileged:
                unshare(flags)
            else:
                enter_user_namespace(flags)
        except OSError as exc:
            what = "user, " if not privileged else ""
            kinds = what + "mount, IPC" + (" and network" if net else "")
            problems.append(f"{kinds} namespaces: {exc.strerror or exc}")
            if exc.errno not in (errno.EPERM, errno.EINVAL, errno.ENOSPC, errno.EACCES):
                break
            continue
        return Namespaces(True, bool(net), not privileged, tuple(problems))
    return Namespaces(problems=tuple(problems))


def _leave_session_keyring() -> None:
    """Join a new, empty session keyring: the daemon's (and the keys it holds, which its
    possessor may read whatever its user) stays behind. Best effort: a container may
    forbid keyctl, and then no key is reachable either."""
    number = KEYCTL_SYSCALL.get(os.uname().machine)
    if number is not None:
        libc().syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)


def network_isolated() -> bool:
    """Whether this process is cut off every network: its namespace has no interface but a
    loopback that is down (a fresh network namespace). Sockets refused: isolated too."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return True
    if any(name != "lo" for name in names):
        return False
    if not names:
        return True
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            raw = fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
    except OSError:
        return True
    flags = struct.unpack("16sH14x", raw)[1]
    return not flags & IFF_UP


def become_nobody(workdir: Path) -> str:
    """Make this process the unprivileged user ``nobody`` (65534) for good, its work dir
    its own; call after the mounts, which need the privileges it gives up. Returns how, in
    words; raises OSError if it cannot.

    Where this user namespace maps ``nobody`` and the process may change ids (real root):
    ``setuid``, a real other user (the work dir is given to it first:
    :func:`~kernelflow.sandbox.limits.give_to_nobody`). Otherwise (root of
    a user namespace mapping one id, or already in the user namespace of
    :func:`enter_namespaces`): a new user namespace in which the process's own id is
    ``nobody``; it keeps its real id outside, and only the file-system view keeps that
    user's files from it. Then every capability goes (bounding set included, and no new
    privileges through exec): see :func:`~kernelflow.sandbox.limits.drop_capabilities`.
    """
    _leave_session_keyring()
    if os.geteuid() == NOBODY:
        how = "nobody (in a user namespace of its own)"
    elif all(has_capability(c) for c in (CAP_SETUID, CAP_SETGID, CAP_CHOWN)) and (
        id_mapped("uid", NOBODY) and id_mapped("gid", NOBODY)
    ):
        give_to_nobody(workdir)
        drop_bounding_set()  # needs CAP_SETPCAP: before the ids change
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # clears the permitted and effective capabilities too
        how = "nobody"
    else:
        enter_user_namespace()
        how = "nobody (in a user namespace of its own)"
    drop_capabilities()
    if os.getuid() != NOBODY or os.geteuid() != NOBODY or _effective_capabilities():
        raise OSError(errno.EPERM, "could not become nobody without capabilities")
    return how
