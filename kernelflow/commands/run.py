"""``kernelflow run``: one task, start to end, in this process: an embedded NATS (unless
``--nats-url``), a daemon hosting every role the workflow names, and the kernel and
trajectory written under ``--out``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import CONDUCTOR_ROLE
from kernelflow.commands.options import (
    LLM_HELP,
    add_agent_llm_options,
    add_connection_options,
    add_gpus_option,
)
from kernelflow.commands.submission import (
    add_task_options,
    refuse_broken_reference,
    submit_command,
)
from kernelflow.events import subjects
from kernelflow.events.model import Event, SubmitTask
from kernelflow.offline.files import atomic_output
from kernelflow.projections.task_state import TaskState, fold
from kernelflow.projections.trajectory import build_trajectory
from kernelflow.render import describe, summary
from kernelflow.rollout import rollout_complete
from kernelflow.runtime import (
    cancel_abandoned,
    connected,
    follow_task,
    noting_other_tasks,
    start_daemon,
    stopped_after,
    terminated_as_interrupted,
)
from kernelflow.settings import Settings
from kernelflow.usage import WaitTimeout, exit_code_for
from kernelflow.workflows.loader import parse_workflow
from kernelflow.workflows.model import VERIFIER


def register(subparsers: Any) -> None:
    run = subparsers.add_parser(
        "run", help="one-shot: embedded NATS + in-process daemon, run one task"
    )
    add_task_options(run)
    add_connection_options(run)
    run.add_argument("--llm", help=LLM_HELP)
    add_agent_llm_options(run)
    add_gpus_option(run)
    run.add_argument("--json", action="store_true", help="print one JSON object at the end")
    run.add_argument("--out", default="kernelflow-runs", help="where the kernel and trajectory go")
    run.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    command = submit_command(args)
    started = time.monotonic()

    def progress(event: Event) -> None:
        if not args.json:
            print(f"[{time.monotonic() - started:6.1f}s] {describe(event)}", flush=True)

    with terminated_as_interrupted(), connected(settings) as bridge:
        own = noting_other_tasks({command.task_id or ""}, "this run")
        daemon = start_daemon(bridge, settings, roles_for(command), {}, own)
        with stopped_after(daemon):
            if args.reference_check and VERIFIER in roles_for(command):
                # This run's own verifier checks the task: what it cannot check is refused
                # now, before an LLM call is spent (its warm worker is this check's too).
                refuse_broken_reference(command, settings.data_dir, own_verifier=True)
            try:
                bridge.call(bridge.log.publish_command(command, subjects.SUBMIT))
                if not args.json:
                    print(f"task {command.task_id}: {args.task} ({command.workflow} workflow)")
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
        events = read_back(bridge, state.task_id)
    result = summary(state) | write_outputs(state, Path(args.out), events)
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    return exit_code_for(result["status"])


def read_back(bridge: Bridge, task_id: str, wait_s: float = 10.0) -> list[Event]:
    """The task's events once what follows its finish (its rewards) is in: the daemon
    stopped, but a reward it was appending as the finish arrived may still be on its way
    (a loaded machine), and the trajectory written now must be the one the log replays."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            events = list(bridge.call(bridge.log.read_task(task_id)).events)
        except TimeoutError:
            # A loaded server answered late: the task is over and its outputs still to be
            # written, so ask again while there is time rather than lose them.
            if time.monotonic() > deadline:
                raise
            continue
        if rollout_complete(fold(task_id, events)) or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def roles_for(command: SubmitTask) -> tuple[str, ...]:
    """The conductor and every agent the task's workflow names: all that `run` must host."""
    assert command.workflow_yaml is not None
    workflow = parse_workflow(command.workflow_yaml, command.workflow)
    return (CONDUCTOR_ROLE, *workflow.agents)


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
    print(f"replay:   kernelflow replay --task {result['task_id']}")
