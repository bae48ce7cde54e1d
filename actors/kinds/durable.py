"""Durable kinds: agents written as a program (code that runs a whole dispatch, calling the
LLM and tools as it goes), made to survive the daemon that runs them the way a
durable-execution engine replays a workflow function (docs/agents.md, "Imperative agents").

Every step of the dispatch runs the program again from its start against what the log
records of the dispatch: its LLM and tool calls are answered, in order, with the recorded
results, and the first call beyond the record stops the run there: that call is the step,
which the agent actor makes and records as it does for any kind. A program that returns
has finished, with its answer. So a recorded call is never made twice, and a redelivered
dispatch resumes where the log says, on any daemon.

A program must ask for the same calls every time it is replayed on the same record. One
that asks for something else (other messages, another tool, other arguments: its code or
its inputs changed between two deliveries) is stopped with ``DivergenceError`` naming the
call, and the dispatch fails with it.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar, NoReturn

import msgspec

from kernelflow.actors.kinds.base import (
    AgentKind,
    CallLLM,
    Finish,
    GiveUp,
    KindConfig,
    RunTools,
    Step,
    Turn,
)
from kernelflow.actors.kinds.formats import final_answer
from kernelflow.events.model import ChatMessage, LLMCalled, ToolCalled, ToolUse
from kernelflow.llm.base import LLMRequest, LLMResponse

# Makes one LLM call (a provider's ``complete``, or a user's own function behind one).
ModelCall = Callable[[LLMRequest], Awaitable[LLMResponse]]
# Runs one tool call; what the tool returned.
ToolRun = Callable[[], Awaitable[Any]]
# Why a run that returned no answer failed its dispatch.
NO_ANSWER = "the run ended without a final answer"


class DivergenceError(Exception):
    """A program asked for another call than the one its record holds at that point."""


class ToolCallFailed(Exception):
    """A recorded tool call that failed, raised where the program made it."""


class Journal(ABC):
    """What a program's LLM and tool calls go through: the replay of a dispatch's record
    (``Replay``: in a daemon), or a recorder that makes each call and records it (a
    standalone run, ``kernelflow.agentic_rollout``)."""

    # The task the program works on, and its prompt as kernelflow renders it for the agent.
    task_id: str
    prompt: list[ChatMessage]

    @abstractmethod
    async def llm(
        self, messages: list[ChatMessage], params: dict[str, Any], call: ModelCall
    ) -> LLMCalled:
        """The LLM call that answers ``messages`` (asked with ``params``), as recorded."""

    @abstractmethod
    async def tool(self, name: str, args: dict[str, Any], run: ToolRun) -> Any:
        """What tool ``name`` returns for ``args``; raises what the call raised (here:
        ``ToolCallFailed`` for a call recorded as failed)."""


def call_id(dispatch_id: str, position: int) -> str:
    """The id of the tool call a program makes as its call number ``position`` (0-based)
    of a dispatch: the same on every replay."""
    return f"{dispatch_id}#{position}"


class _Stop(BaseException):
    """Unwinds a program at its first call beyond the record, or where it diverged: a
    BaseException, so that the program's own ``except Exception`` cannot catch it."""


class Replay(Journal):
    """A dispatch's record, served to its program in order."""

    def __init__(self, turn: Turn) -> None:
        self.turn = turn
        self.task_id = turn.dispatch.task_id if turn.dispatch is not None else ""
        self.dispatch_id = turn.dispatch.dispatch_id if turn.dispatch is not None else ""
        self.prompt = turn.prompt
        self.record: list[LLMCalled | ToolCalled] = sorted(
            [*turn.llm_calls, *turn.tool_calls], key=lambda e: e.seq
        )
        self.position = 0
        self.step: Step | None = None  # the call beyond the record, once the run asked it
        self.divergence: DivergenceError | None = None

    async def llm(
        self, messages: list[ChatMessage], params: dict[str, Any], call: ModelCall
    ) -> LLMCalled:
        # ``call`` is not made here: the agent actor makes the call with its provider.
        recorded = self._next(CallLLM(messages, params=params))
        if not isinstance(recorded, LLMCalled):
            self._diverged(f"asked the LLM, but the log records {_described(recorded)}")
        elif recorded.messages != messages:
            self._diverged(
                f"asked the LLM with other messages than {_described(recorded)} was asked "
                f"with ({_first_difference(recorded.messages, messages)})"
            )
        return recorded

    async def tool(self, name: str, args: dict[str, Any], run: ToolRun) -> Any:
        use = ToolUse(id=call_id(self.dispatch_id, self.position), name=name, args=args)
        recorded = self._next(RunTools((use,)))
        if not isinstance(recorded, ToolCalled):
            self._diverged(f"called tool {name!r}, but the log records {_described(recorded)}")
        elif recorded.tool != name or recorded.args != _as_recorded(args):
            self._diverged(
                f"called {name}({_args(args)}), but the log records "
                f"{recorded.tool}({_args(recorded.args)}) ({_described(recorded)})"
            )
        if not recorded.ok:
            raise ToolCallFailed(recorded.error or recorded.output)
        return recorded.output

    def _next(self, step: Step) -> LLMCalled | ToolCalled:
        """The recorded result of the program's next call; beyond the record, the run
        stops and ``step`` is what the dispatch does next (the first such call: of calls
        made together, the others follow on later steps, in the order they were made)."""
        if self.position == len(self.record):
            if self.step is None:
                self.step = step
            raise _Stop
        recorded = self.record[self.position]
        self.position += 1
        return recorded

    def _diverged(self, what: str) -> NoReturn:
        self.divergence = DivergenceError(f"call {self.position} of the run {what}")
        raise _Stop

    def check_complete(self) -> None:
        """A finished run must have made every recorded call."""
        if self.position < len(self.record):
            left = self.record[self.position]
            self.divergence = DivergenceError(
                f"the run finished after {self.position} calls, but the log records "
                f"{len(self.record)} (the next: {_described(left)})"
            )


