"""A command run confined, as the agents' tools run theirs: in a PID namespace of its own
where the machine allows one (so even a process that left the group dies with it),
confined as a candidate is (:func:`~kernelflow.sandbox.confine.confine_candidate`:
its own network and mount namespaces, the file-system view that hides secrets, homes and
other sandboxes, ``nobody`` without capabilities, a memory limit, no core dumps, bounded
file size, death with its parent), under a wall-clock timeout that kills its whole
process group, with a bounded output tail. Where the machine cannot isolate it, refused
(:class:`~kernelflow.sandbox.confine.SandboxUnavailable`) unless the operator
opted in."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Sequence

from kernelflow.sandbox.confine import SandboxUnavailable
from kernelflow.sandbox.probe import network_prefixes
from kernelflow.sandbox.process import ProcessOutcome, isolated_module, run_process

__all__ = ["isolation_prefix", "run_confined"]

_CONFINED_EXEC = tuple(isolated_module(sys.executable, "kernelflow.sandbox.confined_exec"))


@functools.cache
def isolation_prefix() -> tuple[str, ...]:
    """The strongest network prefix (:func:`network_prefixes`), with a PID namespace
    (``--kill-child``: everything in it dies with the command) when unshare allows it
    here; probed once. Run behind :func:`dying_with_this_process`."""
    net = network_prefixes()[0]
    if not net:
        return ()
    with_pid = (*net, "--pid", "--fork", "--kill-child")
    try:
        probe = subprocess.run(
            [*dying_with_this_process(), *with_pid, "true"],
            capture_output=True,
            timeout=10.0,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return net
    return with_pid if probe.returncode == 0 else net


def dying_with_this_process() -> tuple[str, ...]:
    """A prefix that makes the command it runs die with this process (killed, it has no
    chance to kill the command itself), naming this process so that a command started
    just as it died does not run on as an orphan."""
    # Imported here: the package must not hold the module it runs with -m.
    from kernelflow.sandbox.confined_exec import DIE_WITH_PARENT

    return (*_CONFINED_EXEC, DIE_WITH_PARENT, str(os.getpid()))


def run_confined(
    argv: Sequence[str],
    workdir: str,
    env: dict[str, str],
    timeout_s: float,
    max_bytes: int,
    memory_mb: int = 0,
) -> ProcessOutcome:
    """Run ``argv`` in ``workdir`` isolated and confined (see the module docstring), with an
    address-space limit of ``memory_mb`` (0: none), for at most ``timeout_s`` seconds,
    keeping the last ``max_bytes`` of its output. Raises :class:`SandboxUnavailable` if
    the machine cannot isolate it (and the operator did not opt in)."""
    from kernelflow.sandbox.confined_exec import UNAVAILABLE, UNAVAILABLE_STATUS

    limit = ("as", str(memory_mb)) if memory_mb else ("none", "0")
    cmd = [*dying_with_this_process(), *isolation_prefix(), *_CONFINED_EXEC, *limit, *argv]
    outcome = run_process(cmd, workdir, env, timeout_s, max_bytes)
    if outcome.returncode == UNAVAILABLE_STATUS and UNAVAILABLE in outcome.output:
        reason = outcome.output.rsplit(UNAVAILABLE, 1)[1].strip()
        raise SandboxUnavailable(reason)
    return outcome
