"""Temp work dirs of sandboxed runs (verifications, their probe, agents' tools) and of the
embedded NATS server, and the clean-up after a process that was killed while using some.

A work dir is removed when its run ends, but a SIGKILLed daemon runs no clean-up. So each
one is locked (``flock``) while in use: the kernel drops the lock when its process dies,
and a daemon that starts later removes the unlocked ones, leaving alone those of runs still
going in other daemons that share the temp dir."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kernelflow.sandbox import PROBE_PREFIX

VERIFY_PREFIX = "kf-verify-"
TOOL_PREFIX = "kf-tool-"
NATS_PREFIX = "kf-nats-"
# The sandbox's file-system probe (which runs in a sandbox process) locks its dirs too.
LOCKED_PREFIXES = (VERIFY_PREFIX, TOOL_PREFIX, NATS_PREFIX, PROBE_PREFIX)
# A work dir is locked microseconds after it is made; one unlocked and older than this was
# left by a process that died (or by a version that did not lock).
ABANDONED_AFTER_S = 60.0


@contextlib.contextmanager
def locked_workdir(prefix: str, parent: Path | None = None) -> Iterator[str]:
    """A fresh dir under ``parent`` (the temp dir), locked while in use, removed after."""
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)


def remove_abandoned_workdirs(
    root: str | None = None, older_than_s: float = ABANDONED_AFTER_S
) -> list[str]:
    """Remove the work dirs in ``root`` (the temp dir) that no live process holds: this
    user's plain directories named with one of ``LOCKED_PREFIXES``, unlocked and older than
    ``older_than_s``. Never follows links. Returns the paths removed."""
    removed: list[str] = []
    now = time.time()
    try:
        entries = list(os.scandir(root or tempfile.gettempdir()))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(LOCKED_PREFIXES):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
            if not entry.is_dir(follow_symlinks=False) or info.st_uid != os.getuid():
                continue
            if now - info.st_mtime < older_than_s:
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # gone meanwhile, or not ours to look into
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)  # locked: a run is using it
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
        if not os.path.lexists(entry.path):
            removed.append(entry.path)
    return removed
