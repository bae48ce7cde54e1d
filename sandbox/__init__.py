"""The sandbox: how kernelflow runs code it does not trust, for the verifier and for the
agents' tools alike.

Child side (stdlib only: imported inside sandboxes, by ``python -I`` processes):

- :mod:`.limits`: death with the parent, rlimits, capabilities, pids cgroup;
- :mod:`.namespaces`: user, mount, IPC, network and PID namespaces, ``nobody``;
- :mod:`.filesystem`: the read-only mount namespace;
- :mod:`.view`: what a sandbox sees on top of it (secrets, homes, other sandboxes hidden);
- :mod:`.confine`: all of it, in order, for one process about to run candidate code
  (:func:`confine_candidate`), and the child side of its probe;
- :mod:`.confined_exec`: ``python -I -m kernelflow.sandbox.confined_exec``, a
  command confined (run by the parent, never imported);
- :mod:`.warm_server`: the warm process that forks one sandbox per job.

Parent side (in the daemon; never imports torch):

- :mod:`.process`: the minimal environment, a run with a timeout that kills the process
  group, bounded output;
- :mod:`.probe`: what the machine allows (GPU, network namespaces, the sandbox plan);
- :mod:`.command`: a command run confined (the tools' sandbox);
- :mod:`.warm`: the pool of warm processes, one job run in one, and the plan of their
  sandboxes (probed in their forks).
"""

from kernelflow.sandbox.command import isolation_prefix, run_confined
from kernelflow.sandbox.confine import (
    ALLOW_NETWORK_ENV,
    SandboxUnavailable,
    confine,
    confine_candidate,
    confine_judge,
    network_opted_in,
    probe_isolation,
)
from kernelflow.sandbox.filesystem import PROBE_PREFIX
from kernelflow.sandbox.limits import apply_limits
from kernelflow.sandbox.namespaces import unshare_pid_namespace
from kernelflow.sandbox.probe import (
    SandboxPlan,
    detect_device,
    device_env,
    isolation_status,
    network_prefixes,
    sandbox_plan,
    visible_gpus,
)
from kernelflow.sandbox.process import (
    ProcessOutcome,
    isolated_module,
    run_process,
    sandbox_env,
)
from kernelflow.sandbox.warm import (
    WarmKey,
    WarmProcessLost,
    discard_warm_process,
    run_in_warm_process,
    shutdown_warm_processes,
    warm_process_for,
    warm_sandbox_plan,
)
from kernelflow.sandbox.warm_server import serve

__all__ = [
    "ALLOW_NETWORK_ENV",
    "PROBE_PREFIX",
    "ProcessOutcome",
    "SandboxPlan",
    "SandboxUnavailable",
    "WarmKey",
    "WarmProcessLost",
    "apply_limits",
    "confine",
    "confine_candidate",
    "confine_judge",
    "detect_device",
    "device_env",
    "discard_warm_process",
    "isolated_module",
    "isolation_prefix",
    "isolation_status",
    "network_opted_in",
    "network_prefixes",
    "probe_isolation",
    "run_confined",
    "run_in_warm_process",
    "run_process",
    "sandbox_env",
    "sandbox_plan",
    "serve",
    "shutdown_warm_processes",
    "unshare_pid_namespace",
    "visible_gpus",
    "warm_process_for",
    "warm_sandbox_plan",
]
