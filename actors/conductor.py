"""The conductor: turns commands into task events and moves tasks along their workflow.

It holds no authority of its own: every decision is ``plan_next(fold(events))``, appended
with optimistic concurrency. Any number of conductors, in any number of daemons, may run
against one log; a conflict just means "someone else moved this task: reload".

Within one daemon, one conductor at a time advances a given task: a trigger for a task
another conductor is advancing is handed to that conductor (``_Claims``), which looks at
the task again when it is done and settles the trigger then, so conductors of one process
never race each other into conflicts. Decisions that need no I/O (a routing decision and
the dispatch it calls for, a finish and its rewards) are planned on top of one another
and appended together: one call into the bridge, where the log records them one after
the other (a crash in between leaves the trigger unacked: the rest is decided again).

One algorithm advances a task, ``advance_claimed``, and it runs on the bridge loop for
both of its callers. Most triggers never reach a conductor thread: the daemon's loop runs
it as they arrive (``advance_on_loop``), as far as no LLM is needed, and hands a
conductor actor what needs one or has failed. An actor (recording a new task, a trigger
the loop handed it) runs it with one call into the bridge, asking its LLM where a
decision needs it.

Commands come from anyone who may publish on ``kf.cmd.>``: each is answered once, at its
first delivery, unless recording it fails (NATS) and it is delivered again. What is wrong
with a command is found by pure checks that would find it again on every delivery: a
command that does not decode (too large, nested too deeply, not the schema), one on
another subject than its kind's, one whose ``KF-Reply`` is not an inbox
(``subjects.reply_refusal``: an answer must never be published into the log) is refused
with an error on ``kf.errors`` (and on its reply subject, where that is one); a task that
fails its checks, however they fail (a ``MemoryError`` of the parser included), is
recorded as rejected. Each refusal is one line in the daemon's log.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.decide import AskLLM, Idle, end_task, fallback_decision, plan_next
from kernelflow.actors.kinds.check import check_agents
from kernelflow.actors.pins import llm_specs, pinned_versions
from kernelflow.actors.prompts import conductor_messages, judge_messages
from kernelflow.actors.worker import (
    Delivery,
    Message,
    Settlement,
    Worker,
    quarantined,
    state_of,
    task_of,
)
from kernelflow.common.redact import scrub
from kernelflow.events import subjects
from kernelflow.events.codec import MalformedMessage, decode_command, decode_event, encode
from kernelflow.events.log import AppendConflict, RecentIds, TaskHistory, numbered_after
from kernelflow.events.model import (
    CancelTask,
    Event,
    SubmitTask,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
)
from kernelflow.llm import budgets_of, is_budget_error
from kernelflow.llm.base import LLMError, LLMProvider, LLMRequest, llm_called
from kernelflow.llm.budget import task_budget_error
from kernelflow.projections.rewards import (
    check_reward_names,
    finish_reward_events,
    judge_failed_event,
    needs_judge,
    pending_reward_events,
)
from kernelflow.projections.task_state import CONDUCTOR, JUDGE, TaskState, fold, workflow_of
from kernelflow.verification.backends import backend
from kernelflow.verification.policy import policy
from kernelflow.verification.taskfile import TaskFileError, check_task_source
from kernelflow.workflows.loader import (
    WorkflowError,
    check_candidate,
    load_workflow,
    parse_workflow,
)
from kernelflow.workflows.model import Workflow

# Each round decides one event (or appends what was decided); a task never needs more
# rounds than this between two agent runs, so hitting it means something is wrong (and
# the trigger is redelivered).
MAX_ROUNDS = 64
log = logging.getLogger("kernelflow.conductor")
# The longest reason (of a rejection, a cancellation) and task name recorded from a
# command: the publisher's text goes into the log for good.
MAX_REASON_CHARS = 2000
_MAX_NAME_CHARS = 200
# Room left in a message for its headers when a new task's event is checked against the
# server's message size limit.
_HEADROOM_BYTES = 4096
# The subject each kind of command is published on (the stream holds every kf.cmd.>).
_COMMAND_SUBJECTS = {SubmitTask: subjects.SUBMIT, CancelTask: subjects.CANCEL}

_ClaimKey = tuple[Bridge, str]


class _Claims:
    """The tasks this process's conductors are advancing, and the triggers handed over
    for each meanwhile (None: "look again", from a conductor with no message to settle).

    A conductor that holds a task's claim advances it, then takes what was handed over,
    advances again from a history that includes those triggers' events, and settles them
    once it has (ack), or on failure (nak): a trigger is never acked before the decision
    it calls for is recorded, so a crash anywhere leaves it to be redelivered.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handed: dict[_ClaimKey, list[Delivery | None]] = {}

    def claim(self, key: _ClaimKey, delivery: Delivery | None) -> bool:
        """True: the caller holds the claim now. False: the task is being advanced and
        ``delivery`` was handed to the conductor advancing it."""
        with self._lock:
            handed = self._handed.get(key)
            if handed is None:
                self._handed[key] = []
                return True
            handed.append(delivery)
            return False

    def next_or_release(self, key: _ClaimKey) -> list[Delivery | None]:
        """What was handed over since the last call; nothing ends the claim."""
        with self._lock:
            handed = self._handed[key]
            if handed:
                self._handed[key] = []
            else:
                del self._handed[key]
            return handed

    def release(self, key: _ClaimKey) -> list[Delivery | None]:
        """End the claim (on failure); what was handed over and not taken yet."""
        with self._lock:
            return self._handed.pop(key, [])


