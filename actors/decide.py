"""The conductor's decisions as a pure function of a task's state.

``plan_next`` looks at the folded log and says what the conductor must do next: append
one event, ask its LLM, or nothing (an agent is working, or the task is over). The
conductor appends, folds again and repeats, so a conductor that dies between any two
appends resumes exactly where the log says it was: nothing is lost or done twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kernelflow.events.model import (
    DISPATCH_RESULTS,
    ROUTING_VERSION,
    AgentDispatched,
    AgentFailed,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RemovedOption,
    TaskFinished,
    TaskStatus,
    TaskSubmitted,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.llm.base import is_budget_error
from kernelflow.projections.counters import state_counters
from kernelflow.projections.speedups import report_conclusive
from kernelflow.projections.task_state import CONDUCTOR, TaskState
from kernelflow.workflows.model import ANSWER_FIELD, FINISH, Workflow
from kernelflow.workflows.rules import Outcome, Route, read_llm_decision, route


@dataclass(frozen=True)
class Append:
    event: Event


@dataclass(frozen=True)
class AskLLM:
    """Ask the conductor's LLM to choose among ``options``; record the call under
    ``decision_point`` (the id of the event being decided after)."""

    decision_point: str
    options: tuple[str, ...]
    after_agent: str
    removed: tuple[RemovedOption, ...] = ()  # what the limits took out of the options


@dataclass(frozen=True)
class Idle:
    reason: str


Plan = Append | AskLLM | Idle


def outcome_of(state: TaskState) -> Outcome:
    d = state.current
    assert d is not None and d.result is not None
    result = d.result
    # The verifier checks the code of the agent that ran just before it (none: the task's).
    before = state.dispatches[-2].agent if len(state.dispatches) > 1 else None
    return Outcome(
        agent=d.agent,
        parse_failed=isinstance(result, ParseFailed),
        agent_failed=isinstance(result, AgentFailed),
        verification_passed=(
            result.report.passed if isinstance(result, VerificationCompleted) else None
        ),
        code_author=before,
        output=result.fields if isinstance(result, OutputParsed) else None,
        sol_fraction=(
            result.report.sol_fraction if isinstance(result, VerificationCompleted) else None
        ),
    )


def current_route(state: TaskState, workflow: Workflow) -> Route:
    counters = state_counters(state, workflow.sequence_patterns)
    return route(workflow, counters, outcome_of(state), routing_version(state))


def routing_version(state: TaskState) -> int:
    """The version of the routing rules the task is decided by (the one it was submitted
    under: ``TaskSubmitted.routing_version``)."""
    return state.submitted.routing_version if state.submitted else ROUTING_VERSION


def plan_next(state: TaskState, workflow: Workflow, now: float | None = None) -> Plan:
    """What the conductor does next; at ``now`` (epoch seconds), a task past its deadline
    is finished instead of moved on."""
    plan = _plan(state, workflow)
    submitted = state.submitted
    if (
        now is None
        or isinstance(plan, Idle)
        or submitted is None
        or submitted.deadline_s is None
        or now < submitted.at + submitted.deadline_s
    ):
        return plan
    # Where a pass is kept (improving after it), the deadline ends the improving, not the
    # task's success: wall time is part of such a workflow's budget.
    kept = kept_check(state, workflow)
    improved = workflow.improve is not None and kept is not None and kept.report.passed
    return Append(
        end_task(
            state,
            workflow,
            cause=state.last.event_id if state.last else "",
            status="success" if improved else "timeout",
            reason=f"deadline of {submitted.deadline_s:g}s passed",
        )
    )


def _plan(state: TaskState, workflow: Workflow) -> Plan:
    last = state.last
    if state.terminal is not None or last is None:
        return Idle("task is over" if state.terminal else "task not submitted")
    task_id = state.task_id

    if isinstance(last, TaskSubmitted):
        start = workflow.start_agent
        return Append(
            ConductorDecided(
                task_id=task_id,
                cause=last.event_id,
                after_agent="",
                options=[start],
                mode="auto",
                chosen=start,
                reason="the workflow's start agent",
            )
        )

    if isinstance(last, VerificationCompleted) and last.report.fault is not None:
        # Not the candidate's doing: no agent can fix the task or the node, so one
        # decision ends it (rejected, by finish_event), with no coder retry and no LLM call.
        return Append(
            ConductorDecided(
                task_id=task_id,
                cause=last.event_id,
                after_agent=last.agent,
                options=[FINISH],
                mode="auto",
                chosen=FINISH,
                reason=fault_reason(last),
            )
        )

    if isinstance(last, DISPATCH_RESULTS):
        r = current_route(state, workflow)
        after = outcome_of(state).agent
        if r.action == "ask_llm":
            return AskLLM(last.event_id, r.options, after, r.removed)
        assert r.chosen is not None and state.current is not None
        # A retry asks again what the agent was asked: with the suggestion it was given.
        suggestion = state.current.event.suggestion if r.mode == "retry" else ""
        return Append(
            ConductorDecided(
                task_id=task_id,
                cause=last.event_id,
                after_agent=after,
                options=list(r.options),
                mode=r.mode,
                chosen=r.chosen,
                reason=r.reason,
                suggestion=suggestion,
                removed=list(r.removed),
            )
        )

    if isinstance(last, LLMCalled) and last.agent == CONDUCTOR:
        r = current_route(state, workflow)
        decision = read_llm_decision(r.options, last.response_text)
        return Append(
            ConductorDecided(
                task_id=task_id,
                cause=last.event_id,
                after_agent=outcome_of(state).agent,
                options=list(r.options),
                mode="llm" if decision.valid else "fallback",
                chosen=decision.chosen,
                reason=decision.reason,
                # Advice from an answer that chose no option is not meant for the agent
                # the fallback runs.
                suggestion=decision.suggestion if decision.valid else "",
                removed=list(r.removed),
            )
        )

    if isinstance(last, ConductorDecided):
        if last.chosen == FINISH:
            return Append(finish_event(state, workflow, last))
        step = state.step + 1
        return Append(
            AgentDispatched(
                task_id=task_id,
                cause=last.event_id,
                agent=last.chosen,
                step=step,
                dispatch_id=f"{task_id}:d{step}",
                suggestion=last.suggestion,
            )
        )

    return Idle(f"waiting for {state.current.agent}" if state.current else "waiting")


def fault_reason(check: VerificationCompleted) -> str:
    """Why a task whose verification met a fault ends: whose fault, and what it was."""
    whose = {"task": "the task is broken", "node": "this node cannot check it"}
    return f"{whose[check.report.fault or 'task']}: {check.report.summary}"


def fallback_decision(state: TaskState, plan: AskLLM, error: str) -> ConductorDecided:
    """The decision when the conductor's LLM could not be asked at all."""
    return ConductorDecided(
        task_id=state.task_id,
        cause=plan.decision_point,
        after_agent=plan.after_agent,
        options=list(plan.options),
        mode="fallback",
        chosen=plan.options[0],
        reason=f"conductor LLM unavailable ({error}); took the first option",
        removed=list(plan.removed),
    )


