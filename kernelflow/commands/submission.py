"""What ``run`` and ``submit`` share: the task options and the SubmitTask they make,
checked before anything is published."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from kernelflow.actors.backends import DEFAULT_BACKEND, backend_names
from kernelflow.actors.kinds.check import check_agents
from kernelflow.events.codec import MalformedMessage, checked_command
from kernelflow.events.model import Command, SubmitTask
from kernelflow.usage import UsageError
from kernelflow.workflows.loader import (
    WorkflowError,
    check_candidate,
    parse_workflow,
    resolve_workflow,
)


def add_task_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "task",
        help="task file in KernelBench format (class Model, get_inputs, get_init_inputs)",
    )
    p.add_argument("--workflow", default="default", help="predefined workflow name or a YAML file")
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=backend_names())
    p.add_argument("--candidate", help="existing ModelNew module to start from (verifier_only)")
    p.add_argument("--task-id", help="task id to use (letters, digits, _ and -)")
    p.add_argument(
        "--deadline", type=float, help="seconds the task may take; checked at every decision"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="give up waiting after this many seconds"
    )


def read_task_file(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read task file: {exc}") from exc


def submit_command(args: argparse.Namespace) -> SubmitTask:
    source = read_task_file(args.task)
    try:
        workflow_name, workflow_yaml = resolve_workflow(args.workflow)
        # Refuse it here, before anything is published: structure, kinds, tools.
        workflow = parse_workflow(workflow_yaml, workflow_name, source=args.workflow)
        check_agents(workflow)
        check_candidate(workflow, has_candidate=bool(getattr(args, "candidate", None)))
    except WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    candidate = read_task_file(args.candidate) if getattr(args, "candidate", None) else None
    command = SubmitTask(
        task_id=args.task_id or f"t-{uuid.uuid4().hex[:16]}",
        task_name=Path(args.task).stem,
        task_source=source,
        workflow=workflow_name,
        workflow_yaml=workflow_yaml,
        backend=args.backend,
        candidate_code=candidate,
        deadline_s=args.deadline,
        group_id=getattr(args, "group", None),
    )
    refuse_unpublishable(command, "submit this task")
    return command


def refuse_unpublishable(command: Command, what: str) -> None:
    """A usage error (``cannot <what>: …``, naming the field) for a command a daemon would
    refuse as malformed: refused here, before it is published to nobody listening."""
    try:
        checked_command(command)
    except MalformedMessage as exc:
        raise UsageError(f"cannot {what}: {exc}") from exc
