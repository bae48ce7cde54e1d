"""Become a command after confining this process: how a sandboxed command starts.

    python -I -m kernelflow.actors.sandbox.confined_exec MEMORY_KIND MEMORY_MB COMMAND...
        confine this process to its cwd as a verifier sandbox is (no file-system
        isolation), then exec COMMAND
    python -I -m kernelflow.actors.sandbox.confined_exec --die-with-parent COMMAND...
        only die with the parent, then exec COMMAND: put before a forking ``unshare``,
        whose child (``--kill-child``) then dies with it in turn

Never imported by the package (``-m`` would then run a second copy of it). Child side:
stdlib only.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from kernelflow.actors.sandbox.confine import confine
from kernelflow.actors.sandbox.limits import die_with_parent

MODULE = "kernelflow.actors.sandbox.confined_exec"
DIE_WITH_PARENT = "--die-with-parent"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == DIE_WITH_PARENT:
        die_with_parent()
        command = argv[1:]
    elif len(argv) >= 3:
        confine(Path.cwd(), memory_kind=argv[0], memory_mb=int(argv[1]))
        command = argv[2:]
    else:
        print(f"usage: {MODULE} MEMORY_KIND MEMORY_MB COMMAND...", file=sys.stderr)
        return 2
    os.execvp(command[0], command)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