def budget_error_of(state: TaskState) -> str | None:
    """The error of the dispatch that just ended if it ended on a spent budget."""
    d = state.current
    if d is not None and isinstance(d.result, AgentFailed) and is_budget_error(d.result.error):
        return d.result.error
    return None


def kept_check(state: TaskState, workflow: Workflow | None) -> VerificationCompleted | None:
    """The verification whose kernel a task ends with: its last; in a workflow that
    improves after a pass, its best passing one (the highest fraction of speed-of-light,
    then speedup, then the latest), and its last where none passed."""
    checks = state.verifications
    passed = [c for c in checks if c.report.passed]
    if workflow is None or workflow.improve is None or not passed:
        return checks[-1] if checks else None

    def merit(index: int) -> tuple[float, float, int]:
        report = passed[index].report
        return (report.sol_fraction or 0.0, report.speedup or 0.0, index)

    return passed[max(range(len(passed)), key=merit)]


def finish_event(state: TaskState, workflow: Workflow, decision: ConductorDecided) -> TaskFinished:
    """A kernel task succeeds when the verification it ends with passed (its last, or in a
    workflow that improves after a pass its best passing one: ``kept_check``); a prompt
    task when its last agent, one that may end it, produced a parsed answer (whether it is
    right is for the rewards)."""
    checks = state.verifications
    if checks and checks[-1].report.fault is not None:
        return end_task(state, workflow, decision.event_id, "rejected", decision.reason)
    current = state.current
    reason = decision.reason
    if is_prompt_task(state):
        passed = current is not None and isinstance(current.result, OutputParsed)
        ends = routing_version(state) < 2 or current is None or workflow.ends_task(current.agent)
        if passed and current is not None and not ends:
            # AgentFlow's rollout that never reached its solution generator: its last
            # answer is no final answer (docs/workflows.md, "Routing").
            passed = False
            enders = [a for a in workflow.agents if workflow.ends_task(a)]
            reason = (
                f"no final answer: the task ended after {current.agent}, and only "
                f"{', '.join(enders)} may give it; {reason}"
            )
    else:
        kept = kept_check(state, workflow)
        passed = kept is not None and kept.report.passed
        if passed and kept is not checks[-1]:
            reason = f"ended with the best kernel that passed; {reason}"
    over_budget = None if passed else budget_error_of(state)
    if over_budget is not None:
        return end_task(state, workflow, decision.event_id, "budget_exceeded", over_budget)
    if not passed and current is not None and isinstance(current.result, VerificationCompleted):
        # Ended on a failed check: that check is the cause, the routing only why it ends.
        reason = f"{failed_check(current.result.report)}; {reason}"
    elif current is not None and isinstance(current.result, AgentFailed):
        reason = f"{reason}: {one_line(current.result.error)}"
    status: TaskStatus = "success" if passed else "failed"
    return end_task(state, workflow, decision.event_id, status, reason)


