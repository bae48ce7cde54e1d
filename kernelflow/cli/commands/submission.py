"""What ``run`` and ``submit`` share: the task options and the SubmitTask they make,
checked before anything is published.

What can be known before a task is published is refused then (exit 2), so that no LLM
call is spent on a task no candidate can pass: its file, its workflow, a backend no
verifier here offers, and a reference that fails on the shapes the verifier would check
(:func:`refuse_broken_reference`: run once in the verifier's sandbox, on this machine, and
remembered for that task source in the data dir).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
from collections.abc import Sequence
from pathlib import Path

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.health_pings import ping_daemons
from kernelflow.cli.commands.options import add_policy_option, positive_seconds
from kernelflow.events.codec import MalformedMessage, checked_command
from kernelflow.events.model import Command, SubmitTask
from kernelflow.host.exits import UsageError
from kernelflow.projections.rewards import UnknownReward
from kernelflow.task import kernel_task
from kernelflow.verification.backends import DEFAULT_BACKEND, backend_names
from kernelflow.verification.engine import VERIFIER_VERSION, check_reference, offered_backends
from kernelflow.verification.taskfile import TaskFileError, check_task_source
from kernelflow.workflows.loader import WorkflowError


def add_task_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "task",
        help="task file in KernelBench format (class Model, get_inputs, get_init_inputs)",
    )
    p.add_argument(
        "--workflow",
        default="default",
        help="a workflow: predefined (kernelflow workflow list), named (NAME.yaml in the "
        "current directory or KF_WORKFLOWS_DIR) or a YAML file",
    )
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=backend_names())
    add_policy_option(p)
    p.add_argument("--candidate", help="existing ModelNew module to start from (verifier_only)")
    p.add_argument("--task-id", help="task id to use (letters, digits, _ and -)")
    p.add_argument(
        "--deadline",
        type=positive_seconds,
        help="seconds the task may take; checked at every decision",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=None,
        help="give up waiting after this many seconds",
    )
    p.add_argument(
        "--no-reference-check",
        dest="reference_check",
        action="store_false",
        help="publish without first checking, on this machine, that the task's reference "
        "runs (for a reference that needs a device only the verifier nodes have)",
    )


def read_task_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read task file: {exc}") from exc


def submit_command(args: argparse.Namespace, workflow_dirs: Sequence[Path] = ()) -> SubmitTask:
    """The task the options describe; ``workflow_dirs``: where a named workflow is found.
    A task file that is no KernelBench task is refused here (statically: nothing in it
    runs), before anything starts or is published: no daemon would take it."""
    source = read_task_file(args.task)
    try:
        check_task_source(source, args.task)
    except TaskFileError as exc:
        raise UsageError(str(exc)) from exc
    candidate = read_task_file(args.candidate) if getattr(args, "candidate", None) else None
    try:
        # Refused here, before anything is published: structure, kinds, tools, rewards.
        command = kernel_task(
            name=Path(args.task).stem,
            source=source,
            workflow=args.workflow,
            dirs=workflow_dirs,
            backend=args.backend,
            policy=args.policy,
            candidate=candidate,
            task_id=args.task_id,
            deadline_s=args.deadline,
            group_id=getattr(args, "group", None),
        )
    except (WorkflowError, UnknownReward) as exc:
        raise UsageError(str(exc)) from exc
    refuse_unpublishable(command, "submit this task")
    return command


def refuse_broken_reference(command: SubmitTask, data_dir: Path, *, own_verifier: bool) -> None:
    """A usage error when the task's reference fails where the verifier would run it
    (checked once per task source, backend and verifier version: a success is remembered
    under ``data_dir``); nothing for a prompt task. ``own_verifier``: this process's
    verifier checks the task (``run``), so a backend this machine cannot run is refused
    too; otherwise (``submit``) the check is skipped where it cannot run here."""
    if command.prompt is not None:
        return
    key = hashlib.sha256(
        f"{VERIFIER_VERSION}\0{command.backend}\0{command.task_source}".encode()
    ).hexdigest()
    checked = data_dir / "checked-references" / key
    if checked.exists():
        return
    report = check_reference(command.task_source, backend=command.backend)
    if report.verdict == "task_error":
        raise UsageError(
            f"task {command.task_name}: {report.summary} (checked on this machine's "
            f"{report.device or 'device'}; --no-reference-check publishes it anyway)"
        )
    if report.verdict == "unsupported" and own_verifier:
        offered = ", ".join(offered_backends(report.device)) or "none"
        raise UsageError(
            f"task {command.task_name}: {report.summary}; this machine's verifier offers: {offered}"
        )
    if report.passed:
        with contextlib.suppress(OSError):  # a read-only data dir only costs a re-check
            checked.parent.mkdir(parents=True, exist_ok=True)
            checked.write_text(report.summary + "\n")


# How long ``submit`` listens for the running daemons' answers before publishing.
_PING_WINDOW_S = 0.3


def refuse_unoffered_backend(bridge: Bridge, command: SubmitTask) -> None:
    """A usage error when daemons with ready verifiers answer and none of them offers the
    task's backend (a CUDA task where every verifier runs on the CPU). Nothing is refused
    where none answers within a moment, or one is still warming up: the task then waits
    in the queue for a verifier that can take it."""
    if command.prompt is not None:
        return
    answers = bridge.call(ping_daemons(bridge.requests, _PING_WINDOW_S))
    verifiers = [v for a in answers for v in (a.get("verifier") or {}).values()]
    if not verifiers or any("backends" not in v for v in verifiers):
        return
    offered = sorted({str(b) for v in verifiers for b in v["backends"]})
    if command.backend not in offered:
        raise UsageError(
            f"task {command.task_name}: no running verifier offers backend "
            f"{command.backend!r} (offered: {', '.join(offered) or 'none'})"
        )


def refuse_unpublishable(command: Command, what: str) -> None:
    """A usage error (``cannot <what>: …``, naming the field) for a command a daemon would
    refuse as malformed: refused here, before it is published to nobody listening."""
    try:
        checked_command(command)
    except MalformedMessage as exc:
        why = str(exc).removeprefix("not a kernelflow command: ")
        raise UsageError(f"cannot {what}: {why}") from exc