_CLAIMS = _Claims()


# The most recent tasks this process's conductors found over with nothing left to record
# (no judge to ask, no reward missing): nothing can call for a decision on them again.
_SETTLED: RecentIds[_ClaimKey] = RecentIds(100_000)


def settled(bridge: Bridge, task_id: str) -> bool:
    """Whether a conductor of this process found the task over with nothing left to
    record: its triggers still queued call for nothing."""
    return (bridge, task_id) in _SETTLED


class Conductor(Worker):
    role = "conductor"

    def __init__(self, bridge: Bridge, llm: LLMProvider | None) -> None:
        super().__init__(bridge)
        self.llm = llm

    def handle(self, message: Message) -> Settlement:
        if message.source == "command":
            return self.on_command(message)
        self.advance(self.history_at(message))
        return "ack"

    def receive(self, delivery: Delivery) -> None:
        """A trigger (an event that calls for a decision) is advanced by whichever
        conductor of this process holds its task's claim, and settled by it."""
        message = delivery.message
        if message.source != "event":
            super().receive(delivery)
            return
        if quarantined(self.bridge, message):
            delivery.settle("ack")
            return
        key = (self.bridge, task_of(message.subject))
        if not _CLAIMS.claim(key, delivery):
            delivery.release()  # free for other work; the claim holder settles this one
            return
        try:
            self._advance_claimed(key, message, [delivery])
        except Exception as exc:  # the triggers held were settled above
            self.after_failure(message, exc)

    def give_up(self, message: Message, error: str) -> None:
        """A command is answered with the error; a task whose decision failed on every
        delivery ends, failed, with the error as its reason."""
        if message.source == "command":
            self.reply(message, {"ok": False, "error": error}, also_errors=True)
            return
        trigger = decode_event(message.data)
        history = self.read(trigger.task_id)
        for _ in range(MAX_ROUNDS):
            state = state_of(history)
            if state.submitted is None or state.terminal is not None:
                return
            finish = end_task(
                state, _readable_workflow(state), trigger.event_id, "failed", f"conductor {error}"
            )
            ending = [finish, *finish_reward_events(state, finish)]
            ending = numbered_after(history.events, ending)
            history = self.bridge.call(_append_or_reload(self.bridge, history, ending))

    # ------------------------------------------------------------------ commands

    def on_command(self, message: Message) -> Settlement:
        try:
            reply_to = message.headers.get(subjects.REPLY_HEADER)
            if reply_to is not None and (why := subjects.reply_refusal(reply_to)) is not None:
                raise MalformedMessage(f"{subjects.REPLY_HEADER}: {why}")
            command = decode_command(message.data)
            if message.subject != _COMMAND_SUBJECTS[type(command)]:
                raise MalformedMessage(
                    f"a {command.__struct_config__.tag} command on {message.subject[:80]!r}: "
                    f"publish it on {_COMMAND_SUBJECTS[type(command)]}"
                )
        except MalformedMessage as exc:
            why = _one_line(str(exc))
            self.log.warning(
                "refused command %d on %s: %s", message.stream_seq, message.subject, why
            )
            self.reply(message, {"ok": False, "error": str(exc)}, also_errors=True)
            return "ack"  # redelivering a malformed message can never succeed
        if isinstance(command, CancelTask):
            return self.cancel(message, command)
        if isinstance(command, SubmitTask):
            self.submit(message, command)
        return "ack"

    def submit(self, message: Message, command: SubmitTask) -> None:
        """Record the task (or why it is refused) and its first decisions in one append.

        The command is acked only once that append is in, so a conductor that dies before
        leaves it to be redelivered; the retry finds the task in the log (the append of
        its first event expects an empty one) and advances it as it stands. A second
        command for a task id that exists is answered as a duplicate."""
        # Without a publisher-chosen id, derive one from the command's stream position so
        # a redelivered command maps to the same task.
        task_id = command.task_id or f"cmd-{message.stream_seq}"
        first: TaskSubmitted | TaskRejected
        try:
            first = self.accepted(task_id, command, message)
            reply: dict[str, object] = {"ok": True, "task_id": task_id}
        except OSError:
            raise  # reading a workflow file may work on the next delivery
        except Exception as exc:  # the checks are pure: they would fail the same way again
            reason = _refusal(exc)
            why = _one_line(reason)
            self.log.warning("rejected task %s (command %d): %s", task_id, message.stream_seq, why)
            name = _bounded(command.task_name, _MAX_NAME_CHARS)
            first = TaskRejected(
                task_id=task_id, cause=_cause(message), reason=reason, task_name=name
            )
            reply = {"ok": False, "task_id": task_id, "error": reason}
        history = TaskHistory(task_id)
        key = (self.bridge, task_id)
        if _CLAIMS.claim(key, None):  # else another conductor here is advancing that task
            history = self._advance_claimed(key, history, [], first=first)
        if not history.events or history.events[0].cause != first.cause:
            reply = {"ok": True, "task_id": task_id, "duplicate": True}
        self.reply(message, reply)

    def accepted(self, task_id: str, command: SubmitTask, message: Message) -> TaskSubmitted:
        name = command.task_name or task_id
        if command.prompt is None:
            check_task_source(command.task_source, name)
        elif not command.prompt.strip():
            raise TaskFileError(f"{name}: the prompt is empty")
        if command.workflow_yaml is not None:
            workflow = parse_workflow(command.workflow_yaml, command.workflow_name)
            workflow_name, workflow_yaml = command.workflow_name, command.workflow_yaml
        else:
            workflow, workflow_yaml = load_workflow(command.workflow_name)
            workflow_name = workflow.name
        check_agents(workflow)
        check_candidate(workflow, has_candidate=bool(command.candidate_code))
        check_reward_names(command.rewards)
        backend(command.backend)  # raises UnknownBackend: no kernel DSL of that name here
        policy(command.policy)  # raises UnknownPolicy
        submitted = TaskSubmitted(
            task_id=task_id,
            cause=_cause(message),
            task_name=name,
            task_source=command.task_source,
            workflow_name=workflow_name,
            workflow_yaml=workflow_yaml,
            backend=command.backend,
            policy=command.policy,
            group_id=command.group_id or f"g-{uuid.uuid4().hex[:12]}",
            candidate_code=command.candidate_code,
            deadline_s=command.deadline_s,
            metadata=command.metadata,
            prompt=command.prompt,
            reference_answer=command.reference_answer,
            files=command.files,
            rewards=command.rewards,
            prior_kernels=command.prior_kernels,
            verify_limits=command.verify_limits,
            versions=pinned_versions(
                workflow_yaml, command.policy, llm_specs(self.llm, (CONDUCTOR, *workflow.agents))
            ),
        )
        size, limit = len(encode(submitted)), self.bridge.log.max_payload - _HEADROOM_BYTES
        if size > limit:  # the server would refuse to record it, on every delivery
            raise ValueError(f"{name}: the task takes {size} bytes; an event holds {limit}")
        return submitted

    def cancel(self, message: Message, command: CancelTask) -> Settlement:
        """Cancel a running task. One not in the log yet is waited for while a submit
        published before this cancel is unsettled (its submit may be one of them: queued,
        or being recorded by another conductor); once none is, it is in the log or there
        is no such task."""
        pending_checked = False
        while True:
            history = self.read(command.task_id)
            state = state_of(history)
            if state.submitted is None:
                if pending_checked:
                    self.reply(message, {"ok": False, "error": f"no task {command.task_id}"})
                    return "ack"
                if self.earlier_submits_pending(message):
                    if not message.last_delivery:
                        return "soon"  # looked at again when the submits ahead are settled
                    why = f"task {command.task_id} is not in the log yet, and submits queued "
                    why += "before this cancel still wait: cancel it again once it runs"
                    self.reply(message, {"ok": False, "error": why})
                    return "ack"
                # None is pending now, so its submit, if any, was settled, and a command
                # is settled after what it records: a second read sees the task. (The
                # first may have come just before another conductor recorded it.)
                pending_checked = True
                continue
            if state.terminal is not None:
                self.reply(
                    message, {"ok": False, "error": f"task {command.task_id} is already over"}
                )
                return "ack"
            reason = _bounded(scrub(command.reason), MAX_REASON_CHARS)
            cancelled = TaskCancelled(task_id=command.task_id, cause=_cause(message), reason=reason)
            try:
                self.append(history, cancelled)
            except AppendConflict:
                continue
            self.reply(message, {"ok": True, "task_id": command.task_id})
            return "ack"

    def earlier_submits_pending(self, message: Message) -> bool:
        """Whether submits published before this command are still unsettled (the command
        stream is a work queue: a settled command leaves it). Only a submit can make the
        task a cancel is for: waiting on every earlier command instead, a flood of cancels
        of tasks that never existed held each other up for all of their deliveries. (The
        daemon role may read the command stream's messages for this: docs/security.md.)"""
        seq = self.bridge.call(self.bridge.commands.oldest(subjects.SUBMIT))
        return seq is not None and seq < message.stream_seq

    def reply(
        self, message: Message, body: dict[str, object], *, also_errors: bool = False
    ) -> None:
        """Answer on the command's reply subject, if it is an inbox, and on ``kf.errors``
        with ``also_errors``."""
        payload = json.dumps(body).encode()
        reply_to = message.headers.get(subjects.REPLY_HEADER)
        targets = [reply_to] if reply_to and subjects.reply_refusal(reply_to) is None else []
        if also_errors:
            targets.append(subjects.ERRORS)
        for target in targets:
            self.bridge.call(self.bridge.commands.answer(target, payload))

    # ------------------------------------------------------------------ routing

    def advance(self, history: TaskHistory) -> None:
        """Append what the workflow says comes next, until an agent must work or the
        task is over (or leave it to the conductor of this process advancing it now)."""
        key = (self.bridge, history.task_id)
        if _CLAIMS.claim(key, None):
            self._advance_claimed(key, history, [])

    def _advance_claimed(
        self,
        key: _ClaimKey,
        start: TaskHistory | Message,
        held: list[Delivery],
        first: Event | None = None,
    ) -> TaskHistory:
        """``advance_claimed`` for this actor: on the bridge loop (one hand-off for the
        whole advance), asking this conductor's LLM where a decision needs it."""
        return self.bridge.call(
            advance_claimed(self.bridge, key, start, held, first=first, ask=self._answer)
        )

    async def _answer(self, question: Question) -> Event:
        state, plan = question
        if plan is None:  # the judge scores a finished prompt task's answer
            return await self.judge(state)
        return await self.ask(state, workflow_of(state), plan)

    async def judge(self, state: TaskState) -> Event:
        """Ask the judge LLM whether a finished prompt task's answer is right; its
        recorded answer is what the ``judge`` reward reads."""
        finished = state.finished
        assert finished is not None
        if self.llm is None:
            return judge_failed_event(state, "no LLM provider configured")
        request = LLMRequest(
            task_id=state.task_id,
            agent=JUDGE,
            call_index=0,
            messages=judge_messages(state),
        )
        try:
            response = await self.llm.complete(request)
        except LLMError as exc:
            return judge_failed_event(state, scrub(str(exc)))
        return llm_called(request, response, dispatch_id=finished.event_id, cause=finished.event_id)

    async def ask(self, state: TaskState, workflow: Workflow, plan: AskLLM) -> Event:
        """Ask the conductor's LLM to choose; the answer is recorded, then decided on."""
        if self.llm is None:
            return fallback_decision(state, plan, "no LLM provider configured")
        over_budget = task_budget_error(state, budgets_of(self.llm))
        if over_budget is not None:
            return end_task(state, workflow, plan.decision_point, "budget_exceeded", over_budget)
        request = LLMRequest(
            task_id=state.task_id,
            agent=CONDUCTOR,
            call_index=state.llm_calls_by(CONDUCTOR),
            messages=conductor_messages(state, workflow, plan.options, plan.after_agent),
        )
        try:
            response = await self.llm.complete(request)
        except LLMError as exc:
            if is_budget_error(str(exc)):  # the daemon's per-run budget is spent
                return end_task(state, workflow, plan.decision_point, "budget_exceeded", str(exc))
            return fallback_decision(state, plan, scrub(str(exc)))
        return llm_called(
            request, response, dispatch_id=plan.decision_point, cause=plan.decision_point
        )