class ProgramConfig(KindConfig, frozen=True, forbid_unknown_fields=False):
    """A program's settings are its own: it reads ``spec.config`` itself, and says what
    it cannot use (``AgentConfigError``) when the kind is made."""


class DurableKind(AgentKind):
    """A kind whose agent is a program. ``program`` runs it from the start, making every
    LLM and tool call through the journal it is given, and returns its final answer
    (None: it ended without one)."""

    config_type: ClassVar[type[KindConfig]] = ProgramConfig
    uses_tools = True

    @abstractmethod
    async def program(self, turn: Turn, journal: Journal) -> str | None:
        """Run the agent on ``turn``'s task from its start, every call through
        ``journal``; its answer."""

    def next_step(self, turn: Turn) -> Step:
        replay = Replay(turn)
        finished, answer = _run_to_stop(self.program(turn, replay))
        if finished and replay.step is None:
            replay.check_complete()
        if replay.divergence is not None:
            raise replay.divergence
        if replay.step is not None:  # a program that caught the stop still stopped there
            return replay.step
        text = answer_of(answer)
        if text is None:
            return GiveUp(f"{self.spec.name}: {NO_ANSWER}")
        return Finish(text, whole_answer=True)


def answer_of(final_response: str | None) -> str | None:
    """The answer in a run's final response: what follows its ``Final Answer:`` marker
    if it has one, else all of it; None when that is empty."""
    if final_response is None:
        return None
    marked = final_answer(final_response)
    text = final_response.strip() if marked is None else marked
    return text or None


_LOOPS = threading.local()


def _run_to_stop(program: Coroutine[Any, Any, str | None]) -> tuple[bool, str | None]:
    """Run ``program`` on this thread's own event loop until it returns (True and its
    answer) or is stopped at a call (False). Whatever it left running is cancelled."""
    loop: asyncio.AbstractEventLoop | None = getattr(_LOOPS, "loop", None)
    if loop is None:
        loop = _LOOPS.loop = asyncio.new_event_loop()

    async def until_stopped() -> tuple[bool, str | None]:
        try:
            return True, await program
        except _Stop:
            return False, None

    try:
        return loop.run_until_complete(until_stopped())
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))


def _as_recorded(args: dict[str, Any]) -> Any:
    """``args`` as the log gives them back (JSON: tuples are lists...)."""
    return msgspec.json.decode(msgspec.json.encode(args))


def _described(event: LLMCalled | ToolCalled) -> str:
    if isinstance(event, LLMCalled):
        return f"LLM call {event.event_id}"
    return f"tool call {event.event_id} ({event.tool})"


def _args(args: dict[str, Any]) -> str:
    text = ", ".join(f"{k}={v!r}" for k, v in args.items())
    return text if len(text) <= 120 else text[:117] + "..."


def _first_difference(recorded: list[ChatMessage], asked: list[ChatMessage]) -> str:
    for i, (old, new) in enumerate(zip(recorded, asked, strict=False)):
        if old != new:
            then, now = f"{old.role} {_clip(old.content)!r}", f"{new.role} {_clip(new.content)!r}"
            return f"message {i} differs: {then} then, {now} now"
    return f"{len(recorded)} messages then, {len(asked)} now"


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
