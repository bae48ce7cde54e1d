"""The verifier's sandbox process, started as ``python -I -m kernelflow.verification.child``
(isolated: nothing of the daemon's environment; site-packages still hold kernelflow):

``... WORKDIR --result-fd FD``
    One fresh process for the job in WORKDIR, its result written on the pipe FD: the
    naive, slower path.
``... --serve DEVICE``
    The warm process (:mod:`kernelflow.sandbox.warm_server`): the runtime imported
    once, a sandbox forked per job (and per probe of its sandboxes).
``... --probe DEVICE MEMORY_KIND MEMORY_MB [fs]``
    Applies the limits, imports torch and triton, prints ``ok``; with ``fs``, inside the
    sandbox's read-only file system (printing a ``filesystem: ...`` line first), so the
    parent learns whether that isolation works here.

Only the stdlib, torch, triton and numpy (and the sandbox, child and backends packages)
are imported here: never the daemon's dependencies.
"""

from __future__ import annotations

import faulthandler
import sys
from pathlib import Path

from kernelflow.sandbox import probe_isolation, serve
from kernelflow.verification.child.job import execute
from kernelflow.verification.child.preload import check_runtime, preload

USAGE = (
    "usage: python -I -m kernelflow.verification.child "
    "WORKDIR --result-fd FD | --serve DEVICE | --probe ..."
)


def probe(argv: list[str]) -> int:
    """``--probe``'s work: ``DEVICE MEMORY_KIND MEMORY_MB [fs]``."""
    device, kind, memory_mb, fs = argv[0], argv[1], int(argv[2]), argv[3:4] == ["fs"]
    if fs:
        return probe_isolation(lambda: check_runtime(device, kind, memory_mb, fs=True))
    return check_runtime(device, kind, memory_mb, fs=False)


def main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "--probe":
        return probe(argv[1:])
    if len(argv) == 2 and argv[0] == "--serve":
        return serve(preload, execute, probe)
    if len(argv) != 3 or argv[1] != "--result-fd" or not argv[2].isdigit():
        print(USAGE, file=sys.stderr)
        return 2
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    faulthandler.enable()
    execute(Path(argv[0]).resolve(), int(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
