"""The sandbox: how kernelflow runs code it does not trust, for the verifier and for the
agents' tools alike.

Child side (stdlib only: imported inside sandboxes, by ``python -I`` processes):

- :mod:`.limits`: death with the parent, rlimits, ``nobody`` or no capabilities, pids cgroup;
- :mod:`.filesystem`: the read-only mount namespace and the child side of its probe;
- :mod:`.confine`: all of it, in order, for one sandbox;
- :mod:`.confined_exec`: ``python -I -m kernelflow.actors.sandbox.confined_exec``, a
  command confined (run by the parent, never imported);
- :mod:`.worker_server`: the warm worker that forks one sandbox per job.

Parent side (in the daemon; never imports torch):

- :mod:`.process`: the minimal environment, a run with a timeout that kills the process
  group, bounded output;
- :mod:`.probe`: what the machine allows (GPU, network namespaces, the sandbox plan);
- :mod:`.command`: a command run confined (the tools' sandbox);
- :mod:`.worker`: the pool of warm workers and one job run in one.
"""

from kernelflow.actors.sandbox.command import isolation_prefix, run_confined
from kernelflow.actors.sandbox.confine import confine
from kernelflow.actors.sandbox.filesystem import PROBE_PREFIX, probe_isolation
from kernelflow.actors.sandbox.limits import apply_limits
from kernelflow.actors.sandbox.probe import (
    SandboxPlan,
    detect_device,
    device_env,
    network_prefixes,
    sandbox_plan,
)
from kernelflow.actors.sandbox.process import (
    ProcessOutcome,
    isolated_module,
    run_process,
    sandbox_env,
)
from kernelflow.actors.sandbox.worker import (
    WorkerKey,
    WorkerLost,
    discard_worker,
    run_in_worker,
    shutdown_workers,
    worker_for,
)
from kernelflow.actors.sandbox.worker_server import serve

__all__ = [
    "PROBE_PREFIX",
    "ProcessOutcome",
    "SandboxPlan",
    "WorkerKey",
    "WorkerLost",
    "apply_limits",
    "confine",
    "detect_device",
    "device_env",
    "discard_worker",
    "isolated_module",
    "isolation_prefix",
    "network_prefixes",
    "probe_isolation",
    "run_confined",
    "run_in_worker",
    "run_process",
    "sandbox_env",
    "sandbox_plan",
    "serve",
    "shutdown_workers",
    "worker_for",
]
