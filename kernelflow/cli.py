"""The ``kernelflow`` command.

Exit codes: 0 success; 1 the task ran but did not succeed (failed, cancelled); 2 bad
input (a task file, workflow or option that cannot be used, or a task the daemon
rejected); 3 the wait timed out (or no daemon takes a cancel yet); 130 interrupted; 141
the reader of the output went away (``| head``).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import nats.errors
import nats.js.errors

from kernelflow import agents_cmd, health_cmd, offline_cmd, rollout_cmd, verify_cmd
from kernelflow.actors.bridge import Bridge, NatsUnreachable, safe_url
from kernelflow.actors.daemon import CONDUCTOR_ROLE, DEFAULT_ROLES, Daemon, DaemonConfig
from kernelflow.actors.health import HealthResponder, daemon_describer, new_daemon_id, ping_daemons
from kernelflow.actors.kinds.check import check_agents
from kernelflow.actors.llm import ProviderSpecError, default_llm_spec, make_provider
from kernelflow.actors.readmodel import NoAnswer, ReadModel, query_status, status_rows
from kernelflow.actors.verifier.engine import VerifierConfig, detect_device
from kernelflow.actors.verifier.taskfile import TaskFileError, check_task_source
from kernelflow.actors.worker import Job, task_of
from kernelflow.events import subjects
from kernelflow.events.codec import MalformedMessage, checked_command, decode_command, json_schema
from kernelflow.events.log import StreamSettings
from kernelflow.events.model import CancelTask, Command, Event, SubmitTask, TaskFinished, ends_task
from kernelflow.faults import ENV as FAULT_ENV
from kernelflow.faults import crash_after
from kernelflow.nats_server import NatsServerError
from kernelflow.progress import for_terminal
from kernelflow.projections.task_state import TaskState, apply, fold
from kernelflow.projections.trajectory import build_trajectory
from kernelflow.render import describe, workflow_text
from kernelflow.settings import Settings, SettingsError, parse_gpus
from kernelflow.workflows.loader import (
    WorkflowError,
    is_agent_name,
    load_workflow,
    parse_workflow,
    resolve_workflow,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_TIMEOUT, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE
log = logging.getLogger("kernelflow.cli")

LLM_HELP = (
    "LLM provider (env KF_LLM): anthropic[:MODEL] | openai:URL[#MODEL] | scripted:FILE | "
    "record:DIR:SPEC | replay:DIR[#position]; default anthropic when ANTHROPIC_API_KEY is set"
)


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class CommandFailed(Exception):
    """The command could not finish: printed as one line (why, and what to do), exit 1."""


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


class WaitTimeout(Exception):
    """The task did not finish within the user's --timeout: exit code 3."""


# --------------------------------------------------------------------------- wiring


@contextlib.contextmanager
def connected(settings: Settings) -> Iterator[Bridge]:
    with settings.nats() as url:
        streams = StreamSettings(replicas=settings.replicas)
        bridge = Bridge(url, streams, after_append=crash_after(os.environ.get(FAULT_ENV))).start()
        try:
            yield bridge
        finally:
            bridge.stop()


def start_daemon(
    bridge: Bridge,
    settings: Settings,
    roles: tuple[str, ...],
    pools: dict[str, int],
    on_job: Callable[[str, Job], None] | None = None,
) -> Daemon:
    llm = None
    try:
        spec = settings.llm or default_llm_spec()
        if spec:
            llm = make_provider(spec)
    except ProviderSpecError as exc:
        raise UsageError(str(exc)) from exc
    if llm is None and any(r not in (CONDUCTOR_ROLE, "verifier") for r in roles):
        raise UsageError(
            "no LLM provider: pass --llm (e.g. scripted:examples/scripted/relu.yaml, "
            "anthropic:MODEL, openai:URL), set KF_LLM, or set ANTHROPIC_API_KEY"
        )
    config = DaemonConfig(
        roles=roles,
        pool_sizes=pools,
        ack_wait_s=settings.ack_wait_s,
        llm=llm,
        verifier=VerifierConfig(timeout_s=settings.verify_timeout_s),
        gpus=settings.gpus,
        on_job=on_job,
    )
    if "verifier" in roles:
        warn_unseen_gpus(config)
    return Daemon(bridge, config).start()


