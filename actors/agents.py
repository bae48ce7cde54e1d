"""LLM agents (designer, coder, and any agent a workflow declares with an output_format).

An agent takes its dispatch from the log, builds its prompt from the task's events, calls
the LLM, records the call, then records the parsed output (or why it did not parse). A
redelivered dispatch resumes from the log: a recorded call is parsed, never made twice.
"""

from __future__ import annotations

from actors.bridge import Bridge
from actors.llm import budgets_of
from actors.llm.base import LLMError, LLMProvider, LLMRequest, llm_called
from actors.llm.budget import task_budget_error
from actors.prompts import agent_messages
from actors.worker import Job, Settlement, Worker, state_of, workflow_of
from events.codec import decode_event
from events.log import AppendConflict
from events.model import AgentDispatched, AgentFailed, Event, OutputParsed, ParseFailed
from projections.task_state import Dispatch, TaskState
from workflows.parsing import ParseError, parse_output


def current_dispatch(state: TaskState, dispatched: AgentDispatched) -> Dispatch | None:
    """The dispatch if it is still the task's open one; None for stale or finished work,
    and for a dispatch in a log that was never a submitted task (nothing to work from)."""
    d = state.dispatch(dispatched.dispatch_id)
    if state.submitted is None or state.terminal is not None or d is None:
        return None
    return d if d.result is None and d is state.current else None


class LLMAgent(Worker):
    def __init__(self, bridge: Bridge, agent: str, llm: LLMProvider) -> None:
        self.role = agent
        super().__init__(bridge)
        self.agent = agent
        self.llm = llm

    def handle(self, job: Job) -> Settlement:
        dispatched = decode_event(job.data)
        assert isinstance(dispatched, AgentDispatched)
        history = self.history_at(job)
        while True:
            state = state_of(history)
            d = current_dispatch(state, dispatched)
            if d is None:
                return "ack"
            try:
                history = self.append(history, self.next_event(state, d))
            except AppendConflict:
                history = self.read(dispatched.task_id)

    def next_event(self, state: TaskState, d: Dispatch) -> Event:
        workflow = workflow_of(state)
        if not d.llm_calls:
            # Checked before every call, from the calls the log holds: a redelivered
            # dispatch sees exactly what the first attempt saw.
            over_budget = task_budget_error(state, budgets_of(self.llm))
            if over_budget is not None:
                return AgentFailed(
                    task_id=state.task_id,
                    cause=d.event.event_id,
                    agent=self.agent,
                    dispatch_id=d.dispatch_id,
                    error=over_budget,
                )
            request = LLMRequest(
                task_id=state.task_id,
                agent=self.agent,
                call_index=state.llm_calls_by(self.agent),
                messages=agent_messages(state, workflow, self.agent),
            )
            try:
                response = self.bridge.call(self.llm.complete(request))
            except LLMError as exc:
                return AgentFailed(
                    task_id=state.task_id,
                    cause=d.event.event_id,
                    agent=self.agent,
                    dispatch_id=d.dispatch_id,
                    error=str(exc),
                )
            return llm_called(request, response, dispatch_id=d.dispatch_id, cause=d.event.event_id)
        call = d.llm_calls[-1]
        try:
            fields = parse_output(workflow.agents[self.agent], call.response_text)
        except ParseError as exc:
            return ParseFailed(
                task_id=state.task_id,
                cause=call.event_id,
                agent=self.agent,
                dispatch_id=d.dispatch_id,
                reason=str(exc),
            )
        return OutputParsed(
            task_id=state.task_id,
            cause=call.event_id,
            agent=self.agent,
            dispatch_id=d.dispatch_id,
            fields=fields,
        )
