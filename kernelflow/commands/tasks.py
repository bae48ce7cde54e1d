"""The tasks of daemons running elsewhere: ``kernelflow submit`` (and ``--wait``),
``status`` and ``cancel``."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import uuid
from typing import Any

import msgspec

from kernelflow.actors.daemon import CONDUCTOR_ROLE
from kernelflow.actors.readmodel import NoAnswer, query_status, status_rows
from kernelflow.actors.verifier.taskfile import TaskFileError, check_task_source
from kernelflow.commands.options import add_connection_options
from kernelflow.commands.submission import add_task_options, refuse_unpublishable, submit_command
from kernelflow.events import subjects
from kernelflow.events.model import CancelTask
from kernelflow.offline.sources import EventFilter, LiveSource, metrics_of, say_quarantined
from kernelflow.progress import for_terminal
from kernelflow.projections.task_state import fold
from kernelflow.render import describe, summary, unknown_kinds_note
from kernelflow.runtime import UNTAKEN_HINT_AFTER_S, connected, follow_task, no_host, request_reply
from kernelflow.settings import Settings
from kernelflow.usage import EXIT_FAILED, EXIT_OK, UsageError, WaitTimeout, exit_code_for


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
    command = submit_command(args)
    # A publisher that does not wait would never hear of a rejection: refuse the task file
    # here (statically: nothing in it runs), before anything is published.
    try:
        check_task_source(command.task_source, command.task_name)
    except TaskFileError as exc:
        raise UsageError(str(exc)) from exc
    commands = [command]
    if args.samples > 1:
        # Rollouts of one task submitted together form one GRPO group.
        group = command.group_id or f"g-{uuid.uuid4().hex[:12]}"
        commands = [
            msgspec.structs.replace(command, task_id=f"{command.task_id}-{i}", group_id=group)
            for i in range(1, args.samples + 1)
        ]
        refuse_unpublishable(commands[-1], "submit these samples")  # the longest id
    codes = []
    with connected(settings) as bridge:
        for c in commands:
            bridge.call(bridge.log.publish_command(c, subjects.SUBMIT))
            print(c.task_id, flush=True)
        if not args.wait:
            return EXIT_OK
        for c in commands:
            state = follow_task(
                bridge, c.task_id or "", lambda e: print(describe(e), flush=True), args.timeout
            )
            codes.append(exit_code_for(summary(state)["status"]))
    return max(codes)


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
                raise UsageError(f"no task {args.task_id} in the log")
            rows = [summary(fold(args.task_id, history.events))]
            if note := unknown_kinds_note(history.events):
                print(note, file=sys.stderr)
        else:  # every task: a daemon's read model, or a fold of the log here
            try:
                asking = query_status(bridge.nc, bridge.log.jetstream, on_catching_up=say_waiting)
                rows = bridge.call(asking).rows
            except NoAnswer as exc:
                print(f"kernelflow: {exc}; folding the log here", file=sys.stderr)
                log_source = LiveSource(bridge, EventFilter())
                log_source.progress = for_terminal(sys.stderr)  # a long log takes a while
                rows = status_rows(metrics_of(log_source))
                say_quarantined(log_source)
    if args.json:
        print(json.dumps(rows if not args.task_id else rows[0]))
    else:
        for row in rows:
            reason = row["reason"] or ""
            print(f"{row['task_id']:<28} {row['status']:<10} steps={row['steps']:<3} {reason}")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    command = CancelTask(task_id=args.task_id, reason=args.reason)
    refuse_unpublishable(command, "cancel this task")
    with connected(settings) as bridge:
        asked = bridge.spawn(request_reply(bridge, command, subjects.CANCEL, args.timeout))
        try:
            answer = asked.result(timeout=min(UNTAKEN_HINT_AFTER_S, args.timeout))
        except concurrent.futures.TimeoutError:
            if (why := no_host(bridge, CONDUCTOR_ROLE)) is not None:
                # Waiting longer cannot help; the cancel stays queued for the next daemon.
                raise WaitTimeout(
                    f"no answer after {UNTAKEN_HINT_AFTER_S:g}s: {why}. The cancel waits in the "
                    "queue and applies when a daemon starts (kernelflow daemon)"
                ) from None
            answer = asked.result(timeout=args.timeout + 5)
        finally:
            asked.cancel()
    if answer is None:
        raise WaitTimeout(f"no daemon answered within {args.timeout:g}s (is one running?)")
    if not answer.get("ok"):
        print(f"kernelflow: {answer.get('error')}", file=sys.stderr)
        return EXIT_FAILED
    print(f"cancelled {args.task_id}")
    return EXIT_OK
