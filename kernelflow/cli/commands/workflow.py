"""``kernelflow workflow list|validate|show``: the workflows there are, check one, or
describe one (docs/workflows.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelflow.actors.kinds.check import check_agents
from kernelflow.host.exits import EXIT_OK, UsageError
from kernelflow.host.settings import Settings
from kernelflow.projections.render import workflow_text
from kernelflow.projections.rewards import UnknownReward, check_reward_names
from kernelflow.workflows.extend import annotated
from kernelflow.workflows.loader import (
    WorkflowError,
    catalogue,
    extend,
    find_workflow,
    load_workflow,
)
from kernelflow.workflows.model import VERIFIER, Workflow


def register(subparsers: Any) -> None:
    workflow = subparsers.add_parser(
        "workflow", help="list the workflows, check one, or describe one"
    )
    workflow.add_argument("action", choices=["list", "validate", "show"])
    workflow.add_argument(
        "workflow", nargs="?", help="a workflow's name (predefined or named) or a YAML file"
    )
    workflow.add_argument("--json", action="store_true", help="list: one JSON object")
    workflow.set_defaults(func=cmd_workflow)


def cmd_workflow(args: argparse.Namespace, settings: Settings) -> int:
    dirs = settings.workflow_dirs
    if args.action == "list":
        return list_workflows(settings, args.json)
    if not args.workflow:
        raise UsageError(f"kernelflow workflow {args.action}: name a workflow or a YAML file")
    try:
        workflow, _ = load_workflow(args.workflow, dirs)
        check_agents(workflow)
        check_reward_names(workflow.rewards)
        extended = extend(find_workflow(args.workflow, dirs), dirs)
    except (WorkflowError, UnknownReward) as exc:
        raise UsageError(str(exc)) from exc
    if args.action == "validate":
        over = f", over {' over '.join(extended.bases)}" if extended.bases else ""
        print(
            f"{args.workflow}: ok ({len(workflow.agents)} agents, max_step "
            f"{workflow.max_step}{over})"
        )
        if workflow.start_agent == VERIFIER:
            # Such a task is refused without code to check: say so before it is submitted.
            print(f"{args.workflow}: starts with the verifier: submit it with --candidate FILE")
        return EXIT_OK
    print(workflow_text(workflow))
    print(_details(workflow))
    if extended.bases:
        print(f"\n{extended.source} over {' over '.join(extended.bases)}, merged:")
        print(annotated(extended.document, extended.origins))
    return EXIT_OK


def _details(workflow: Workflow) -> str:
    """What the summary leaves out: the agents that choose what follows them, the
    verifier's field of each agent that hands over to it, and the training settings."""
    lines = []
    for spec in workflow.agents.values():
        if spec.route_by is not None:
            choices = ", ".join(f"{value} → {agent}" for value, agent in spec.route_by.values)
            lines.append(
                f"  {spec.name} chooses what follows by its {spec.route_by.field}: {choices}"
            )
        if VERIFIER in spec.possible_next and spec.code_field:
            lines.append(f"  the verifier checks {spec.name}'s {spec.code_field}")
    verifier = workflow.agents.get(VERIFIER)
    if verifier is not None and verifier.built_in:
        lines.append(
            "  verifier: built in: finishes on a pass, goes back to the agent whose code "
            "failed on a failure"
        )
    if workflow.trainable_agents is not None:
        lines.append(f"  trainable agents: {', '.join(sorted(workflow.trainable_agents))}")
    if workflow.rewards:
        lines.append(f"  rewards: {', '.join(workflow.rewards)}")
    return "\n".join(lines)


def list_workflows(settings: Settings, as_json: bool) -> int:
    """The predefined workflows and the named ones found, with where each comes from, a
    predefined one's other names, and why a named one cannot be used, if it cannot."""
    dirs = settings.workflow_dirs
    listed = catalogue(dirs)
    invalid = {
        w.source: why
        for w in listed
        if w.source != "predefined" and (why := _unusable(w.source, dirs)) is not None
    }
    if as_json:
        entries = [
            {
                "name": w.name,
                "source": w.source,
                "shadowed_by": w.shadowed_by,
                "aliases": list(w.aliases),
                "invalid": invalid.get(w.source),
            }
            for w in listed
        ]
        print(json.dumps({"workflows": entries, "searched": [str(d) for d in dirs]}))
        return EXIT_OK
    width = max(len(w.name) for w in listed)
    for w in listed:
        notes = [f"also: {', '.join(w.aliases)}"] if w.aliases else []
        if w.shadowed_by:
            notes.append(f"not used: {w.shadowed_by} has this name")
        if w.source in invalid:
            notes.append(f"invalid: {invalid[w.source]}")
        print(f"{w.name:<{width}}  {w.source}" + "".join(f"  ({n})" for n in notes))
    print(f"named workflows (NAME.yaml) are looked for in: {', '.join(map(str, dirs))}")
    return EXIT_OK


def _unusable(source: str, dirs: Sequence[Path]) -> str | None:
    """Why the workflow file ``source`` would be refused, in one line (its first problem,
    and how many more ``workflow validate`` lists); None: it can be used."""
    try:
        workflow, _ = load_workflow(source, dirs)
        check_agents(workflow)
        check_reward_names(workflow.rewards)
    except (WorkflowError, UnknownReward) as exc:
        lines = str(exc).splitlines()
        problems = lines[1:] if len(lines) > 1 else lines
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return problems[0].removeprefix(f"{source}: ") + more
    return None
