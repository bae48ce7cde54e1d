"""``kernelflow fork TASK_ID --at SEQ``: a new task whose history up to one of the
original's events is the original's, reused as recorded, continued from there (in this
process as ``run`` does, or by the daemons with ``--detach``). docs/workflows.md,
"Forking a task"."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelflow.cli.commands.options import (
    LLM_HELP,
    add_connection_options,
    positive_seconds,
)
from kernelflow.host.exits import EXIT_OK, UsageError, WaitTimeout, exit_code_for
from kernelflow.host.settings import Settings
from kernelflow.verification.backends import backend_names
from kernelflow.verification.policy import policy_names

if TYPE_CHECKING:
    from kernelflow.actors.bridge import Bridge
    from kernelflow.events.model import Event


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "fork", help="a new task from one of a task's events, its history reused as recorded"
    )
    p.add_argument("task_id", help="the task to fork")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--at",
        type=int,
        metavar="SEQ",
        help="keep the history through the last step that ended at or before event SEQ",
    )
    where.add_argument(
        "--after-step", type=int, metavar="N", help="keep the history through step N"
    )
    p.add_argument("--workflow", help="go on with this workflow (name or YAML file)")
    p.add_argument("--llm", help=f"go on with this LLM (this command's daemon). {LLM_HELP}")
    p.add_argument(
        "--policy",
        choices=policy_names(),
        help="go on under this verifier policy (default: the original's)",
    )
    p.add_argument("--backend", choices=backend_names(), help="go on with this kernel backend")
    p.add_argument("--task-id", dest="new_id", help="the fork's id (default: a new one)")
    p.add_argument(
        "--detach",
        action="store_true",
        help="record the fork and leave it to the running daemons (no daemon here)",
    )
    p.add_argument("--timeout", type=positive_seconds, help="give up waiting after SECONDS")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument(
        "--out",
        default="kernelflow-runs",
        help="where the kernel and trajectory go: OUT/TASK_ID/ (default ./kernelflow-runs)",
    )
    add_connection_options(p)
    p.set_defaults(func=cmd_fork)


def cmd_fork(args: argparse.Namespace, settings: Settings) -> int:
    from kernelflow.cli.commands.run import print_summary, write_outputs
    from kernelflow.fork import ForkChanges, ForkError, plan_fork
    from kernelflow.host.runtime import (
        cancel_abandoned,
        connected,
        follow_task,
        start_daemon,
        stopped_after,
    )
    from kernelflow.host.stopping import interruptible
    from kernelflow.projections.render import describe, summary
    from kernelflow.task import fork_roles, new_id_for, read_back
    from kernelflow.workflows.loader import WorkflowError

    if args.detach and args.llm:
        raise UsageError("--llm is the LLM of this command's daemon: with --detach there is none")
    new_id = new_id_for(args.new_id)
    changes = ForkChanges(
        args.workflow, args.policy, args.backend, args.llm, settings.workflow_dirs
    )
    started = time.monotonic()

    def progress(event: Event) -> None:
        if not args.json:
            print(f"[{time.monotonic() - started:6.1f}s] {describe(event)}", flush=True)

    with interruptible(), connected(settings) as bridge:
        plan = plan_fork(bridge.log, args.task_id, new_id, at=args.at,
                         after_step=args.after_step, changes=changes)  # fmt: skip
        try:
            planned = bridge.call(plan)
        except (ForkError, WorkflowError) as exc:
            raise UsageError(str(exc)) from exc
        forked, differ = planned.events, planned.versions_differ
        at = forked[-1].seq
        head = {"task_id": new_id, "forked_from": args.task_id, "at": at, "versions_differ": differ}
        if not args.json:
            print(f"task {new_id}: forked from {args.task_id} at event {at}", flush=True)
            if differ:
                print(f"  goes on with other versions: {'; '.join(differ)}", flush=True)
        if args.detach:
            _record(bridge, forked)
            print(json.dumps(head | {"status": "running"}) if args.json else new_id)
            return EXIT_OK
        daemon = start_daemon(bridge, settings, fork_roles(forked), {}, only={new_id})
        with stopped_after(daemon):
            _record(bridge, forked)
            try:
                state = follow_task(bridge, new_id, progress, args.timeout, explain_waits=False)
            except (KeyboardInterrupt, WaitTimeout):
                cancel_abandoned(bridge, [new_id], "kernelflow fork abandoned")
                raise
        events = read_back(bridge, new_id)
    result = summary(state) | write_outputs(state, Path(args.out), events) | head
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    return exit_code_for(result["status"])


def _record(bridge: Bridge, forked: list[Event]) -> None:
    from kernelflow.fork import ForkError, record_fork

    try:
        bridge.call(record_fork(bridge.log, forked))
    except ForkError as exc:  # the id is in use
        raise UsageError(str(exc)) from exc
