"""The tasks of daemons running elsewhere: ``kernelflow submit`` (and ``--wait``),
``status`` and ``cancel``."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

import msgspec

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import CONDUCTOR_ROLE
from kernelflow.actors.readmodel_client import NoAnswer, query_status, status_rows
from kernelflow.cli.commands.options import add_connection_options
from kernelflow.cli.commands.submission import (
    add_task_options,
    refuse_broken_reference,
    refuse_unoffered_backend,
    refuse_unpublishable,
    submit_command,
)
from kernelflow.events import subjects
from kernelflow.events.model import CancelTask
from kernelflow.host.exits import EXIT_FAILED, EXIT_OK, UsageError, WaitTimeout, exit_code_for
from kernelflow.host.runtime import (
    connected,
    follow_tasks,
    hosting,
    no_host,
    request_reply,
)
from kernelflow.host.settings import Settings
from kernelflow.host.stopping import interruptible
from kernelflow.offline.sources import EventFilter, LiveSource, metrics_of, say_quarantined
from kernelflow.progress import for_terminal
from kernelflow.projections.render import (
    describe,
    fork_tree,
    row_speedup_text,
    summary,
    unknown_kinds_note,
)
from kernelflow.projections.task_state import fold


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser("submit", help="publish a task for the daemons and print its id")
    add_task_options(submit)
    add_connection_options(submit)
    submit.add_argument("--wait", action="store_true", help="follow the task until it is over")
    submit.add_argument(
        "--samples", type=int, default=1, help="submit N rollouts of the task as one group"
    )
    submit.add_argument("--group", help="group id (default: a new one per submission)")
    submit.set_defaults(func=cmd_submit)

    status = subparsers.add_parser("status", help="state of one task, or of every task in the log")
    status.add_argument("task_id", nargs="?")
    status.add_argument("--json", action="store_true")
    add_connection_options(status)
    status.set_defaults(func=cmd_status)

    cancel = subparsers.add_parser("cancel", help="cancel a task that is still running")
    cancel.add_argument("task_id")
    cancel.add_argument("--reason", default="cancelled by user")
    cancel.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a daemon")
    add_connection_options(cancel)
    cancel.set_defaults(func=cmd_cancel)


def cmd_submit(args: argparse.Namespace, settings: Settings) -> int:
    if args.samples < 1:
        raise UsageError(f"--samples {args.samples}: expected at least 1")
    command = submit_command(args, settings.workflow_dirs)
    commands = [command]
    if args.samples > 1:
        # Rollouts of one task submitted together form one GRPO group.
        group = command.group_id or f"g-{uuid.uuid4().hex[:12]}"
        commands = [
            msgspec.structs.replace(command, task_id=f"{command.task_id}-{i}", group_id=group)
            for i in range(1, args.samples + 1)
        ]
        refuse_unpublishable(commands[-1], "submit these samples")  # the longest id
    task_ids = [c.task_id or "" for c in commands]
    if args.reference_check:
        refuse_broken_reference(command, settings.data_dir, own_verifier=False)
    with interruptible(), connected(settings) as bridge:
        refuse_unoffered_backend(bridge, command)
        for c in commands:
            bridge.call(bridge.commands.publish(c, subjects.SUBMIT))
            print(c.task_id, flush=True)
        if not args.wait:
            return EXIT_OK
        # Samples run side by side: each line says whose it is.
        label = (lambda e: f"[{e.task_id}] ") if len(commands) > 1 else (lambda e: "")
        states = follow_tasks(
            bridge, task_ids, lambda e: print(label(e) + describe(e), flush=True), args.timeout
        )
    rows = [summary(states[t]) for t in task_ids]
    if len(rows) > 1:
        print()
        print(samples_table(rows, commands[0].group_id or ""))
    return max(exit_code_for(row["status"]) for row in rows)


def samples_table(rows: list[dict[str, Any]], group: str) -> str:
    """The outcome of each sample of one submit, and of the group."""
    width = max(len("task"), *(len(row["task_id"]) for row in rows))
    lines = [f"{'task':<{width}}  {'status':<10} {'steps':>5}  {'verifications':<24} reason"]
    for row in rows:
        checks = " → ".join(row["verifications"]) or "none"
        lines.append(
            f"{row['task_id']:<{width}}  {row['status']:<10} {row['steps']:>5}  {checks:<24} "
            f"{row['reason'] or ''}"
        )
    succeeded = sum(row["status"] == "success" for row in rows)
    lines.append(f"group {group}: {succeeded} of {len(rows)} samples succeeded")
    return "\n".join(lines)


def say_waiting(instance: str, position: int, end: int) -> None:
    print(
        f"kernelflow: the read model of {instance} is catching up (at {position:,} of "
        f"{end:,}); waiting while it moves",
        file=sys.stderr,
        flush=True,
    )


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    with connected(settings) as bridge:
        if args.task_id:  # one task: its own events (exact, with its final code)
            history = bridge.call(bridge.log.read_task(args.task_id))
            if note := history.quarantine.note():
                print(note, file=sys.stderr)
            if not history.events:
                raise not_in_the_log(bridge, args.task_id)
            rows = [summary(fold(args.task_id, history.events))]
            if note := unknown_kinds_note(history.events):
                print(note, file=sys.stderr)
        else:  # every task: a daemon's read model, or a fold of the log here
            try:
                asking = query_status(bridge.requests, bridge.log, on_catching_up=say_waiting)
                rows = bridge.call(asking).rows
            except NoAnswer as exc:
                print(f"kernelflow: {exc}; folding the log here", file=sys.stderr)
                log_source = LiveSource(bridge, EventFilter())
                log_source.progress = for_terminal(sys.stderr)  # a long log takes a while
                rows = status_rows(metrics_of(log_source))
                say_quarantined(log_source)
        queued_while_no_daemon(bridge, rows)
    if args.json:
        print(json.dumps(rows if not args.task_id else rows[0]))
        return EXIT_OK
    for depth, row in fork_tree(rows):
        reason = row["reason"] or ""
        if origin := row.get("forked_from"):  # a fork, under its original (if listed)
            reason = f"[fork of {origin['task_id']} at event {origin['at']}] {reason}"
        name = "  " * depth + ("└ " if depth else "") + row["task_id"]
        print(f"{name:<28} {row['status']:<10} steps={row['steps']:<3} {reason}")
    if args.task_id:
        print(task_details(rows[0]))
    return EXIT_OK


def queued_while_no_daemon(bridge: Bridge, rows: list[dict[str, Any]]) -> None:
    """A task not over is ``queued``, not ``running``, while no daemon runs a conductor
    for it (a command's own daemon runs one for its own tasks alone): nothing advances it
    until one starts (README.md, "CLI")."""
    running = [row for row in rows if row["status"] == "running"]
    if not running:
        return
    hosts = hosting(bridge, CONDUCTOR_ROLE, [row["task_id"] for row in running])
    for row in running:
        if (why := hosts.why_not(row["task_id"])) is not None:
            row["status"] = "queued"
            row["reason"] = row["reason"] or f"{why}: it waits for one (kernelflow daemon)"


def task_details(row: dict[str, Any]) -> str:
    """What ``status TASK_ID`` shows under the task's line: its verifications, and the
    final code in full (the kernel the task ended with)."""
    checks = " → ".join(row["verifications"]) or "none"
    if row.get("verdict") == "pass":
        checks += f"\nspeedup: {row_speedup_text(row)}"
    rechecks = "".join(
        f"\nchecked again by verifier {r['verifier_version']}: {r['verdict']}"
        for r in row.get("rechecks", ())
    )
    code = row["final_code"]
    if not code:
        return f"verifications: {checks}{rechecks}\nfinal code: none"
    lines = len(code.splitlines())
    return f"verifications: {checks}{rechecks}\nfinal code ({lines} lines):\n{code.rstrip()}"


def not_in_the_log(bridge: Bridge, task_id: str) -> Exception:
    """What ``status`` says of a task with no events: queued, maybe, when submits wait in
    the command stream (a work queue that a publisher may count but not read: which
    submits wait there is not known here)."""
    queued = bridge.call(bridge.commands.waiting(subjects.SUBMIT))
    if not queued:
        return UsageError(f"no task {task_id}: not in the log, and no submit waits in the queue")
    why = no_host(bridge, CONDUCTOR_ROLE, task_id) or "a daemon is up: it takes them in turn"
    # Exit 3, as a cancel that waits for a conductor: not done yet, not wrong.
    return WaitTimeout(
        f"task {task_id} is not in the log yet: {queued} submit(s) wait in the queue for a "
        f"conductor ({why}); if it is one of them, it starts when a daemon takes it"
    )


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: expected seconds > 0")
    command = CancelTask(task_id=args.task_id, reason=args.reason)
    refuse_unpublishable(command, "cancel this task")
    with connected(settings) as bridge:
        asked = bridge.spawn(request_reply(bridge, command, subjects.CANCEL, args.timeout))
        try:
            # Whether a daemon runs a conductor, asked while the cancel is on its way (a
            # second): with none, waiting cannot help, and the cancel stays queued.
            why = no_host(bridge, CONDUCTOR_ROLE, args.task_id)
            if why is not None and not asked.done():
                raise WaitTimeout(
                    f"cancel of {args.task_id} queued: {why}; it applies when a daemon "
                    "starts (kernelflow daemon)"
                )
            # A conductor is up: the request gives up itself at --timeout (then None).
            answer = asked.result(timeout=args.timeout + 5)
        finally:
            asked.cancel()
    if answer is None:
        # A daemon running a conductor answered the pings, and none answered the cancel.
        raise WaitTimeout(
            f"no answer within {args.timeout:g}s, though a daemon runs a conductor: the "
            "cancel stays queued and applies once a conductor takes it (its log says why "
            "none has)"
        )
    if not answer.get("ok"):
        error = str(answer.get("error"))
        if error == f"no task {args.task_id}":  # a wrong id: bad input, as for `status`
            raise UsageError(error)
        print(f"kernelflow: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(f"cancelled {args.task_id}")
    return EXIT_OK
