"""LLM agents: any agent a workflow declares with an output_format (designer, coder...).

An agent takes its dispatch from the log and lets its *kind* (``kernelflow.actors.kinds``: llm,
react, tool, coding or a plugin's) say what to do next from the dispatch's recorded calls:
call the LLM, run tools, or finish. The agent does that one piece of I/O, records it, and
asks again, until the dispatch ends with its parsed output (or why there is none). A
redelivered dispatch resumes from the log: a recorded call is never made twice, a
recorded tool result never rerun. When the step after a piece of I/O needs none (the
answer is parsed, or the kind gives up), it is decided on top of the I/O's record and
appended with it: one append per piece of I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.kinds import (
    CallLLM,
    Finish,
    GiveUp,
    PlannedTool,
    RunTools,
    Step,
    Turn,
    agent_kind,
)
from kernelflow.actors.prompts import agent_messages
from kernelflow.actors.worker import (
    DispatchWorker,
    Message,
    Settlement,
    current_dispatch,
    state_of,
)
from kernelflow.common.redact import scrub, scrubbed_traceback
from kernelflow.events.codec import decode_event
from kernelflow.events.log import AppendConflict, TaskHistory, numbered_after
from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    ToolCalled,
    ToolUse,
)
from kernelflow.llm import budgets_of
from kernelflow.llm.base import LLMError, LLMProvider, LLMRequest, llm_called
from kernelflow.llm.budget import task_budget_error
from kernelflow.projections.task_state import Dispatch, TaskState, fold, workflow_of
from kernelflow.tools import Tool, ToolContext, make_tool, run_tool, workspace_files
from kernelflow.verification.engine import VerifierConfig
from kernelflow.workflows.model import TOOL_FIELD_TYPE, AgentSpec, Workflow
from kernelflow.workflows.parsing import ParseError, parse_output


@lru_cache(maxsize=256)
def shared_tool(name: str, limits: tuple[tuple[str, Any], ...]) -> Tool:
    """One instance per tool and limits in this process, so a calls-per-minute limit
    holds across all the agents of a daemon."""
    base = make_tool(name).limits
    return make_tool(name, dataclasses.replace(base, **dict(limits)) if limits else None)


def tools_of(spec: AgentSpec, choice: PlannedTool | None = None) -> dict[str, Tool]:
    """The agent's tools; only the one ``choice`` names where the agent before chose."""
    names = spec.tools if choice is None else [t for t in spec.tools if t == choice.tool]
    return {
        name: shared_tool(name, tuple(sorted(spec.tool_limits.get(name, {}).items())))
        for name in names
    }


def planned_tool(state: TaskState, workflow: Workflow, d: Dispatch) -> PlannedTool | None:
    """The tool the agent dispatched just before ``d`` chose with a ``tool`` field of its
    answer (docs/workflows.md, "agentflow"); None when that agent has no such field."""
    index = next(i for i, x in enumerate(state.dispatches) if x.dispatch_id == d.dispatch_id)
    if index == 0:
        return None
    before = state.dispatches[index - 1]
    spec = workflow.agents.get(before.agent)
    fields_of = spec.output_fields if spec is not None else ()
    field = next((f for f in fields_of if f.field_type == TOOL_FIELD_TYPE), None)
    if field is None:
        return None
    fields = before.result.fields if isinstance(before.result, OutputParsed) else {}
    chosen = fields.get(field.name)
    return PlannedTool(before.agent, chosen if isinstance(chosen, str) else None)