# Where deciding needs an LLM: the task's state and the conductor's question (None: the
# judge's, on a finished prompt task).
Question = tuple[TaskState, AskLLM | None]


def decided(
    bridge: Bridge, history: TaskHistory, planned: list[Event]
) -> tuple[list[Event], Question | None]:
    """Decide on top of ``history`` and ``planned`` (decided, not appended yet) as far as
    no LLM is needed: the events to append, and the question that stopped it (None: the
    task now waits on an agent, or is over)."""
    task_id = history.task_id
    for _ in range(MAX_ROUNDS):
        state = fold(task_id, (*history.events, *planned))
        if state.submitted is None:
            return planned, None
        if needs_judge(state):
            return planned, (state, None)
        if late := pending_reward_events(state):  # a conductor died after the finish
            planned = [*planned, *numbered_after((*history.events, *planned), late)]
            continue
        if state.terminal is not None:  # over, with nothing left to record
            if not planned:  # as the log holds it: its later triggers need no read
                _SETTLED.add((bridge, task_id))
            return planned, None
        plan = plan_next(state, workflow_of(state), now=time.time())
        if isinstance(plan, Idle):
            return planned, None
        if isinstance(plan, AskLLM):
            return planned, (state, plan)
        decision = [plan.event, *_rewards_for(state, plan.event)]
        planned = [*planned, *numbered_after((*history.events, *planned), decision)]
    raise RuntimeError(f"task {task_id}: no stable state after {MAX_ROUNDS} rounds")


