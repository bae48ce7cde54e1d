"""``kernelflow workflow validate|show``: check a workflow, or describe it."""

from __future__ import annotations

import argparse
from typing import Any

from kernelflow.actors.kinds.check import check_agents
from kernelflow.render import workflow_text
from kernelflow.settings import Settings
from kernelflow.usage import EXIT_OK, UsageError
from kernelflow.workflows.loader import WorkflowError, load_workflow
from kernelflow.workflows.model import VERIFIER


def register(subparsers: Any) -> None:
    workflow = subparsers.add_parser("workflow", help="check or describe a workflow")
    workflow.add_argument("action", choices=["validate", "show"])
    workflow.add_argument("workflow", help="predefined workflow name or a YAML file")
    workflow.set_defaults(func=cmd_workflow)


def cmd_workflow(args: argparse.Namespace, settings: Settings) -> int:
    try:
        workflow, _ = load_workflow(args.workflow)
        check_agents(workflow)
    except WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    if args.action == "validate":
        print(f"{args.workflow}: ok ({len(workflow.agents)} agents, max_step {workflow.max_step})")
        if workflow.start_agent == VERIFIER:
            # Such a task is refused without code to check: say so before it is submitted.
            print(f"{args.workflow}: starts with the verifier: submit it with --candidate FILE")
    else:
        print(workflow_text(workflow))
    return EXIT_OK