def failed_check(report: VerificationReport) -> str:
    """A failed verification in one line: its verdict and what it found."""
    return f"{report.verdict}: {one_line(report.summary.partition(' — ')[2] or report.summary)}"


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def end_task(
    state: TaskState, workflow: Workflow | None, cause: str, status: TaskStatus, reason: str
) -> TaskFinished:
    """The task's last event: its status, and the verified code it ends with
    (``kept_check``) with its verdict (a prompt task: its final answer; ``workflow`` None:
    the recorded one cannot be read, so no answer is known for final)."""
    checks = state.verifications
    kept = kept_check(state, workflow)
    return TaskFinished(
        task_id=state.task_id,
        cause=cause,
        status=status,
        reason=reason,
        final_code=kept.code if kept else None,
        verdict=kept.report.verdict if kept else None,
        speedup=kept.report.speedup if kept else None,
        final_answer=final_answer(state, workflow) if is_prompt_task(state) else None,
        speedup_conclusive=report_conclusive(kept.report) if kept else None,
        final_check=kept.event_id if kept is not None and kept is not checks[-1] else None,
    )


def final_answer(state: TaskState, workflow: Workflow | None) -> str | None:
    """A prompt task's final answer: the ``answer`` field (or only field, or all fields as
    JSON) of the last parsed answer of an agent that may end the task; None when no such
    agent answered (AgentFlow's: its solution generator's, never its verifier's). Under
    routing version 1: the last parsed answer of any agent."""
    for d in reversed(state.dispatches):
        if routing_version(state) >= 2 and (workflow is None or not workflow.ends_task(d.agent)):
            continue
        if isinstance(d.result, OutputParsed):
            fields = d.result.fields
            if ANSWER_FIELD in fields:
                return str(fields[ANSWER_FIELD])
            if len(fields) == 1:
                return str(next(iter(fields.values())))
            return json.dumps(fields, sort_keys=True)
    return None


def is_prompt_task(state: TaskState) -> bool:
    return state.submitted is not None and state.submitted.prompt is not None