def _rewards_for(state: TaskState, event: Event) -> list[Event]:
    """The outcome rewards that follow a finish (if its conductor dies in between, the
    next visit records them: see ``pending_reward_events``)."""
    return [*finish_reward_events(state, event)] if isinstance(event, TaskFinished) else []


class NeedsLLM(Exception):
    """What comes next needs an LLM, and none may be asked here (the bridge loop)."""


async def advance_claimed(
    bridge: Bridge,
    key: _ClaimKey,
    start: TaskHistory | Message,
    held: list[Delivery],
    *,
    first: Event | None = None,
    ask: Callable[[Question], Awaitable[Event]] | None = None,
) -> TaskHistory:
    """Advance a task whose claim the caller holds, from ``start`` (its history, or the
    trigger to read it through), recording ``first`` first for a new task; then again for
    the triggers handed over meanwhile. Settles the ``held`` triggers and those handed
    over: ack once every decision they call for is recorded, nak on a failure ("soon"
    where an LLM is needed and no ``ask`` given: NeedsLLM is raised). The history it ended
    on. One algorithm for both callers: a conductor actor (``ask``: its LLM) and the
    bridge loop as triggers arrive (``advance_on_loop``, no ``ask``)."""
    settlement: Settlement = "nak"
    try:
        history = await _advance(bridge, await _history_of(bridge, start), ask, first)
        while handed := _CLAIMS.next_or_release(key):
            held.extend(d for d in handed if d is not None)
            history = await _advance(bridge, await _through(bridge, history, handed), ask)
        settlement = "ack"
        return history
    except NeedsLLM:
        settlement = "soon"  # to an actor, which asks
        raise
    finally:
        if settlement != "ack":
            held.extend(d for d in _CLAIMS.release(key) if d is not None)
        for delivery in held:
            delivery.settle(settlement)


