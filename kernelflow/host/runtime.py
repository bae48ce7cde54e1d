"""Running tasks from a process of one's own: connect to NATS, host a daemon in-process,
follow a task's events until it is over, and cancel what the process leaves unfinished.

Shared by the commands (kernelflow.cli.commands) and the ``Rollout`` API (kernelflow.rollout);
it knows nothing of either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import CONDUCTOR_ROLE, Daemon, DaemonConfig
from kernelflow.actors.health_pings import (
    HealthResponder,
    daemon_describer,
    new_daemon_id,
    ping_daemons,
)
from kernelflow.actors.worker import Message, task_of
from kernelflow.events import subjects
from kernelflow.events.codec import MalformedMessage, decode_command
from kernelflow.events.errors import TransportError
from kernelflow.events.log import StreamConfig, TaskHistory
from kernelflow.events.model import CancelTask, Command, Event, SubmitTask, ends_task
from kernelflow.host.exits import UsageError, WaitTimeout
from kernelflow.host.faults import ENV as FAULT_ENV
from kernelflow.host.faults import crash_after
from kernelflow.host.settings import DeviceSpec, Settings
from kernelflow.llm import (
    EndpointUnreachable,
    ProviderRouter,
    ProviderSpecError,
    default_llm_spec,
    make_provider,
)
from kernelflow.projections.task_state import TaskState, apply, fold
from kernelflow.sandbox import visible_gpus
from kernelflow.verification.engine import detect_device
from kernelflow.workflows.model import VERIFIER

# The name these warnings have always carried on stderr, from when this was the CLI's.
log = logging.getLogger("kernelflow.cli")

# How long a followed task may wait on one step before the user is told why, if no daemon
# hosts the role that step needs.
UNTAKEN_HINT_AFTER_S = 5.0
# How long a command goes on trying a NATS server given by URL that refuses every
# connection (nothing listens there) before it fails.
REFUSED_S = 2.0
# How long a command that gives up on its tasks lets its actors finish what they hold.
ABANDONED_STOP_WAIT_S = 2.0


# --------------------------------------------------------------------------- wiring


AppendHook = Callable[[Event, TaskHistory], None]


@contextlib.contextmanager
def connected(
    settings: Settings,
    on_give_up: Callable[[], None] | None = None,
    after_append: AppendHook | None = None,
) -> Iterator[Bridge]:
    """A bridge to the NATS of ``settings``. With ``on_give_up`` (a daemon), the give-up
    bound applies at start (no server answers) and later (the connection stays lost),
    after which ``on_give_up`` is called. Otherwise (a command) no server answering
    within the connect timeout fails the start, and so does a server given by URL that
    refuses the connection for ``REFUSED_S``: nothing listens there. (The embedded server
    refuses only between its owner's exit and its successor's start.) ``after_append``
    sees each event this process records (a daemon's telemetry), on the bridge loop."""
    with settings.nats() as (url, auth):
        streams = StreamConfig(replicas=settings.replicas)
        hook = _with_failpoint(after_append)
        give_up_s = settings.nats_give_up_s if on_give_up is not None else None
        bridge = Bridge(
            url, streams, after_append=hook, auth=auth, give_up_s=give_up_s, on_give_up=on_give_up
        )
        if on_give_up is not None:
            bridge.start(timeout_s=give_up_s)
        else:
            refused_s = REFUSED_S if settings.nats_url else None
            bridge.start(timeout_s=settings.connect_timeout_s, refused_s=refused_s)
        try:
            yield bridge
        finally:
            bridge.stop()


def _with_failpoint(observe: AppendHook | None) -> AppendHook | None:
    """``observe``, then the fault tests' failpoint (``KF_FAULT_CRASH_AFTER``) if it is set:
    the crash comes last, so that nothing runs after it."""
    crash = crash_after(os.environ.get(FAULT_ENV))
    if crash is None:
        return observe

    def then_crash(event: Event, history: TaskHistory) -> None:
        if observe is not None:
            observe(event, history)
        crash(event)

    return then_crash


def start_daemon(
    bridge: Bridge,
    settings: Settings,
    roles: tuple[str, ...],
    pools: dict[str, int],
    on_message: Callable[[str, Message], None] | None = None,
    *,
    llm_must_answer: bool = True,
    only: set[str] | Callable[[str], bool] | None = None,
) -> Daemon:
    """A daemon hosting ``roles`` on ``bridge``, its LLM endpoints reached first
    (``reach_llm``): one that cannot be used ends a command at once (EndpointUnreachable)
    and is said on the log of a daemon (not ``llm_must_answer``), which waits for it.
    ``only``: a command's own daemon, serving these tasks alone (``own_work``) and saying
    so when pinged (``answer_pings``)."""
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
    if llm is not None:
        reach_llm(bridge, llm, [r for r in roles if r != VERIFIER], must_answer=llm_must_answer)
    verifier = settings.verifier_config()
    gpus: tuple[str, ...] = ()
    cpus = 0
    if VERIFIER in roles and settings.devices is not None:
        gpus, cpus = verifier_devices(settings.devices, pools.get(VERIFIER), verifier.python)
    config = DaemonConfig(
        roles=roles,
        pool_sizes=pools,
        ack_wait_s=settings.ack_wait_s,
        llm=llm,
        verifier=verifier,
        gpus=gpus,
        cpu_verifiers=cpus,
        on_message=on_message,
        serves=None if only is None else own_work(only),
    )
    if VERIFIER in roles:
        warn_unseen_gpus(config)
        try:
            config.verifier_configs()
        except ValueError as exc:  # more CPU verifiers than cores
            raise UsageError(f"--devices {settings.devices}: {exc}") from None
    daemon = Daemon(bridge, config).start()
    if only is not None:
        answer_pings(bridge, daemon, only)
    return daemon


def answer_pings(
    bridge: Bridge, daemon: Daemon, ours: set[str] | Callable[[str], bool]
) -> HealthResponder:
    """A command's own daemon answers health pings too, naming the asked tasks that are
    its own (``kernelflow.actors.health_pings``), for as long as the command's connection is
    open: so ``status`` and ``cancel`` in another terminal tell a task this command runs
    from one that waits for a daemon."""
    roles = daemon.config.roles
    pools = {r: daemon.config.pool_size(r) for r in roles}
    describe = daemon_describer(new_daemon_id(), bridge.nats_url, roles, pools, daemon.config.llm)
    return HealthResponder(bridge, describe, serves=_task_test(ours)).start()


def verifier_devices(
    devices: DeviceSpec,
    pool: int | None,
    python: str,
    visible: Callable[[str], tuple[str, ...]] = visible_gpus,
) -> tuple[tuple[str, ...], int]:
    """The GPUs the verifiers own, one verifier each, and how many CPU verifiers there are
    (each on cores of its own), for ``--devices`` (``pool``: ``--pool verifier=N``, if
    given; ``visible``: the GPUs ``python`` sees here, asked only for ``all``). Said on
    the log where ``all`` found no GPU."""
    if devices.kind == "gpus":
        return devices.gpus, 0
    if devices.kind == "all":
        gpus = visible(python)
        if gpus:
            if pool is not None:
                log.warning(
                    "--devices all: %d GPU(s) here, one verifier each; --pool verifier=%d "
                    "sizes the CPU verifiers of nodes without a GPU, not these",
                    len(gpus),
                    pool,
                )
            log.info("--devices all: one verifier on each GPU here: %s", ", ".join(gpus))
            return gpus, 0
        count = pool or 1
        log.info(
            "--devices all: no GPU here: %d CPU verifier(s), each on cores of its own "
            "(--pool verifier=N for more)",
            count,
        )
        return (), count
    return (), devices.cpus or pool or 1


def reach_llm(
    bridge: Bridge, llm: ProviderRouter, agents: list[str], *, must_answer: bool = True
) -> None:
    """Probe the LLM endpoints these agents use (``ProviderRouter.probe``), on the bridge
    loop whose connections the calls will use: one nothing answers at would fail the first
    call only after its retries (a minute), its reason among their warnings. Raises
    EndpointUnreachable with the URL and why; or, not ``must_answer``, says so on the log."""
    try:
        bridge.call(llm.probe(agents), timeout=60)
    except EndpointUnreachable as exc:
        if must_answer:
            raise
        log.warning("%s; its calls are tried (and retried) as they come", exc)


def warn_unseen_gpus(config: DaemonConfig) -> None:
    """Say at start-up, not at the first verdict, that a configured GPU is not there
    (its verifier will answer every candidate with 'unsupported')."""
    for gpu in config.gpus:
        if detect_device(config.verifier.python, gpu) != "cuda":
            log.warning(
                "--devices: CUDA device %s is not visible here; its verifier will report "
                "every candidate as unsupported",
                gpu,
            )


async def request_reply(
    bridge: Bridge, command: Command, subject: str, timeout_s: float = 30.0
) -> dict[str, Any] | None:
    """Publish a command and wait for the daemon's answer on a private inbox (None: none
    came within ``timeout_s``)."""
    return await bridge.commands.request(command, subject, timeout_s)


# --------------------------------------------------------------------------- following


@dataclass(frozen=True)
class Hosting:
    """Who hosts ``role``, as the daemons' answers to one ping say (a command's own daemon
    only for the tasks it serves: ``kernelflow.actors.health_pings``)."""

    role: str
    answers: list[dict[str, Any]]

    def why_not(self, task_id: str | None = None) -> str | None:
        """Why no daemon takes ``role``'s work (of ``task_id``, when named), if the answers
        say so (None: one is up, just busy)."""
        hosts = [a for a in self.answers if self.role in a.get("roles", ())]
        if any(
            not a.get("own_tasks_only") or (task_id is not None and task_id in a["serving"])
            for a in hosts
        ):
            return None
        if not self.answers:
            return "no daemon answered"
        if hosts:
            return f"only commands host the {self.role} role, each for its own tasks"
        return f"{len(self.answers)} daemon(s) answered, none hosts the {self.role} role"


def hosting(bridge: Bridge, role: str, tasks: Iterable[str] = ()) -> Hosting:
    """Ask the daemons (for a second) who hosts ``role``, and for which of ``tasks``."""
    return Hosting(role, bridge.call(ping_daemons(bridge.requests, 1.0, tasks)))


def no_host(bridge: Bridge, role: str, task_id: str | None = None) -> str | None:
    """``Hosting.why_not`` for ``role`` (and ``task_id``), asked now."""
    return hosting(bridge, role, [task_id] if task_id else ()).why_not(task_id)


def waiting_on(state: TaskState) -> tuple[str, str] | None:
    """What the task waits for and the role that does it: its submit, for a conductor; a
    dispatch no agent has recorded anything for yet, for that agent."""
    if state.events_seen == 0:
        return "submit", CONDUCTOR_ROLE
    d = state.current
    if d is not None and state.last is d.event:
        return d.dispatch_id, d.agent
    return None


def unhosted_hint(
    bridge: Bridge, states: list[TaskState], role: str, waited_s: float, *, named: bool
) -> str | None:
    """Why these tasks have not moved for ``waited_s``, if that is because no daemon hosts
    ``role``, the one each waits for; ``named``: say which task a step is of."""
    hosts = hosting(bridge, role, [s.task_id for s in states])
    reasons = [hosts.why_not(s.task_id) for s in states]
    why = reasons[0] if all(reasons) else None
    if why is None:
        return None
    ids = _listed([s.task_id for s in states])
    if role == CONDUCTOR_ROLE:
        what, start = f"task{'s' * (len(states) > 1)} {ids} not taken", "kernelflow daemon"
    else:
        steps = ", ".join(str(s.step) for s in states)
        of = f" of {ids}" if named else ""
        what = f"step{'s' * (len(states) > 1)} {steps} ({role}){of} not started"
        start = f"kernelflow daemon --roles …,{role}"
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
    """``follow_tasks`` of one task."""
    states = follow_tasks(bridge, [task_id], on_event, timeout_s, explain_waits=explain_waits)
    return states[task_id]


def follow_tasks(
    bridge: Bridge,
    task_ids: list[str],
    on_event: Callable[[Event], None],
    timeout_s: float | None,
    *,
    explain_waits: bool = True,
) -> dict[str, TaskState]:
    """Fold the tasks' events as they are recorded, all at once, until every one is over
    (``on_event`` gets each event as it comes). With ``explain_waits`` (other processes'
    daemons do the work), a step that waits for a role no daemon hosts (the submit, for a
    conductor; a dispatch, for its agent) is explained once on stderr, while still waiting
    (a daemon may start later)."""
    inbox: queue.Queue[Event] = queue.Queue()
    pumps = [bridge.spawn(_tail(bridge, task_id, inbox)) for task_id in task_ids]
    states = {task_id: TaskState(task_id) for task_id in task_ids}
    started = looked = time.monotonic()
    moved = dict.fromkeys(task_ids, started)  # when each task last moved
    deadline = None if timeout_s is None else started + timeout_s
    hinted: set[tuple[str, str]] = set()  # (task, what it waited on) when a hint was considered
    try:
        while unfinished := [s for s in states.values() if s.terminal is None]:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                ids = _listed([s.task_id for s in unfinished])
                many = "s" * (len(unfinished) > 1)
                raise WaitTimeout(f"task{many} {ids} did not finish within {timeout_s:g}s")
            wait = 0.5 if deadline is None else min(deadline - now, 0.5)
            with contextlib.suppress(queue.Empty):
                event = inbox.get(timeout=wait)
                apply(states[event.task_id], event)
                moved[event.task_id] = time.monotonic()
                on_event(event)
            if time.monotonic() - looked < 0.5:
                continue
            looked = time.monotonic()
            for pump in pumps:
                if pump.done():
                    pump.result()  # the log could not be read: raise why
            if explain_waits:
                _explain_waits(bridge, unfinished, moved, hinted, named=len(task_ids) > 1)
    finally:
        for pump in pumps:
            pump.cancel()
    return states


async def _tail(bridge: Bridge, task_id: str, inbox: queue.Queue[Event]) -> None:
    """Put the task's events in ``inbox`` as they are recorded, through its end."""
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
            # The read is closed (its subscription gone) before the last event is handed
            # over: once the caller has it, nothing of this follow is left running.
            inbox.put(event)
            return
        except TimeoutError:
            continue  # a busy machine answered a request late: pick up where we were
        except TransportError as exc:
            # A restarting server: pick up again where we were.
            log.warning("following %s: %r", task_id, exc)
            await asyncio.sleep(0.5)


def _explain_waits(
    bridge: Bridge,
    unfinished: list[TaskState],
    moved: dict[str, float],
    hinted: set[tuple[str, str]],
    *,
    named: bool,
) -> None:
    """Say on stderr, once per waiting step, why tasks that have not moved for
    ``UNTAKEN_HINT_AFTER_S`` wait, if no daemon hosts the role they wait for: one line per
    role, however many tasks wait for it (the samples of one submit)."""
    now = time.monotonic()
    by_role: dict[str, list[TaskState]] = {}
    for state in unfinished:
        waiting = waiting_on(state)
        if waiting is None or (state.task_id, waiting[0]) in hinted:
            continue
        if now - moved[state.task_id] >= UNTAKEN_HINT_AFTER_S:
            hinted.add((state.task_id, waiting[0]))
            by_role.setdefault(waiting[1], []).append(state)
    for role, states in by_role.items():
        waited = min(now - moved[s.task_id] for s in states)
        if hint := unhosted_hint(bridge, states, role, waited, named=named):
            print(f"kernelflow: {hint}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- giving up


def _task_test(ours: set[str] | Callable[[str], bool]) -> Callable[[str], bool]:
    return ours.__contains__ if isinstance(ours, set) else ours


def own_work(ours: set[str] | Callable[[str], bool]) -> Callable[[Message], bool]:
    """A command's own daemon's ``DaemonConfig.serves``: the work of ``ours`` only (task
    ids, or whether a task id is one), and cancels (they call for no LLM, and whoever
    asked wants them applied now). Everything else stays queued for a daemon of its own:
    a task submitted for another model must not be answered by this command's."""
    is_ours = _task_test(ours)

    def serves(message: Message) -> bool:
        if message.source == "event":
            return is_ours(task_of(message.subject))
        try:
            command = decode_command(message.data)
        except MalformedMessage:
            return True  # answered as malformed, as any daemon does
        if isinstance(command, SubmitTask):
            return command.task_id is not None and is_ours(command.task_id)
        return True

    return serves


def noting_other_tasks(
    bridge: Bridge, ours: set[str], runner: str, *, serving: bool = True
) -> Callable[[str, Message], None]:
    """For a command's own daemon (``DaemonConfig.on_message``): say on stderr, once per task,
    when it is handed work for a task that is not one of ``ours`` and is not over
    (``runner`` names the command: "this run"). Such work was queued in the store before
    the command (a crashed run's task, a submit no daemon took yet) or comes from another
    publisher on a shared server. ``serving`` (``--serve-others``): the daemon works on
    it, and says so; else it leaves it queued (``own_work``), and says that. Work left
    over for a task that ended (an earlier command's, cancelled as it stopped) is dropped
    unsaid."""
    noted: set[str] = set()
    looking: set[asyncio.Task[None]] = set()

    async def note_unless_over(role: str, task: str) -> None:
        with contextlib.suppress(Exception):  # unread (NATS gone): said, as before
            history = await bridge.log.read_task(task)
            if fold(task, history.events).terminal is not None:
                return
        if serving:
            said = (
                f"note: {runner}'s daemon also works on task {task} ({role}), queued before "
                f"{runner} or by another publisher; `kernelflow cancel {task}` ends it"
            )
        else:
            said = (
                f"note: task {task} ({role}) waits in the queue, left there by another "
                f"command or publisher; {runner} leaves it to a daemon (`kernelflow daemon` "
                f"runs it, --serve-others lets {runner} work on it, `kernelflow cancel "
                f"{task}` ends it)"
            )
        print(said, file=sys.stderr, flush=True)

    def on_message(role: str, message: Message) -> None:  # on the bridge loop
        task = _task_worked_on(message)
        if task is None or task in ours or task in noted:
            return
        noted.add(task)
        looked = asyncio.get_running_loop().create_task(note_unless_over(role, task))
        looking.add(looked)
        looked.add_done_callback(looking.discard)

    return on_message


def _task_worked_on(message: Message) -> str | None:
    """The task a message does work for: an event's, or a submitted one's (None for other
    commands, a submit that leaves the id to the conductor, a malformed one)."""
    if message.source == "event":
        return task_of(message.subject)
    with contextlib.suppress(MalformedMessage):
        command = decode_command(message.data)
        if isinstance(command, SubmitTask):
            return command.task_id
    return None


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

    answers: list[dict[str, Any] | None] = [None] * len(task_ids)
    why = "no answer"
    if not bridge.connected:  # NATS gone: say what stays unfinished, leave as asked
        why = "NATS is not connected"
    else:
        with contextlib.suppress(Exception):  # NATS gone meanwhile: the same
            answers = bridge.call(cancel_all(), timeout=10)
    cancelled = [t for t, a in zip(task_ids, answers, strict=True) if a and a.get("ok")]
    unanswered = [t for t, a in zip(task_ids, answers, strict=True) if a is None]
    if cancelled:
        print(f"kernelflow: cancelled {_listed(cancelled)}: {reason}", file=sys.stderr)
    if unanswered:
        them = "it" if len(unanswered) == 1 else "them"
        print(
            f"kernelflow: could not cancel {_listed(unanswered)} ({why}): the next daemon "
            f"resumes {them} (kernelflow cancel ID stops one)",
            file=sys.stderr,
        )


def _listed(ids: list[str], shown: int = 5) -> str:
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    return ", ".join(ids[:shown]) + more
