"""``kernelflow run``: one task, start to end, in this process: an embedded NATS (unless
``--nats-url``), a daemon hosting every role the workflow names, and the kernel and
trajectory written under ``--out``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.cli.commands.options import (
    LLM_HELP,
    add_agent_llm_options,
    add_connection_options,
    add_devices_option,
)
from kernelflow.cli.commands.submission import (
    add_task_options,
    refuse_broken_reference,
    submit_command,
)
from kernelflow.events import subjects
from kernelflow.events.model import AgentDispatched, Event, SubmitTask
from kernelflow.host.exits import WaitTimeout, exit_code_for
from kernelflow.host.runtime import (
    cancel_abandoned,
    connected,
    follow_task,
    noting_other_tasks,
    start_daemon,
    stopped_after,
)
from kernelflow.host.settings import Settings
from kernelflow.host.stopping import interruptible
from kernelflow.offline.files import atomic_output
from kernelflow.progress import Ticker, ticker_for
from kernelflow.projections.render import describe, summary
from kernelflow.projections.task_state import TaskState
from kernelflow.projections.trajectory import build_trajectory
from kernelflow.task import read_back, roles_for
from kernelflow.workflows.model import VERIFIER


def register(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run", help="one-shot: embedded NATS + in-process daemon, run one task"
    )
    add_task_options(run)
    add_connection_options(run)
    run.add_argument("--llm", help=LLM_HELP)
    add_agent_llm_options(run)
    add_devices_option(run)
    run.add_argument(
        "--serve-others",
        action="store_true",
        help="also work on tasks others left queued in the store (default: this task only)",
    )
    run.add_argument("--json", action="store_true", help="print one JSON object at the end")
    run.add_argument(
        "--out",
        default="kernelflow-runs",
        help="where the kernel and trajectory go: OUT/TASK_ID/ (default ./kernelflow-runs)",
    )
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    command = submit_command(args, settings.workflow_dirs)
    started = time.monotonic()
    # On a terminal, what the run waits on, ticking every second (kernelflow/progress.py).
    ticker = ticker_for(sys.stderr, shown=not args.json)

    def progress(event: Event) -> None:
        if not args.json:
            line = f"[{time.monotonic() - started:6.1f}s] {describe(event)}"
            ticker.above(lambda: print(line, flush=True))
        if isinstance(event, AgentDispatched):
            ticker.say(f"step {event.step}: {event.agent} at work")

    with ticker, interruptible():
        ticker.say(preparing(settings))
        with connected(settings) as bridge:
            state, events = run_on(args, settings, bridge, command, progress, ticker)
    result = summary(state) | write_outputs(state, Path(args.out), events)
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    return exit_code_for(result["status"])


def preparing(settings: Settings) -> str:
    """What a run does before its task starts: the embedded server's first start in a
    data dir makes its keys and streams."""
    if settings.nats_url is not None:
        return f"connecting to {settings.nats_url}"
    if not settings.nats_store.exists():
        return f"starting the embedded NATS server (first use of {settings.data_dir})"
    return "starting the embedded NATS server"


def run_on(
    args: argparse.Namespace,
    settings: Settings,
    bridge: Bridge,
    command: SubmitTask,
    progress: Callable[[Event], None],
    ticker: Ticker,
) -> tuple[TaskState, list[Event]]:
    """``cmd_run`` once connected: the task's end and its events."""
    ticker.say("starting this run's daemon (its verifier readies a sandbox)")
    ours = {command.task_id or ""}
    serving = args.serve_others
    own = noting_other_tasks(bridge, ours, "this run", serving=serving)
    only = None if serving else ours
    daemon = start_daemon(bridge, settings, roles_for(command), {}, own, only=only)
    with stopped_after(daemon):
        if args.reference_check and VERIFIER in roles_for(command):
            # This run's own verifier checks the task: what it cannot check is refused
            # now, before an LLM call is spent (its warm process is this check's too).
            ticker.say("checking that the task's reference runs here")
            refuse_broken_reference(command, settings.data_dir, own_verifier=True)
        try:
            ticker.say("waiting for the conductor")
            bridge.call(bridge.commands.publish(command, subjects.SUBMIT))
            if not args.json:
                said = f"task {command.task_id}: {args.task} ({command.workflow_name} workflow)"
                ticker.above(lambda: print(said, flush=True))
            # This process's own daemon hosts every role the workflow names.
            state = follow_task(
                bridge, command.task_id or "", progress, args.timeout, explain_waits=False
            )
        except (KeyboardInterrupt, WaitTimeout) as exc:
            reason = (
                "kernelflow run interrupted"
                if isinstance(exc, KeyboardInterrupt)
                else f"kernelflow run --timeout {args.timeout:g}s passed"
            )
            cancel_abandoned(bridge, [command.task_id or ""], reason)
            raise
    return state, read_back(bridge, state.task_id)


def write_outputs(state: TaskState, out_dir: Path, events: list[Event]) -> dict[str, str]:
    target = out_dir / state.task_id  # made by atomic_output
    paths = {}
    finished = state.finished
    # Whole files or none: a run killed while writing leaves no half kernel to be taken
    # for the real one (the log has both: ``kernelflow replay --view trajectory`` shows them).
    if finished is not None and finished.final_code:
        kernel = target / "kernel.py"
        with atomic_output(kernel) as partial:
            partial.write_text(finished.final_code, encoding="utf-8")
        paths["kernel_path"] = str(kernel)
    trajectory = target / "trajectory.json"
    with atomic_output(trajectory) as partial:
        partial.write_text(json.dumps(build_trajectory(state.task_id, events).to_dict(), indent=2))
    paths["trajectory_path"] = str(trajectory)
    return paths


def print_summary(result: dict[str, Any]) -> None:
    print()
    print(f"status:   {result['status']}  ({result['reason']})")
    checks = " → ".join(result["verifications"]) or "none"
    print(f"steps:    {result['steps']}   verifications: {checks}")
    if result.get("kernel_path"):
        print(f"kernel:   {result['kernel_path']}")
    print(f"trajectory: {result['trajectory_path']}")
    print(f"replay:   kernelflow replay {result['task_id']}")