async def _advance(
    bridge: Bridge,
    history: TaskHistory,
    ask: Callable[[Question], Awaitable[Event]] | None,
    first: Event | None = None,
) -> TaskHistory:
    """Decide and append until the workflow waits on an agent or the task is over.
    ``first``, a new task's first event, goes first, and only into an empty log. An
    append refused because the task moved on meanwhile is followed by a fresh read and a
    fresh decision."""
    for _ in range(MAX_ROUNDS):
        history, planned = await _plan(bridge, _latest(bridge, history), ask, first)
        if not planned:
            return history
        try:
            return await bridge.log.append(history, planned)
        except AppendConflict:  # ``first`` still goes first into a history of no events
            history = await bridge.log.read_task(history.task_id)
    raise RuntimeError(f"task {history.task_id}: still contended after {MAX_ROUNDS} tries")


async def _plan(
    bridge: Bridge,
    history: TaskHistory,
    ask: Callable[[Question], Awaitable[Event]] | None,
    first: Event | None,
) -> tuple[TaskHistory, list[Event]]:
    """What to append on top of ``history`` (which may grow on the way) up to the next
    wait. What needs no I/O is decided on top of what was decided before it and appended
    with it; before asking an LLM, what was decided is appended first."""
    # A task already in the log (a redelivered or repeated submit) is advanced as it stands.
    planned = [] if first is None or history.events else numbered_after((), [first])
    for _ in range(MAX_ROUNDS):
        planned, question = decided(bridge, history, planned)
        if question is None:
            return history, planned
        if planned:  # an LLM is only asked on what the log holds
            history, planned = await _append_or_reload(bridge, history, planned), []
            continue
        if ask is None:
            raise NeedsLLM(history.task_id)
        state, plan = question
        event = await ask(question)
        if plan is None:  # the judge's answer: recorded, then decided on
            history = await _append_or_reload(bridge, history, [event])
            continue
        planned = numbered_after(history.events, [event, *_rewards_for(state, event)])
    raise RuntimeError(f"task {history.task_id}: no stable state after {MAX_ROUNDS} rounds")