class LLMAgent(DispatchWorker):
    def __init__(
        self,
        bridge: Bridge,
        agent: str,
        llm: LLMProvider,
        verifier: VerifierConfig | None = None,
    ) -> None:
        self.role = agent
        super().__init__(bridge)
        self.agent = agent
        self.llm = llm
        self.verifier = verifier  # what its kernel tools check and time with

    def handle(self, message: Message) -> Settlement:
        dispatched = decode_event(message.data)
        assert isinstance(dispatched, AgentDispatched)
        history = self.history_at(message)
        while True:
            state = state_of(history)
            d = current_dispatch(state, dispatched)
            if d is None:
                return "ack"
            events = self.next_events(state, d)
            try:
                history = self.append(history, *events, *self.ending(history, events, d))
            except AppendConflict:
                history = self.read(dispatched.task_id)

    def ending(self, history: TaskHistory, events: list[Event], d: Dispatch) -> list[Event]:
        """The dispatch's end (its answer parsed, or giving up) when the I/O results in
        ``events`` lead straight to it: decided on top of them, to be appended with them
        (nothing is called in between, so nothing is lost if the append is refused)."""
        if not events or not all(isinstance(e, LLMCalled | ToolCalled) for e in events):
            return []
        state = fold(history.task_id, (*history.events, *numbered_after(history.events, events)))
        after = current_dispatch(state, d.event)
        if after is None:
            return []
        step, spec, tools, files = self.step(state, after)
        if not isinstance(step, Finish | GiveUp):
            return []  # more I/O: done on what the log holds, in the next round
        return self.perform(state, after, step, spec, tools, files)

    def next_events(self, state: TaskState, d: Dispatch) -> list[Event]:
        return self.perform(state, d, *self.step(state, d))

    def step(
        self, state: TaskState, d: Dispatch
    ) -> tuple[Step, AgentSpec, dict[str, Tool], Mapping[str, str]]:
        """What the agent's kind does next, and the agent's tools and workspace."""
        workflow = workflow_of(state)
        spec = workflow.agents[self.agent]
        choice = planned_tool(state, workflow, d)
        tools = tools_of(spec, choice)
        files = workspace_files(state) if tools else {}
        turn = Turn(
            prompt=agent_messages(state, workflow, self.agent),
            llm_calls=d.llm_calls,
            tool_calls=d.tool_calls,
            tools=[t.spec() for t in tools.values()],
            files=files,
            task=state.submitted,
            dispatch=d.event,
            planned_tool=choice,
        )
        kind = agent_kind(spec.kind)
        try:
            step = kind(spec).next_step(turn)
        except Exception as exc:
            # The kind's own code (a plugin's, perhaps) failed on this turn, and would fail
            # the same way on every redelivery: record the dispatch as failed and let the
            # conductor route on, rather than retry until JetStream gives the message up.
            failed = (spec.kind, state.task_id, scrubbed_traceback())
            self.log.error("agent kind %r failed on task %s\n%s", *failed)
            step = GiveUp(f"agent kind {spec.kind!r} failed: {type(exc).__name__}: {exc}")
        return step, spec, tools, files

    def perform(
        self,
        state: TaskState,
        d: Dispatch,
        step: Step,
        spec: AgentSpec,
        tools: dict[str, Tool],
        files: Mapping[str, str],
    ) -> list[Event]:
        """Do the step's I/O, if any; the events that record it."""
        if isinstance(step, CallLLM):
            return [self.call_llm(state, d, step)]
        if isinstance(step, RunTools):
            return self.run_tools(state, d, step, tools, files)
        if isinstance(step, Finish):
            return [self.parsed(state, d, spec, step)]
        assert isinstance(step, GiveUp)
        return [self.failed(state, d, step.error)]

    def call_llm(self, state: TaskState, d: Dispatch, step: CallLLM) -> Event:
        # Checked before every call, from the calls the log holds: a redelivered dispatch
        # sees exactly what the first attempt saw.
        over_budget = task_budget_error(state, budgets_of(self.llm))
        if over_budget is not None:
            return self.failed(state, d, over_budget)
        request = LLMRequest(
            task_id=state.task_id,
            agent=self.agent,
            call_index=state.llm_calls_by(self.agent),
            messages=step.messages,
            params=dict(step.params),
            tools=step.tools,
        )
        cause = d.llm_calls[-1].event_id if d.llm_calls else d.event.event_id
        try:
            response = self.bridge.call(self.llm.complete(request))
        except LLMError as exc:
            return self.failed(state, d, str(exc))
        return llm_called(request, response, dispatch_id=d.dispatch_id, cause=cause)

    def run_tools(
        self,
        state: TaskState,
        d: Dispatch,
        step: RunTools,
        tools: Mapping[str, Tool],
        files: Mapping[str, str],
    ) -> list[Event]:
        """Run the calls in order (a file change is visible to the next call) and record
        each result; a call of a tool the agent does not have is answered as an error."""
        assert state.submitted is not None
        events: list[Event] = []
        # A program (a durable kind) may call a tool before it asks the LLM anything.
        cause = d.llm_calls[-1].event_id if d.llm_calls else d.event.event_id
        for use in step.calls:
            ctx = ToolContext(
                task_id=state.task_id,
                agent=self.agent,
                files=files,
                task_source=state.submitted.task_source,
                backend=state.submitted.backend,
                policy=state.submitted.policy,
                verifier=self.verifier,
            )
            tool = tools.get(use.name)
            if tool is None:
                error = _refused_tool(state, d, use.name, tools)
                events.append(
                    _tool_called(state, d, use, cause, ok=False, output=error, error=error)
                )
                continue
            outcome = self.bridge.call(run_tool(tool, use.args, ctx))
            if outcome.ok and (changed := tool.effect(files, use.args)) is not None:
                files = changed
            events.append(
                _tool_called(
                    state,
                    d,
                    use,
                    cause,
                    ok=outcome.ok,
                    output=outcome.output,
                    error=outcome.error,
                    truncated=outcome.truncated,
                    duration_s=outcome.duration_s,
                )
            )
        return events

    def parsed(self, state: TaskState, d: Dispatch, spec: AgentSpec, step: Finish) -> Event:
        cause = d.llm_calls[-1].event_id if d.llm_calls else d.event.event_id
        try:
            toolset = workflow_of(state).toolset
            fields = parse_output(spec, step.text, whole_answer=step.whole_answer, tools=toolset)
        except ParseError as exc:
            return ParseFailed(
                task_id=state.task_id,
                cause=cause,
                agent=self.agent,
                dispatch_id=d.dispatch_id,
                reason=str(exc),
            )
        return OutputParsed(
            task_id=state.task_id,
            cause=cause,
            agent=self.agent,
            dispatch_id=d.dispatch_id,
            fields=fields,
        )

    def failed(self, state: TaskState, d: Dispatch, error: str) -> Event:
        """The dispatch's failure, recorded for good: without the credentials that a
        provider's or a kind's error may quote (a key, a URL's user-info)."""
        return AgentFailed(
            task_id=state.task_id,
            cause=d.event.event_id,
            agent=self.agent,
            dispatch_id=d.dispatch_id,
            error=scrub(error),
        )


def _refused_tool(state: TaskState, d: Dispatch, name: str, tools: Mapping[str, Tool]) -> str:
    """Why a tool call is not run: the agent has no such tool, or the agent before it
    chose another for this turn."""
    workflow = workflow_of(state)
    choice = planned_tool(state, workflow, d)
    if choice is not None and name in workflow.agents[d.agent].tools:
        return f"{name!r} was not run: {choice.agent} chose {choice.tool} for this turn"
    return f"unknown tool {name!r}; your tools: {', '.join(tools) or 'none'}"


def _tool_called(
    state: TaskState, d: Dispatch, use: ToolUse, cause: str, **outcome: object
) -> ToolCalled:
    return ToolCalled(
        task_id=state.task_id,
        cause=cause,
        agent=d.agent,
        dispatch_id=d.dispatch_id,
        call_id=use.id,
        tool=use.name,
        args=use.args,
        **outcome,  # type: ignore[arg-type]
    )
