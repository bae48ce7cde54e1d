"""Standalone runs, recorded (docs/agents.md, "AgenticRollout"): every ``run_trajectory``
outside a daemon is a task in an in-process event log (the log's memory adapter,
``kernelflow.events.memory``), recorded as a daemon records a rollout's task.

A run opens its task as ``kernelflow rollout`` does (``TaskSubmitted`` of a prompt task
whose workflow has one ``solver`` agent of the run's agent, then the conductor's own
decisions up to the solver's dispatch, from the pure rules: ``actors/decide.py``); each
LLM and tool call the agent makes is recorded as it is made (``LLMCalled``,
``ToolCalled``); its end is the dispatch's result (the answer parsed as a daemon parses
it, or the agent's failure), then the finish and the rewards the rules call for. So a
standalone trajectory is a fold of its events (``trajectory``), and ``save`` writes the
log as a file that ``kernelflow export grpo --from FILE`` reads like any other.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from kernelflow.actors.decide import Append, plan_next
from kernelflow.actors.kinds.durable import (
    NO_ANSWER,
    Journal,
    ModelCall,
    ToolRun,
    answer_of,
    call_id,
)
from kernelflow.actors.prompts import agent_messages
from kernelflow.common.redact import scrub
from kernelflow.events import subjects
from kernelflow.events.codec import decode_event
from kernelflow.events.memory import MemoryEventLog
from kernelflow.events.model import (
    AgentFailed,
    ChatMessage,
    Event,
    LLMCalled,
    OutputParsed,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.events.port import TaskHistory
from kernelflow.llm.base import LLMRequest, llm_called
from kernelflow.offline.log_export import export_log
from kernelflow.offline.sources import Apply, EventFilter, Source
from kernelflow.projections.rewards import PROMPT_REWARDS, pending_reward_events
from kernelflow.projections.task_state import TaskState, fold
from kernelflow.projections.trajectory import Trajectory, build_trajectory
from kernelflow.rollout import SOLVER, RolloutConfig
from kernelflow.tools.base import ToolLimits, truncate
from kernelflow.workflows.loader import parse_workflow
from kernelflow.workflows.model import Workflow
from kernelflow.workflows.parsing import ParseError, parse_output

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
# Longest task id made from a request id, leaving room for a suffix (ids are 64 at most).
_ID_CHARS = 48
# Rounds of the conductor's rules that bring a run to its dispatch, or past its end.
_MAX_ROUNDS = 16
# What a tool's result may take in the log, as the built-in tools' own limit.
_MAX_OUTPUT_CHARS = ToolLimits().max_output_chars


class RunLog:
    """The in-process log that standalone runs are recorded in."""

    def __init__(self) -> None:
        self.log = MemoryEventLog()
        self._taken: dict[str, int] = {}  # runs of each stem
        self._given: set[str] = set()  # task ids given out

    def task_id_for(self, request_id: str) -> str:
        """A task id for a run of ``request_id``: the request id where it is one (a later
        run of the same request gets ``-2``, ``-3``...), else made of its safe characters."""
        stem = _UNSAFE.sub("-", request_id).strip("-")[:_ID_CHARS] or "run"
        n = self._taken.get(stem, 0)
        while True:
            n += 1
            task_id = stem if n == 1 else f"{stem}-{n}"
            if task_id not in self._given:
                break
        self._taken[stem] = n
        self._given.add(task_id)
        return task_id

    async def start(self, agent: str, max_steps: int, prompt: Any, request_id: str) -> RecordedRun:
        """Open the task of a run of agent ``agent`` on ``prompt`` (the library's prompt: a
        dict with ``content``, or text; its ``ground_truth`` is the reference answer the
        rewards compare with and its ``uid`` the group of rollouts it belongs to)."""
        task_id = self.task_id_for(request_id)
        fields = prompt if isinstance(prompt, Mapping) else {}
        yaml = _workflow_yaml(agent, max_steps)
        submitted = TaskSubmitted(
            task_id=task_id,
            cause="agentic_rollout",
            task_name=request_id,
            task_source="",
            workflow_name=f"agentic_{agent}",
            workflow_yaml=yaml,
            backend="triton",
            group_id=str(fields.get("uid") or f"g-{uuid.uuid4().hex[:12]}"),
            prompt=prompt_text(prompt),
            reference_answer=_text_or_none(fields.get("ground_truth")),
            metadata={"request_id": request_id, "agent": agent},
            rewards=list(PROMPT_REWARDS),
        )
        history = await self.log.append(TaskHistory(task_id), [submitted])
        run = RecordedRun(self.log, history, _workflow(yaml, f"agentic_{agent}"))
        await run.advance()
        return run

    def events(self, task_id: str) -> list[Event]:
        """The events recorded for ``task_id``, in order."""
        stored = self.log.streams.messages(1, subjects.task_events(task_id))
        return [decode_event(data) for _, _, data in stored]

    def trajectory(self, task_id: str) -> Trajectory:
        """The task's trajectory: the fold of its events, as for any task."""
        return build_trajectory(task_id, self.events(task_id))

    def save(self, path: Path) -> Path:
        """Write what was recorded since the last save as a log file (the format of
        ``kernelflow log export``), and free it. Call it when no run is in flight."""
        export_log(_MemorySource(self.log), path, EventFilter())
        self.log = MemoryEventLog()
        return path