async def _append_or_reload(
    bridge: Bridge, history: TaskHistory, events: Sequence[Event]
) -> TaskHistory:
    try:
        return await bridge.log.append(history, events)
    except AppendConflict:
        return await bridge.log.read_task(history.task_id)  # moved on: decide again


async def _history_of(bridge: Bridge, start: TaskHistory | Message) -> TaskHistory:
    """``start``, or the history of a trigger's task through it (free where this process
    remembers it)."""
    if isinstance(start, TaskHistory):
        return start
    return await bridge.log.history_through(decode_event(start.data), start.stream_seq)


async def _through(
    bridge: Bridge, history: TaskHistory, handed: list[Delivery | None]
) -> TaskHistory:
    """The newest history known that includes the events of the triggers handed over."""
    if (message := _newest_trigger(handed)) is not None:
        history = _newest(history, await _history_of(bridge, message))
    return _latest(bridge, history)


def _latest(bridge: Bridge, history: TaskHistory) -> TaskHistory:
    """``history``, or the one this process remembers for the task if it is newer."""
    return _newest(history, bridge.log.remembered(history.task_id))


def advance_on_loop(
    bridge: Bridge,
    delivery: Delivery,
    spawn: Callable[[Coroutine[Any, Any, None]], object],
    to_actor: Callable[[], None],
) -> bool:
    """On the bridge loop, as a trigger arrives: advance its task right there (``spawn``
    runs the work, which settles the trigger) with ``advance_claimed``, as far as no LLM
    is needed: most decisions (a routing rule, a dispatch, a finish). What needs one, and
    what fails, goes to a conductor actor (``to_actor``), which asks the LLM or reports
    the failure as it does any. False: the trigger goes to an actor at once (its last
    delivery: giving up on it is recorded by one).

    Deciding where the trigger arrives spares a decision its two thread hand-offs (to a
    conductor thread, and back to the loop to append), which under load are most of its
    latency: each waits for the GIL behind every other busy thread. Folding and routing
    take well under a millisecond, and reads and appends are awaited: the loop never
    blocks."""
    if quarantined(bridge, delivery.message):
        delivery.settle("ack")
        return True
    if delivery.message.last_delivery:
        return False
    spawn(_advance_on_loop(bridge, delivery, to_actor))
    return True


