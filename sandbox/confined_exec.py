"""Become a command after confining this process: how a sandboxed command starts.

    python -I -m kernelflow.sandbox.confined_exec MEMORY_KIND MEMORY_MB COMMAND...
        confine this process to its cwd as a candidate is (``confine_candidate``: its own
        namespaces and file-system view, ``nobody``, the limits), then exec COMMAND;
        where the machine cannot isolate it (and ``KF_SANDBOX_ALLOW_NETWORK`` does not opt
        in), print ``UNAVAILABLE`` and the reason on stderr and exit 125 instead
    python -I -m kernelflow.sandbox.confined_exec --die-with-parent PID COMMAND...
        only die with the parent, PID (the spawner names itself: a parent already gone
        when this starts is then seen as gone), then exec COMMAND: put before ``unshare``,
        whose child (``--kill-child``) then dies with it in turn
    python -I -m kernelflow.sandbox.confined_exec --probe
        what confining works here (``probe_isolation``'s lines), for ``kernelflow health``

Never imported by the package (``-m`` would then run a second copy of it), but for its
constants. Child side: stdlib only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kernelflow.sandbox.confine import (
    SandboxUnavailable,
    confine_candidate,
    network_opted_in,
    probe_isolation,
)
from kernelflow.sandbox.limits import die_with_parent

MODULE = "kernelflow.sandbox.confined_exec"
DIE_WITH_PARENT = "--die-with-parent"
PROBE = "--probe"
UNAVAILABLE = "kernelflow sandbox unavailable: "
UNAVAILABLE_STATUS = 125


def main(argv: list[str]) -> int:
    if argv == [PROBE]:
        return probe_isolation(lambda: 0)
    if len(argv) >= 3 and argv[0] == DIE_WITH_PARENT and argv[1].isdigit():
        die_with_parent(int(argv[1]))
        command = argv[2:]
    elif len(argv) >= 3:
        try:
            confine_candidate(
                Path.cwd(),
                memory_kind=argv[0],
                memory_mb=int(argv[1]),
                allow_network=network_opted_in(),
            )
        except SandboxUnavailable as exc:
            print(UNAVAILABLE + exc.reason, file=sys.stderr, flush=True)
            return UNAVAILABLE_STATUS
        command = argv[2:]
    else:
        print(f"usage: {MODULE} MEMORY_KIND MEMORY_MB COMMAND...", file=sys.stderr)
        return 2
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