class RecordedRun(Journal):
    """The journal of one standalone run: each call is made, then recorded."""

    def __init__(self, log: MemoryEventLog, history: TaskHistory, workflow: Workflow) -> None:
        self.log = log
        self.history = history
        self.workflow = workflow
        self.task_id = history.task_id
        self.dispatch_id = ""
        self.dispatch_event_id = ""
        self.prompt: list[ChatMessage] = []
        self.llm_calls: list[LLMCalled] = []
        self.position = 0  # calls made so far, LLM and tools
        # Calls are recorded in the order they were made, those of one step made together
        # included (a replay reads them back in that order): ``done`` are through.
        self.done = 0
        self.turn = asyncio.Condition()

    async def advance(self) -> TaskState:
        """Record what the conductor's rules decide on top of the task, until it waits on
        its agent or is over (its rewards recorded)."""
        for _ in range(_MAX_ROUNDS):
            state = fold(self.task_id, self.history.events)
            if late := pending_reward_events(state):
                await self._record(*late)
                continue
            if state.terminal is not None:
                return state
            plan = plan_next(state, self.workflow)
            if not isinstance(plan, Append):
                break
            await self._record(plan.event)
        if state.current is not None and not self.dispatch_id:
            self.dispatch_id = state.current.dispatch_id
            self.dispatch_event_id = state.current.event.event_id
            self.prompt = agent_messages(state, self.workflow, SOLVER)
        return state

    async def llm(
        self, messages: list[ChatMessage], params: dict[str, Any], call: ModelCall
    ) -> LLMCalled:
        request = LLMRequest(
            task_id=self.task_id,
            agent=SOLVER,
            call_index=len(self.llm_calls),
            messages=messages,
            params=params,
        )
        position = self.position
        self.position += 1
        try:
            response = await call(request)
        except BaseException:  # nothing to record: the run fails with it
            await self._in_order(position, None)
            raise
        event = llm_called(request, response, dispatch_id=self.dispatch_id, cause=self._cause())
        recorded = await self._in_order(position, event)
        assert isinstance(recorded, LLMCalled)
        self.llm_calls.append(recorded)
        return recorded

    async def tool(self, name: str, args: dict[str, Any], run: ToolRun) -> Any:
        position = self.position
        use_id = call_id(self.dispatch_id, position)
        self.position += 1
        started = time.monotonic()

        def called(ok: bool, output: str, error: str = "") -> ToolCalled:
            text, truncated = truncate(scrub(output), _MAX_OUTPUT_CHARS)
            return ToolCalled(
                task_id=self.task_id,
                cause=self._cause(),
                agent=SOLVER,
                dispatch_id=self.dispatch_id,
                call_id=use_id,
                tool=name,
                args=dict(args),
                ok=ok,
                output=text,
                error=scrub(error),
                truncated=truncated,
                duration_s=time.monotonic() - started,
            )

        try:
            result = await run()
        except BaseException as exc:  # a timeout's cancellation too: recorded, then raised
            error = error_text(exc)
            await self._in_order(position, called(False, f"error: {error}", error))
            raise
        await self._in_order(position, called(True, tool_output(result)))
        return result

    async def end(self, answer: str | None, error: str | None = None) -> TaskState:
        """Record how the run ended (its answer, or why there is none) and what follows."""
        spec = self.workflow.agents[SOLVER]
        text = answer_of(answer)
        result: Event
        try:
            if error is not None or text is None:
                raise ParseError(error or f"{SOLVER}: {NO_ANSWER}")
            result = OutputParsed(
                task_id=self.task_id,
                cause=self._cause(),
                agent=SOLVER,
                dispatch_id=self.dispatch_id,
                fields=parse_output(spec, text, whole_answer=True),
            )
        except ParseError as exc:
            result = AgentFailed(
                task_id=self.task_id,
                cause=self.dispatch_event_id,
                agent=SOLVER,
                dispatch_id=self.dispatch_id,
                error=scrub(str(exc)),
            )
        await self._record(result)
        return await self.advance()

    def _cause(self) -> str:
        """What a call or the answer follows: the last LLM call, else the dispatch."""
        return self.llm_calls[-1].event_id if self.llm_calls else self.dispatch_event_id

    async def _in_order(self, position: int, event: Event | None) -> Event | None:
        """Record the call made at ``position`` (None: it has nothing to record) once the
        calls made before it are."""
        async with self.turn:
            await self.turn.wait_for(lambda: self.done == position)
            recorded = None if event is None else await self._record(event)
            self.done += 1
            self.turn.notify_all()
        return recorded

    async def _record(self, *events: Event) -> Event:
        self.history = await self.log.append(self.history, events)
        return self.history.events[-1]