async def _advance_on_loop(
    bridge: Bridge, delivery: Delivery, to_actor: Callable[[], None]
) -> None:
    key = (bridge, task_of(delivery.message.subject))
    if not _CLAIMS.claim(key, delivery):
        return  # handed to the conductor advancing the task, which settles it
    try:
        await advance_claimed(bridge, key, delivery.message, [])
    except Exception:  # NeedsLLM, or a failure: the claim is released
        to_actor()
        return
    except BaseException:  # the daemon stops: delivered again later
        delivery.settle("nak")
        raise
    delivery.settle("ack")


def _newest_trigger(handed: list[Delivery | None]) -> Message | None:
    """The latest in the stream of the triggers handed over, if any."""
    messages = [d.message for d in handed if d is not None]
    return max(messages, key=lambda message: message.stream_seq) if messages else None


def _cause(message: Message) -> str:
    return f"cmd:{message.stream_seq}"


def _refusal(exc: Exception) -> str:
    """Why a task was rejected, as recorded: the check's own words, or what it ran into."""
    if isinstance(exc, ValueError):  # the checks' refusals (a bad task file, workflow...)
        text = str(exc)
    elif isinstance(exc, RecursionError | MemoryError):  # the parsers' limits
        text = f"the task is too deeply nested to check ({type(exc).__name__})"
    else:
        text = f"the task could not be checked: {type(exc).__name__}: {exc}"
    return _bounded(scrub(text), MAX_REASON_CHARS)


def _readable_workflow(state: TaskState) -> Workflow | None:
    """The task's recorded workflow; None where it cannot be read (then deciding failed)."""
    try:
        return workflow_of(state)
    except WorkflowError:
        return None


def _one_line(text: str) -> str:
    """``text`` for a log line: one line per refused command, whatever it says."""
    return " ".join(text.split())


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _newest(history: TaskHistory, other: TaskHistory | None) -> TaskHistory:
    """The newer of two histories of one task: the log only grows, so the longer."""
    return other if other is not None and len(other.events) > len(history.events) else history
