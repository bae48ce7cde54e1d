"""Options that several subcommands take, spelt and explained the same way in each."""

from __future__ import annotations

import argparse
import math
from collections.abc import MutableMapping
from typing import Any

from kernelflow.host.exits import UsageError
from kernelflow.offline.since import SINCE_HELP
from kernelflow.verification.policy import DEFAULT_POLICY, policy_names

LLM_HELP = (
    "LLM provider (env KF_LLM): anthropic[:MODEL] | openai:URL[#MODEL] | scripted:FILE | "
    "record:DIR:SPEC | replay:DIR[#position]; default anthropic when ANTHROPIC_API_KEY is set"
)

# Per-agent LLM flags: each is the command-line spelling of a KF_AGENT_<AGENT>_* variable
# (docs/llm.md), so one agent's provider or sampling can be changed for a single run.
AGENT_FLAGS = {
    "agent_llm": ("LLM", str),
    "agent_temperature": ("TEMPERATURE", float),
    "agent_max_tokens": ("MAX_TOKENS", int),
}


def apply_agent_flags(args: argparse.Namespace, env: MutableMapping[str, str]) -> None:
    """Set ``KF_AGENT_<AGENT>_*`` in ``env`` from ``--agent-llm/--agent-temperature/
    --agent-max-tokens AGENT=VALUE`` (flags beat the environment and the config file)."""
    for attr, (suffix, kind) in AGENT_FLAGS.items():
        flag = "--" + attr.replace("_", "-")
        for item in getattr(args, attr, None) or []:
            agent, sep, value = item.partition("=")
            if not sep or not agent or not value:
                raise UsageError(f"{flag} {item!r}: expected AGENT=VALUE")
            try:
                kind(value)
            except ValueError:
                raise UsageError(f"{flag} {item!r}: {value!r} is not {kind.__name__}") from None
            env[f"KF_AGENT_{agent.upper().replace('-', '_')}_{suffix}"] = value


def add_agent_llm_options(p: argparse.ArgumentParser) -> None:
    metavars = {"agent_llm": "AGENT=SPEC", "agent_temperature": "AGENT=T"}
    for attr, (suffix, _) in AGENT_FLAGS.items():
        p.add_argument(
            "--" + attr.replace("_", "-"),
            action="append",
            metavar=metavars.get(attr, "AGENT=N"),
            help=f"one agent's {suffix.lower().replace('_', ' ')} "
            f"(= KF_AGENT_<AGENT>_{suffix}; repeatable)",
        )


# The TLS options, and what each names (the attribute is the flag's, with '_' for '-').
TLS_FLAGS = {
    "tls-ca": "CA certificates to trust for the NATS server's (default: the system's)",
    "tls-cert": "client certificate for NATS servers that verify clients (mutual TLS)",
    "tls-key": "the client certificate's key, where it is not in --tls-cert's file",
}


def positive_seconds(raw: str) -> float:
    """An argparse ``type``: a number of seconds above 0 (an option's error otherwise)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, not {raw!r}") from None
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, not {raw}")
    return value


def add_connection_options(p: argparse.ArgumentParser, *, daemon: bool = False) -> None:
    """``--nats-url``, ``--creds``, TLS and the data dir; for a command (not a
    ``daemon``: it has ``--nats-give-up``) how long to wait for NATS."""
    p.add_argument(
        "--nats-url",
        help="NATS server to use, or a comma-separated list of a cluster's (env KF_NATS_URL); "
        "default: embedded",
    )
    p.add_argument(
        "--data-dir",
        help="the embedded NATS server's store (the log) and keys, and the verifiers' caches "
        "(env KF_DATA_DIR; default ~/.local/share/kernelflow)",
    )
    if not daemon:
        p.add_argument(
            "--connect-timeout",
            type=positive_seconds,
            metavar="SECONDS",
            help="fail when no NATS server answers within this long (env KF_CONNECT_TIMEOUT; "
            "default 10; a server given by URL that refuses connections: after 2)",
        )
    p.add_argument(
        "--creds",
        metavar="FILE",
        help="NATS credentials: an nkey seed file (kernelflow creds) or a .creds file "
        "(env KF_NATS_CREDS); default: none, or the data dir's for the embedded server",
    )
    for flag, what in TLS_FLAGS.items():
        env = "KF_NATS_" + flag.upper().replace("-", "_")
        p.add_argument(f"--{flag}", metavar="FILE", help=f"{what} (env {env})")


def add_devices_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--devices",
        metavar="SPEC",
        help="what the verifiers own: 'all' (one verifier per GPU here; on a node without "
        "one, CPU verifiers), GPUs by index or UUID (0,1), or 'cpu:N' (N CPU verifiers, "
        "each on its own cores; 'cpu': as many as --pool verifier=N) (env KF_DEVICES)",
    )
    p.add_argument("--gpus", metavar="LIST", help="the older name of --devices (env KF_GPUS)")


def add_verifier_version_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verifier-version",
        type=int,
        metavar="N",
        help="judge kernels by their newest check by a verifier no newer than N (0: as "
        "recorded before versions were) instead of their newest check (kernelflow reverify)",
    )


class _GivenTask(argparse.Action):
    """``TASK_ID`` and its older spelling ``--task ID``: either sets ``task`` (the
    positional, only when given); both, naming different tasks, are an error."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, *_: Any
    ) -> None:
        if values is None:
            return
        if namespace.task not in (None, values):
            parser.error(f"two tasks named: {namespace.task!r} and {values!r}")
        namespace.task = values


def add_source_options(p: argparse.ArgumentParser, *, one_task: bool = False) -> None:
    """Where an offline tool reads (the live log, or ``--from FILE``) and what of it
    (kernelflow.offline.sources.filter_from reads these): the task as ``TASK_ID`` (or
    ``--task ID``, as ``status`` and ``cancel`` take it too); ``one_task``: a task is
    all it reads (the command checks that one is named)."""
    p.add_argument(
        "task",
        nargs="?",
        metavar="TASK_ID",
        action=_GivenTask,
        help="the task" + ("" if one_task else ": only this task"),
    )
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="read an exported log file instead of the live log",
    )
    p.add_argument("--task", metavar="ID", action=_GivenTask, help="the same as TASK_ID")
    if not one_task:
        p.add_argument("--group", help="only the tasks of this group")
        p.add_argument("--workflow", help="only tasks run with this workflow")
        p.add_argument("--bench", metavar="RUN", help="only the candidates of this bench run")
        p.add_argument(
            "--start-seq", type=int, help="start at this stream sequence (file: record number)"
        )
        p.add_argument("--since", metavar="TIME", help=SINCE_HELP)
    add_connection_options(p)


POLICY_HELP = (
    "the verifier's strictness policy: strict (the default: the candidate's own kernels do "
    "all the computing, in full precision) or kernelbench (KernelBench's default: PyTorch "
    "compute and lower precision pass with warnings); docs/verifier.md#policies"
)


def add_policy_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default=DEFAULT_POLICY, choices=policy_names(), help=POLICY_HELP)