def warn_unseen_gpus(config: DaemonConfig) -> None:
    """Say at start-up, not at the first verdict, that a configured GPU is not there
    (its verifier will answer every candidate with 'unsupported')."""
    for gpu in config.gpus:
        if detect_device(config.verifier.python, gpu) != "cuda":
            log.warning(
                "--gpus: CUDA device %s is not visible here; its verifier will report "
                "every candidate as unsupported",
                gpu,
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
        check_agents(parse_workflow(workflow_yaml, workflow_name, source=args.workflow))
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


def roles_for(command: SubmitTask) -> tuple[str, ...]:
    """The conductor and every agent the task's workflow names: all that `run` must host."""
    assert command.workflow_yaml is not None
    workflow = parse_workflow(command.workflow_yaml, command.workflow)
    return (CONDUCTOR_ROLE, *workflow.agents)


# How long a followed task may wait on one step before the user is told why, if no daemon
# hosts the role that step needs.
UNTAKEN_HINT_AFTER_S = 5.0


def no_host(bridge: Bridge, role: str) -> str | None:
    """Why no daemon takes work for ``role``, if the daemons' answers say so (None: a
    daemon hosting it is up, just busy)."""
    answers = bridge.call(ping_daemons(bridge.nc, 1.0))
    if any(role in a.get("roles", ()) for a in answers):
        return None
    if not answers:
        return "no daemon answered"
    return f"{len(answers)} daemon(s) answered, none hosts the {role} role"


def waiting_on(state: TaskState) -> tuple[str, str] | None:
    """What the task waits for and the role that does it: its submit, for a conductor; a
    dispatch no agent has recorded anything for yet, for that agent."""
    if state.events_seen == 0:
        return "submit", CONDUCTOR_ROLE
    d = state.current
    if d is not None and state.last is d.event:
        return d.dispatch_id, d.agent
    return None


def unhosted_hint(bridge: Bridge, state: TaskState, role: str, waited_s: float) -> str | None:
    """Why the task has not moved for ``waited_s``, if that is because no daemon hosts
    ``role``, the one it waits for."""
    why = no_host(bridge, role)
    if why is None:
        return None
    if role == CONDUCTOR_ROLE:
        what, start = f"task {state.task_id} not taken", "kernelflow daemon"
    else:
        what, start = (
            f"step {state.step} ({role}) not started",
            f"kernelflow daemon --roles …,{role}",
        )
    return (
        f"{what} after {waited_s:.0f}s: {why}. It waits in the queue until one does "
        f"(start one: {start}); still waiting…"
    )


def follow_task(
    bridge: Bridge,
    task_id: str,
    on_event: Callable[[Event], None],
    timeout_s: float | None,
    *,
    explain_waits: bool = True,
) -> TaskState:
    """Fold the task's events as they are recorded, until it is over. With
    ``explain_waits`` (other processes' daemons do the work), a step that waits for a
    role no daemon hosts (the submit, for a conductor; a dispatch, for its agent) is
    explained once on stderr, while still waiting (a daemon may start later)."""
    inbox: queue.Queue[Event] = queue.Queue()

    async def tail() -> None:
        position = 1
        while True:
            try:
                reading = bridge.log.read(
                    start_seq=position, subject=subjects.task_events(task_id), follow=True
                )
                async with contextlib.aclosing(reading):
                    async for seq, event in reading:  # a following read ends only here
                        position = seq + 1
                        if ends_task(event):
                            break
                        inbox.put(event)
                # The read is closed (its consumer deleted) before the last event is handed
                # over: once the caller has it, nothing of this follow is left running.
                inbox.put(event)
                return
            except TimeoutError:
                continue  # a busy machine answered a request late: pick up where we were
            except nats.errors.Error as exc:
                # A restarting server: pick up again where we were.
                log.warning("following %s: %r", task_id, exc)
                await asyncio.sleep(0.5)

    pump = bridge.spawn(tail())
    state = TaskState(task_id)
    started = moved = time.monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    hinted: set[str] = set()  # what the task waited on when a hint was considered
    try:
        while state.terminal is None:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                raise WaitTimeout(f"task {task_id} did not finish within {timeout_s:g}s")
            try:
                event = inbox.get(timeout=min(wait, 0.5) if wait is not None else 0.5)
            except queue.Empty:
                if pump.done():
                    pump.result()  # the log could not be read: raise why
                waited = time.monotonic() - moved
                waiting = waiting_on(state) if explain_waits else None
                if waiting and waiting[0] not in hinted and waited >= UNTAKEN_HINT_AFTER_S:
                    hinted.add(waiting[0])
                    if hint := unhosted_hint(bridge, state, waiting[1], waited):
                        print(f"kernelflow: {hint}", file=sys.stderr, flush=True)
                continue
            apply(state, event)
            moved = time.monotonic()
            on_event(event)
    finally:
        pump.cancel()
    return state


def summary(state: TaskState) -> dict[str, Any]:
    end = state.terminal
    status = (
        end.status
        if isinstance(end, TaskFinished)
        else (end.kind.removeprefix("task_") if end else "running")
    )
    finished = state.finished
    return {
        "task_id": state.task_id,
        "status": status,
        "steps": state.step,
        "verdict": finished.verdict if finished else None,
        "speedup": finished.speedup if finished else None,
        "reason": getattr(end, "reason", None),
        "verifications": [v.report.verdict for v in state.verifications],
        "final_code": finished.final_code if finished else None,
        "events": state.events_seen,
    }


def exit_code_for(status: str) -> int:
    return {"success": EXIT_OK, "rejected": EXIT_BAD_INPUT}.get(status, EXIT_FAILED)


def write_outputs(state: TaskState, out_dir: Path, events: list[Event]) -> dict[str, str]:
    target = out_dir / state.task_id  # made by atomic_output
    paths = {}
    finished = state.finished
    # Whole files or none: a run killed while writing leaves no half kernel to be taken
    # for the real one (the log has both: ``kernelflow replay --view trajectory`` shows them).
    if finished is not None and finished.final_code:
        kernel = target / "kernel.py"
        with offline_cmd.atomic_output(kernel) as partial:
            partial.write_text(finished.final_code, encoding="utf-8")
        paths["kernel_path"] = str(kernel)
    trajectory = target / "trajectory.json"
    with offline_cmd.atomic_output(trajectory) as partial:
        partial.write_text(json.dumps(build_trajectory(state.task_id, events).to_dict(), indent=2))
    paths["trajectory_path"] = str(trajectory)
    return paths


# --------------------------------------------------------------------------- commands


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
        # Read back once the daemon stopped: what follows the finish (its rewards) is in.
        events = list(bridge.call(bridge.log.read_task(state.task_id)).events)
    result = summary(state) | write_outputs(state, Path(args.out), events)
    if args.json:
        print(json.dumps(result))
    else:
        print_summary(result)
    return exit_code_for(result["status"])


def noting_other_tasks(ours: set[str], runner: str) -> Callable[[str, Job], None]:
    """For a command's own daemon (``DaemonConfig.on_job``): say on stderr, once per task,
    when it takes work for a task that is not one of ``ours`` (``runner`` names the
    command: "this run"). Such work was queued in the store before the command (a crashed
    run's task, a submit no daemon took yet) or comes from another publisher on a shared
    server; unsaid, it would run unseen, LLM calls and all."""
    noted: set[str] = set()

    def on_job(role: str, job: Job) -> None:
        task = _task_worked_on(job)
        if task is None or task in ours or task in noted:
            return
        noted.add(task)
        print(
            f"note: {runner}'s daemon also works on task {task} ({role}), queued before "
            f"{runner} or by another publisher; `kernelflow cancel {task}` ends it",
            file=sys.stderr,
            flush=True,
        )

    return on_job


def _task_worked_on(job: Job) -> str | None:
    """The task a job does work for: an event's, or a submitted one's (None for other
    commands, a submit that leaves the id to the conductor, a malformed one)."""
    if job.source == "event":
        return task_of(job.subject)
    with contextlib.suppress(MalformedMessage):
        command = decode_command(job.data)
        if isinstance(command, SubmitTask):
            return command.task_id
    return None


@contextlib.contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """Within the block SIGTERM (a ``timeout`` wrapper, a cancelled CI job) ends the command
    as Ctrl-C does, so that it cancels its own tasks instead of dying with them running."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


# How long a command that gives up on its tasks lets its actors finish what they hold.
ABANDONED_STOP_WAIT_S = 2.0


@contextlib.contextmanager
def stopped_after(daemon: Daemon) -> Iterator[None]:
    """Stop a command's own ``daemon`` after the block: at once (``ABANDONED_STOP_WAIT_S``)
    if the block gave up on its tasks (interrupted, out of time), since what the actors
    still do is no longer wanted."""
    wait_s = None
    try:
        yield
    except (KeyboardInterrupt, WaitTimeout):
        wait_s = ABANDONED_STOP_WAIT_S
        raise
    finally:
        daemon.stop(wait_s)


def cancel_abandoned(bridge: Bridge, task_ids: list[str], reason: str) -> None:
    """Cancel the tasks a command started itself and leaves unfinished (interrupted, out
    of time). Left running, they would be resumed in the background, LLM calls and all,
    by the next daemon on the same store (the next ``kernelflow run``)."""

    async def cancel_all() -> list[dict[str, Any] | None]:
        return await asyncio.gather(
            *(
                request_reply(bridge, CancelTask(task_id=t, reason=reason), subjects.CANCEL, 5.0)
                for t in task_ids
            )
        )

    try:
        answers = bridge.call(cancel_all(), timeout=10)
    except Exception:  # NATS gone too: say what stays unfinished, then leave as asked
        answers = [None] * len(task_ids)
    cancelled = [t for t, a in zip(task_ids, answers, strict=True) if a and a.get("ok")]
    unanswered = [t for t, a in zip(task_ids, answers, strict=True) if a is None]
    if cancelled:
        print(f"kernelflow: cancelled {_listed(cancelled)}: {reason}", file=sys.stderr)
    if unanswered:
        them = "it" if len(unanswered) == 1 else "them"
        print(
            f"kernelflow: could not cancel {_listed(unanswered)} (no answer): the next daemon "
            f"resumes {them} (kernelflow cancel ID stops one)",
            file=sys.stderr,
        )


def _listed(ids: list[str], shown: int = 5) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more


def print_summary(result: dict[str, Any]) -> None:
    print()
    print(f"status:   {result['status']}  ({result['reason']})")
    checks = " → ".join(result["verifications"]) or "none"
    print(f"steps:    {result['steps']}   verifications: {checks}")
    if result.get("kernel_path"):
        print(f"kernel:   {result['kernel_path']}")
    print(f"trajectory: {result['trajectory_path']}")
    print(f"replay:   kernelflow replay --task {result['task_id']}")


def cmd_daemon(args: argparse.Namespace, settings: Settings) -> int:
    roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
    if not roles:
        raise UsageError("--roles: name at least one role")
    for role in roles:
        if not is_agent_name(role):
            raise UsageError(
                f"--roles: {role!r} cannot name a role (letters, digits, '_' and '-'; not 'finish')"
            )
    pools = {}
    for item in args.pool:
        role, _, n = item.partition("=")
        if not n.isdigit() or int(n) < 1:
            raise UsageError(f"--pool {item!r}: expected ROLE=N with N ≥ 1")
        if role not in roles:  # a typo would leave the pool its default size, unnoticed
            raise UsageError(
                f"--pool {item!r}: this daemon does not host {role!r} (--roles {','.join(roles)})"
            )
        pools[role] = int(n)
    if settings.gpus and "verifier" in pools:
        raise UsageError("--gpus gives one verifier per device: drop --pool verifier=N")
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        if stop.is_set():  # asked twice: stop now; what actors held is redone from the log
            raise KeyboardInterrupt
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    # Started once asked to stop; covers everything up to the exit (NATS closing included).
    deadline = threading.Timer(settings.stop_deadline_s, _stop_at_once, [settings.stop_deadline_s])
    deadline.daemon = True
    try:
        with connected(settings) as bridge:
            daemon = start_daemon(bridge, settings, roles, pools)
            daemon_id = new_daemon_id()
            # The status read model and the health responder (kernelflow status / health).
            read_model = None if args.no_read_model else ReadModel(bridge, daemon_id).start()
            sizes = {r: daemon.config.pool_size(r) for r in roles}
            describe = daemon_describer(
                daemon_id,
                bridge.nats_url,
                roles,
                sizes,
                daemon.config.llm,
                read_model,
                daemon.warm_ups,
            )
            health = HealthResponder(bridge, describe).start()
            print(
                f"kernelflow daemon on {safe_url(bridge.nats_url)}: roles {', '.join(roles)}",
                flush=True,
            )
            stop.wait()
            deadline.start()
            grace = min(daemon.config.stop_timeout_s, settings.stop_deadline_s)
            print(
                f"shutting down: actors finish what they hold (up to {grace:g}s; the whole stop "
                f"up to {settings.stop_deadline_s:g}s); a second Ctrl-C (or SIGTERM) stops at "
                "once, and the next daemon redoes their work from the log…",
                flush=True,
            )
            health.stop()
            daemon.stop()
            if read_model is not None:
                read_model.stop()
    finally:
        deadline.cancel()
    return EXIT_OK


def _stop_at_once(deadline_s: float) -> None:
    log.warning(
        "the stop did not finish within %gs (KF_STOP_DEADLINE): stopping at once, as on a "
        "second signal; the next daemon redoes whatever was unfinished",
        deadline_s,
    )
    os.kill(os.getpid(), signal.SIGTERM)  # the main thread's handler: KeyboardInterrupt


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
            if not history.events:
                raise UsageError(f"no task {args.task_id} in the log")
            rows = [summary(fold(args.task_id, history.events))]
        else:  # every task: a daemon's read model, or a fold of the log here
            try:
                asking = query_status(bridge.nc, bridge.log.jetstream, on_catching_up=say_waiting)
                rows = bridge.call(asking).rows
            except NoAnswer as exc:
                print(f"kernelflow: {exc}; folding the log here", file=sys.stderr)
                log_source = offline_cmd.LiveSource(bridge, offline_cmd.EventFilter())
                log_source.progress = for_terminal(sys.stderr)  # a long log takes a while
                rows = status_rows(offline_cmd.metrics_of(log_source))
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


async def request_reply(
    bridge: Bridge, command: Command, subject: str, timeout_s: float = 30.0
) -> dict[str, Any] | None:
    """Publish a command and wait for the daemon's answer on a private inbox."""
    inbox = bridge.nc.new_inbox()
    replies = await bridge.nc.subscribe(inbox, max_msgs=1)
    try:
        await bridge.log.publish_command(command, subject, {subjects.REPLY_HEADER: inbox})
        try:
            message = await replies.next_msg(timeout=timeout_s)
        except (nats.errors.TimeoutError, nats.errors.ConnectionClosedError):
            # Closed: the caller stopped waiting (nats-py turns the cancellation into this).
            return None
        answer: dict[str, Any] = json.loads(message.data)
        return answer
    finally:
        with contextlib.suppress(Exception):
            await replies.unsubscribe()


def cmd_workflow(args: argparse.Namespace, settings: Settings) -> int:
    try:
        workflow, _ = load_workflow(args.workflow)
        check_agents(workflow)
    except WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    if args.action == "validate":
        print(f"{args.workflow}: ok ({len(workflow.agents)} agents, max_step {workflow.max_step})")
    else:
        print(workflow_text(workflow))
    return EXIT_OK


def cmd_schema(args: argparse.Namespace, settings: Settings) -> int:
    print(json.dumps(json_schema(events=args.events), indent=2))
    return EXIT_OK


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelflow",
        description="Event-sourced LLM agents that turn PyTorch operators into verified kernels.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log actor activity to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    verify_cmd.register(sub)

    def with_connection(p: argparse.ArgumentParser) -> None:
        p.add_argument("--nats-url", help="NATS server to use (env KF_NATS_URL); default: embedded")
        p.add_argument("--data-dir", help="embedded NATS store and outputs (env KF_DATA_DIR)")

    def with_agent_llm(p: argparse.ArgumentParser) -> None:
        metavars = {"agent_llm": "AGENT=SPEC", "agent_temperature": "AGENT=T"}
        for attr, (suffix, _) in AGENT_FLAGS.items():
            p.add_argument(
                "--" + attr.replace("_", "-"),
                action="append",
                metavar=metavars.get(attr, "AGENT=N"),
                help=f"one agent's {suffix.lower().replace('_', ' ')} "
                f"(= KF_AGENT_<AGENT>_{suffix}; repeatable)",
            )

    def with_gpus(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--gpus",
            metavar="LIST",
            help="CUDA devices for the verifiers, one verifier each, e.g. 0,1 (env KF_GPUS)",
        )

    def with_task(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "task",
            help="task file in KernelBench format (class Model, get_inputs, get_init_inputs)",
        )
        p.add_argument(
            "--workflow", default="default", help="predefined workflow name or a YAML file"
        )
        p.add_argument("--backend", default="triton", choices=["triton", "cuda"])
        p.add_argument("--candidate", help="existing ModelNew module to start from (verifier_only)")
        p.add_argument("--task-id", help="task id to use (letters, digits, _ and -)")
        p.add_argument(
            "--deadline", type=float, help="seconds the task may take; checked at every decision"
        )
        p.add_argument(
            "--timeout", type=float, default=None, help="give up waiting after this many seconds"
        )

    run = sub.add_parser("run", help="one-shot: embedded NATS + in-process daemon, run one task")
    with_task(run)
    with_connection(run)
    run.add_argument("--llm", help=LLM_HELP)
    with_agent_llm(run)
    with_gpus(run)
    run.add_argument("--json", action="store_true", help="print one JSON object at the end")
    run.add_argument("--out", default="kernelflow-runs", help="where the kernel and trajectory go")
    run.set_defaults(func=cmd_run)

    daemon = sub.add_parser("daemon", help="long-running daemon hosting actor pools")
    with_connection(daemon)
    daemon.add_argument(
        "--roles", default=",".join(DEFAULT_ROLES), help="comma-separated roles to host"
    )
    daemon.add_argument(
        "--pool", action="append", default=[], metavar="ROLE=N", help="actors for a role"
    )
    daemon.add_argument("--llm", help=LLM_HELP)
    with_agent_llm(daemon)
    with_gpus(daemon)
    daemon.add_argument(
        "--no-read-model", action="store_true", help="do not keep the status read model here"
    )
    daemon.set_defaults(func=cmd_daemon)

    submit = sub.add_parser("submit", help="publish a task for the daemons and print its id")
    with_task(submit)
    with_connection(submit)
    submit.add_argument("--wait", action="store_true", help="follow the task until it is over")
    submit.add_argument(
        "--samples", type=int, default=1, help="submit N rollouts of the task as one group"
    )
    submit.add_argument("--group", help="group id (default: a new one per submission)")
    submit.set_defaults(func=cmd_submit)

    status = sub.add_parser("status", help="state of one task, or of every task in the log")
    status.add_argument("task_id", nargs="?")
    status.add_argument("--json", action="store_true")
    with_connection(status)
    status.set_defaults(func=cmd_status)

    cancel = sub.add_parser("cancel", help="cancel a task that is still running")
    cancel.add_argument("task_id")
    cancel.add_argument("--reason", default="cancelled by user")
    cancel.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a daemon")
    with_connection(cancel)
    cancel.set_defaults(func=cmd_cancel)

    workflow = sub.add_parser("workflow", help="check or describe a workflow")
    workflow.add_argument("action", choices=["validate", "show"])
    workflow.add_argument("workflow", help="predefined workflow name or a YAML file")
    workflow.set_defaults(func=cmd_workflow)

    schema = sub.add_parser("schema", help="JSON Schema of the commands publishers may send")
    schema.add_argument("--events", action="store_true", help="the events instead")
    schema.set_defaults(func=cmd_schema)
    offline_cmd.register(sub)
    rollout_cmd.register(sub)
    agents_cmd.register(sub)
    health_cmd.register(sub)
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    settings = Settings()
    if getattr(args, "nats_url", None):
        settings.nats_url = args.nats_url
    if getattr(args, "data_dir", None):
        settings.data_dir = Path(args.data_dir)
    if getattr(args, "llm", None):
        settings.llm = args.llm
    if getattr(args, "gpus", None):
        settings.gpus = parse_gpus(args.gpus, "--gpus")
    return settings


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "daemon" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        apply_agent_flags(args, os.environ)
        return int(args.func(args, settings_from(args)))
    except (UsageError, SettingsError, NatsServerError) as exc:
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (NatsUnreachable, CommandFailed) as exc:
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except nats.js.errors.ServiceUnavailableError:
        print(
            "kernelflow: JetStream is not available on this NATS server (kernelflow keeps its "
            "log there: start nats-server with JetStream, e.g. `nats-server -js`)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except nats.errors.Error as exc:
        # The server went away or stopped answering mid-command: one line, not a traceback.
        print(f"kernelflow: NATS failed before the command finished: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except WaitTimeout as exc:
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``kernelflow report | head``): stop quietly, as a tool killed
        # by SIGPIPE would, and keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