def prompt_text(prompt: Any) -> str:
    """The question of an AgenticRollout prompt: its ``content`` (text; the last user message
    of a chat), else the prompt itself as text."""
    content = prompt.get("content", prompt) if isinstance(prompt, Mapping) else prompt
    if isinstance(content, list):
        users = [m.get("content", "") for m in content if isinstance(m, Mapping)]
        return str(users[-1]) if users else ""
    return content if isinstance(content, str) else str(content)


def error_text(exc: BaseException) -> str:
    """An exception as a run's record says it: its type, and its message if it has one."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def tool_output(result: Any) -> str:
    """A tool's result as the log (and a model) reads it: text as it is, anything else as
    JSON where it can be."""
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, default=str)
    except (TypeError, ValueError):
        return str(result)


class _MemorySource(Source):
    """An in-process log as the offline tools read one."""

    def __init__(self, log: MemoryEventLog) -> None:
        self.log = log
        self.flt = EventFilter()
        self.description = {"in_process": True}

    def _feed(self, apply: Apply, end: int | None) -> int:
        last = 0
        for seq, _, data in self.log.streams.messages(1, subjects.ALL_EVENTS, through=end):
            apply(seq, decode_event(data))
            last = seq
        return last

    def last_position(self) -> int:
        return self.log.streams.last_seq


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@lru_cache(maxsize=64)
def _workflow_yaml(agent: str, max_steps: int) -> str:
    return RolloutConfig(agent_type=agent, max_steps=max_steps).workflow_yaml()


@lru_cache(maxsize=64)
def _workflow(yaml: str, name: str) -> Workflow:
    return parse_workflow(yaml, name)
