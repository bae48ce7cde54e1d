"""The conductor: turns commands into task events and moves tasks along their workflow.

It holds no authority of its own: every decision is ``plan_next(fold(events))``, appended
with optimistic concurrency. Any number of conductors, in any number of daemons, may run
against one log; a conflict just means "someone else moved this task: reload".
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence

from actors.bridge import Bridge
from actors.decide import Append, AskLLM, Idle, end_task, fallback_decision, plan_next
from actors.kinds.check import check_agents
from actors.llm import budgets_of, is_budget_error
from actors.llm.base import LLMError, LLMProvider, LLMRequest, llm_called
from actors.llm.budget import task_budget_error
from actors.prompts import conductor_messages, judge_messages
from actors.verifier.taskfile import TaskFileError, check_task_source
from actors.worker import Job, Settlement, Worker, state_of, workflow_of
from events import subjects
from events.codec import MalformedMessage, decode_command
from events.log import AppendConflict, TaskHistory
from events.model import (
    CancelTask,
    Event,
    SubmitTask,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
)
from projections.rewards import (
    UnknownReward,
    check_reward_names,
    finish_reward_events,
    judge_failed_event,
    needs_judge,
    pending_reward_events,
)
from projections.task_state import CONDUCTOR, JUDGE, TaskState
from workflows.loader import WorkflowError, load_workflow, parse_workflow
from workflows.model import Workflow

# Each round appends one event; a task never needs more rounds than this between two
# agent runs, so hitting it means something is wrong (and the trigger is redelivered).
MAX_ROUNDS = 64


class Conductor(Worker):
    role = "conductor"

    def __init__(self, bridge: Bridge, llm: LLMProvider | None) -> None:
        super().__init__(bridge)
        self.llm = llm

    def handle(self, job: Job) -> Settlement:
        if job.source == "command":
            return self.on_command(job)
        self.advance(self.history_at(job))
        return "ack"

    # ------------------------------------------------------------------ commands

    def on_command(self, job: Job) -> Settlement:
        try:
            command = decode_command(job.data)
        except MalformedMessage as exc:
            self.log.error("refused a malformed command on %s: %s", job.subject, exc)
            self.reply(job, {"ok": False, "error": str(exc)}, also_errors=True)
            return "ack"  # redelivering a malformed message can never succeed
        if isinstance(command, SubmitTask):
            self.submit(job, command)
        elif isinstance(command, CancelTask):
            self.cancel(job, command)
        return "ack"

    def submit(self, job: Job, command: SubmitTask) -> None:
        # Without a publisher-chosen id, derive one from the command's stream position so
        # a redelivered command maps to the same task.
        task_id = command.task_id or f"cmd-{job.stream_seq}"
        history = self.read(task_id)
        if history.events:
            self.reply(job, {"ok": True, "task_id": task_id, "duplicate": True})
            return
        event: TaskSubmitted | TaskRejected
        try:
            event = self.accepted(task_id, command, job)
            reply = {"ok": True, "task_id": task_id}
        except (TaskFileError, WorkflowError, UnknownReward) as exc:
            event = TaskRejected(
                task_id=task_id, cause=_cause(job), reason=str(exc), task_name=command.task_name
            )
            reply = {"ok": False, "task_id": task_id, "error": str(exc)}
        try:
            history = self.append(history, event)
        except AppendConflict:
            self.reply(job, {"ok": True, "task_id": task_id, "duplicate": True})
            return
        self.reply(job, reply)
        if isinstance(event, TaskSubmitted):
            self.advance(history)  # start right away; the trigger's delivery is then a no-op

    def accepted(self, task_id: str, command: SubmitTask, job: Job) -> TaskSubmitted:
        name = command.task_name or task_id
        if command.prompt is None:
            check_task_source(command.task_source, name)
        elif not command.prompt.strip():
            raise TaskFileError(f"{name}: the prompt is empty")
        if command.workflow_yaml is not None:
            workflow = parse_workflow(command.workflow_yaml, command.workflow)
            workflow_name, workflow_yaml = command.workflow, command.workflow_yaml
        else:
            workflow, workflow_yaml = load_workflow(command.workflow)
            workflow_name = workflow.name
        check_agents(workflow)
        check_reward_names(command.rewards)
        return TaskSubmitted(
            task_id=task_id,
            cause=_cause(job),
            task_name=name,
            task_source=command.task_source,
            workflow_name=workflow_name,
            workflow_yaml=workflow_yaml,
            backend=command.backend,
            group_id=command.group_id or f"g-{uuid.uuid4().hex[:12]}",
            candidate_code=command.candidate_code,
            deadline_s=command.deadline_s,
            metadata=command.metadata,
            prompt=command.prompt,
            reference_answer=command.reference_answer,
            files=command.files,
            rewards=command.rewards,
        )

    def cancel(self, job: Job, command: CancelTask) -> None:
        while True:
            history = self.read(command.task_id)
            state = state_of(history)
            if state.submitted is None:
                self.reply(job, {"ok": False, "error": f"no task {command.task_id}"})
                return
            if state.terminal is not None:
                self.reply(job, {"ok": False, "error": f"task {command.task_id} is already over"})
                return
            try:
                self.append(
                    history,
                    TaskCancelled(
                        task_id=command.task_id, cause=_cause(job), reason=command.reason
                    ),
                )
            except AppendConflict:
                continue
            self.reply(job, {"ok": True, "task_id": command.task_id})
            return

    def reply(self, job: Job, body: dict[str, object], *, also_errors: bool = False) -> None:
        payload = json.dumps(body).encode()
        targets = (
            [job.headers[subjects.REPLY_HEADER]] if subjects.REPLY_HEADER in job.headers else []
        )
        if also_errors:
            targets.append(subjects.ERRORS)
        for target in targets:
            self.bridge.call(self.bridge.nc.publish(target, payload))

    # ------------------------------------------------------------------ routing

    def advance(self, history: TaskHistory) -> None:
        """Append what the workflow says comes next, until an agent must work or the
        task is over."""
        task_id = history.task_id
        for _ in range(MAX_ROUNDS):
            state = state_of(history)
            if state.submitted is None:
                return
            if needs_judge(state):  # the judge scores a finished prompt task's answer
                history = self._append_or_reload(history, [self.judge(state)])
                continue
            if late := pending_reward_events(state):  # a conductor died after the finish
                history = self._append_or_reload(history, late)
                continue
            workflow = workflow_of(state)
            plan = plan_next(state, workflow, now=time.time())
            if isinstance(plan, Idle):
                return
            event = plan.event if isinstance(plan, Append) else self.ask(state, workflow, plan)
            # The outcome rewards follow the finish they score (if this conductor dies in
            # between, the next visit records them: see pending_reward_events above).
            rewards = finish_reward_events(state, event) if isinstance(event, TaskFinished) else []
            history = self._append_or_reload(history, [event, *rewards])
        raise RuntimeError(f"task {task_id}: no stable state after {MAX_ROUNDS} rounds")

    def _append_or_reload(self, history: TaskHistory, events: Sequence[Event]) -> TaskHistory:
        try:
            return self.append(history, *events)
        except AppendConflict:
            return self.read(history.task_id)  # someone moved the task on: decide again

    def judge(self, state: TaskState) -> Event:
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
            response = self.bridge.call(self.llm.complete(request))
        except LLMError as exc:
            return judge_failed_event(state, str(exc))
        return llm_called(request, response, dispatch_id=finished.event_id, cause=finished.event_id)

    def ask(self, state: TaskState, workflow: Workflow, plan: AskLLM) -> Event:
        """Ask the conductor's LLM to choose; the answer is recorded, then decided on."""
        if self.llm is None:
            return fallback_decision(state, plan, "no LLM provider configured")
        over_budget = task_budget_error(state, budgets_of(self.llm))
        if over_budget is not None:
            return end_task(state, plan.decision_point, "budget_exceeded", over_budget)
        request = LLMRequest(
            task_id=state.task_id,
            agent=CONDUCTOR,
            call_index=state.llm_calls_by(CONDUCTOR),
            messages=conductor_messages(state, workflow, plan.options, plan.after_agent),
        )
        try:
            response = self.bridge.call(self.llm.complete(request))
        except LLMError as exc:
            if is_budget_error(str(exc)):  # the daemon's per-run budget is spent
                return end_task(state, plan.decision_point, "budget_exceeded", str(exc))
            return fallback_decision(state, plan, str(exc))
        return llm_called(
            request, response, dispatch_id=plan.decision_point, cause=plan.decision_point
        )


def _cause(job: Job) -> str:
    return f"cmd:{job.stream_seq}"
