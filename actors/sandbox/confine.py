"""Confinement of one sandboxed process, in the order it must happen: its own read-only
file system (where the probe found that works), its work dir as cwd and cache home, the
``nobody`` user or no capabilities, then the resource limits.

Child side: imported inside sandboxes, so stdlib only.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernelflow.actors.sandbox.filesystem import isolate_filesystem, point_caches_at
from kernelflow.actors.sandbox.limits import apply_limits, drop_capabilities, drop_privileges

__all__ = ["confine"]


def confine(
    workdir: Path, *, fs_isolation: bool = False, memory_kind: str = "as", memory_mb: int = 0
) -> None:
    """Confine this process to ``workdir`` before any untrusted code runs (see the module
    docstring; ``memory_kind`` as in :func:`~kernelflow.actors.sandbox.limits.apply_limits`)."""
    if fs_isolation:
        # Fails closed: the probe said it works here, so a failure now is an error.
        isolate_filesystem(workdir)
    os.chdir(workdir)  # after the bind mount: the cwd must be the writable mount
    point_caches_at(workdir)
    if not drop_privileges(workdir) and os.geteuid() == 0:
        try:
            drop_capabilities()
        except OSError:
            if fs_isolation:
                raise  # root with CAP_SYS_ADMIN could remount everything writable
    apply_limits(memory_kind, memory_mb)
