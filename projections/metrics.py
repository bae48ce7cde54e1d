"""Metrics: per-task numbers and per-agent and per-tool tallies, folded from the log in one
streaming pass. What they add up to over a run (rates, ``fast_p``, speedups, latency
statistics) is ``kernelflow.projections.statistics``.

``MetricsProjection`` is a read model: it applies events in log order, remembers the
position (stream sequence, or record number in an exported file) of the last one it
applied and ignores anything at or before it, so it can be stopped, snapshotted
(``snapshot`` / ``restore``: JSON) and resumed from its position without counting an
event twice. It keeps one small ``TaskMetrics`` per task and a few numbers per
dispatch, never the events themselves. A quarantined message (a ``QuarantinedEvent``: see
``kernelflow.events.quarantine``) moves the position and is counted (``quarantined``),
nothing else.

``FOLD_VERSION`` names what ``apply`` counts: bump it whenever the fold counts something new
or differently, so that persisted snapshots of an older fold (the daemon's read model,
``kernelflow.actors.readmodel``) are rebuilt from the start instead of resumed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    ConductorDecided,
    Event,
    KernelReverified,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    QuarantinedEvent,
    RewardAssigned,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.projections.handlers import handler_table
from kernelflow.projections.rewards import RewardInput, revised_outcome
from kernelflow.projections.speedups import counted, report_conclusive, report_interval

RUNNING = "running"
FOLD_VERSION = 6


# Untracked by the cycle collector (plain data, no cycles possible; tuples, not lists): the
# read model keeps one per task for the life of the daemon, and each full collection would
# walk them all.
class TaskMetrics(msgspec.Struct, kw_only=True, gc=False):
    task_id: str
    task_name: str = ""
    workflow: str = ""
    group_id: str = ""
    backend: str = ""
    policy: str = ""  # the verifier's strictness policy
    status: str = RUNNING
    reason: str = ""  # why the task ended (its terminal event's reason)
    submitted_at: float | None = None
    ended_at: float | None = None
    events: int = 0
    last_seq: int = 0  # the task's own sequence of the newest event applied
    steps: int = 0
    llm_calls: int = 0
    llm_calls_by_agent: dict[str, int] = {}
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float | None = None
    llm_retries: int = 0
    llm_latency_s: float = 0.0
    models: tuple[str, ...] = ()
    parse_failures: int = 0
    agent_failures: int = 0
    tool_calls: int = 0
    tool_failures: int = 0
    decisions_by_mode: dict[str, int] = {}
    verdicts: tuple[str, ...] = ()
    # Best conclusive speedup of a passing verification (an inconclusive one is no figure:
    # ``kernelflow.projections.speedups``).
    best_speedup: float | None = None
    final_verdict: str | None = None
    final_speedup: float | None = None
    # Whether the final speedup is conclusive, and its 95 % range (those of the newest
    # verification until the task ends).
    final_conclusive: bool | None = None
    final_speedup_ci95: tuple[float, ...] = ()
    # The last verification's fraction of speed-of-light (``Roofline``; None: not counted).
    final_sol_fraction: float | None = None
    final_verifier_version: int = 0  # of the verification the task ended on
    final_warned: bool = False  # it passed with its policy's warnings
    # While the task runs, each passing verification's final_* figures by its event id
    # (verifier version, warned, conclusive, interval, fraction of speed-of-light): the
    # finish of a workflow that improves after a pass may name an earlier one
    # (``TaskFinished.final_check``; docs/workflows.md, "Improving after a pass").
    passes: dict[str, tuple[int, bool, bool | None, tuple[float, ...], float | None]] = {}
    # Later checks of the kernel the task ended with: (verifier version, verdict, speedup,
    # passed with warnings, speedup conclusive).
    revisions: tuple[tuple[int, str, float | None, bool, bool | None], ...] = ()
    rewards: dict[str, float] = {}  # recorded rewards, "name@version" → value
    # A fork's origin (docs/workflows.md, "Forking a task"): the task and the event it was
    # cut at. Its events 2 to ``fork_at`` are the original's work, counted there: here
    # only as ``reused_events`` (no step, call, token or cost of them counts twice).
    forked_from: str = ""
    fork_at: int = 0
    reused_events: int = 0

    @property
    def ended(self) -> bool:
        return self.status != RUNNING

    @property
    def correct(self) -> bool:
        """Ended with success, by the newest check of its kernel."""
        return self.outcome().status == "success"

    @property
    def speedup(self) -> float | None:
        """The speedup of the kernel it ended with, by the newest check of it."""
        return self.outcome().speedup

    def revision(
        self, verifier_version: int | None = None
    ) -> tuple[int, str, float | None, bool, bool | None] | None:
        """The newest later check of the task's kernel (by a verifier no newer than
        ``verifier_version``), or None."""
        for revision in reversed(self.revisions):
            if verifier_version is None or revision[0] <= verifier_version:
                return revision
        return None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cached_tokens

    @property
    def wall_s(self) -> float | None:
        if self.submitted_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.submitted_at

    @property
    def verifications(self) -> int:
        return len(self.verdicts)

    def outcome(self, verifier_version: int | None = None) -> RewardInput:
        """How the task ended, by the newest check of its kernel (by a verifier no newer
        than ``verifier_version``: the verification it ended on when none is)."""
        status = "unfinished" if self.status == RUNNING else self.status
        recorded = RewardInput(
            status=status,
            verdict=self.final_verdict,
            speedup=self.final_speedup,
            speedup_conclusive=self.final_conclusive if self.final_speedup is not None else None,
            verdicts=self.verdicts,
            warned=self.final_warned,
            sol_fraction=self.final_sol_fraction,
        )
        revision = self.revision(verifier_version)
        if revision is None:
            return recorded
        return revised_outcome(recorded, *revision[1:])


# The read model keeps a row per task for the life of the daemon, and the offline tools one
# per task of the log: the few names that recur in every row (agents, workflow, status,
# verdicts...) are kept once (``sys.intern``), not once per event they were decoded from.
_shared = sys.intern


def share_names(t: TaskMetrics) -> None:
    """Keep the recurring names of a row decoded from a snapshot once, as the fold keeps
    those of the rows it builds (a restored read model holds every task's row)."""
    t.task_name = _shared(t.task_name)
    t.workflow = _shared(t.workflow)
    t.backend = _shared(t.backend)
    t.policy = _shared(t.policy)
    t.status = _shared(t.status)
    t.reason = _shared(t.reason)
    if t.final_verdict is not None:
        t.final_verdict = _shared(t.final_verdict)
    t.models = tuple(map(_shared, t.models))
    t.verdicts = tuple(map(_shared, t.verdicts))
    t.revisions = tuple((v, _shared(verdict), s, w, c) for v, verdict, s, w, c in t.revisions)
    t.llm_calls_by_agent = {_shared(k): n for k, n in t.llm_calls_by_agent.items()}
    t.decisions_by_mode = {_shared(k): n for k, n in t.decisions_by_mode.items()}
    t.rewards = {_shared(k): value for k, value in t.rewards.items()}


def _bump(counts: dict[str, int], key: str, n: int = 1) -> None:
    old = counts.get(key)
    if old is None:
        counts[_shared(key)] = n
    else:
        counts[key] = old + n


def _append(lists: dict[str, list[float]], key: str, value: float) -> None:
    # Not setdefault: it would build a throwaway list for every event of a long replay.
    values = lists.get(key)
    if values is None:
        lists[key] = [value]
    else:
        values.append(value)


class AgentTally(msgspec.Struct, kw_only=True):
    """Running counts for one agent (``kernelflow.projections.statistics.AgentMetrics``
    has the definitions)."""

    runs: int = 0
    successes: int = 0
    failures: int = 0
    timed_runs: int = 0  # runs whose dispatch and result were both seen
    total_s: float = 0.0  # dispatch → result, summed over the timed runs
    llm_calls: int = 0
    llm_s: float = 0.0
    tool_calls: int = 0


class ToolTally(msgspec.Struct, kw_only=True):
    calls: int = 0
    successes: int = 0
    truncated: int = 0
    total_s: float = 0.0


class MetricsState(msgspec.Struct, kw_only=True):
    position: int = 0
    tasks: dict[str, TaskMetrics] = {}
    # task id → dispatch id → [agent, dispatched at]: dispatches still waiting for a result.
    open_dispatches: dict[str, dict[str, tuple[str, float]]] = {}
    agent_latency_s: dict[str, list[float]] = {}
    llm_latency_s: dict[str, list[float]] = {}
    agents: dict[str, AgentTally] = {}
    tools: dict[str, ToolTally] = {}
    quarantined: int = 0  # messages of the log that are not events of their task


class MetricsProjection:
    """The metrics read model. ``apply(position, event)`` returns False for an event at or
    before the position already applied (a redelivery)."""

    def __init__(self, state: MetricsState | None = None) -> None:
        self.state = state or MetricsState()

    @property
    def position(self) -> int:
        return self.state.position

    @property
    def tasks(self) -> dict[str, TaskMetrics]:
        return self.state.tasks

    def snapshot(self) -> bytes:
        return msgspec.json.encode(self.state)

    @classmethod
    def restore(cls, data: bytes) -> MetricsProjection:
        state = msgspec.json.decode(data, type=MetricsState)
        for t in state.tasks.values():
            share_names(t)
        return cls(state)

    def _agent(self, name: str) -> AgentTally:
        tally = self.state.agents.get(name)
        if tally is None:
            tally = self.state.agents[name] = AgentTally()
        return tally

    def apply(self, position: int, event: Event) -> bool:
        st = self.state
        if position <= st.position:
            return False
        st.position = position
        if type(event) is QuarantinedEvent:
            st.quarantined += 1
            return True
        t = st.tasks.get(event.task_id)
        if t is None:
            t = st.tasks[event.task_id] = TaskMetrics(task_id=event.task_id)
        if event.seq <= t.last_seq:
            return False  # the same event again (e.g. imported twice under new positions)
        t.events += 1
        t.last_seq = event.seq
        if 1 < event.seq <= t.fork_at:
            t.reused_events += 1
            return True
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, t, event)
        return True

    def apply_all(self, events: Iterable[tuple[int, Event]]) -> MetricsProjection:
        for position, event in events:
            self.apply(position, event)
        return self


# One handler per event type, found by a dict lookup: replays fold millions of events,
# and a chain of isinstance checks per event was a large share of their cost.


def _on_submitted(p: MetricsProjection, t: TaskMetrics, event: TaskSubmitted) -> None:
    t.task_name = _shared(event.task_name)
    t.workflow = _shared(event.workflow_name)
    t.group_id = event.group_id
    t.backend = _shared(event.backend)
    t.policy = _shared(event.policy)
    t.submitted_at = event.at
    if event.forked_from is not None:
        t.forked_from, t.fork_at = event.forked_from.task_id, event.forked_from.at


def _on_dispatched(p: MetricsProjection, t: TaskMetrics, event: AgentDispatched) -> None:
    t.steps += 1
    p._agent(event.agent).runs += 1
    opened = p.state.open_dispatches.get(event.task_id)
    if opened is None:
        opened = p.state.open_dispatches[event.task_id] = {}
    opened[event.dispatch_id] = (event.agent, event.at)


def _on_llm_called(p: MetricsProjection, t: TaskMetrics, event: LLMCalled) -> None:
    t.llm_calls += 1
    _bump(t.llm_calls_by_agent, event.agent)
    u = event.usage
    t.input_tokens += u.input_tokens
    t.output_tokens += u.output_tokens
    t.cached_tokens += u.cache_creation_input_tokens + u.cache_read_input_tokens
    if event.cost_usd is not None:
        t.cost_usd = (t.cost_usd or 0.0) + event.cost_usd
    t.llm_retries += event.retries
    t.llm_latency_s += event.latency_s
    if event.model and event.model not in t.models:
        t.models = tuple(sorted([*t.models, _shared(event.model)]))
    _append(p.state.llm_latency_s, event.agent, event.latency_s)
    a = p._agent(event.agent)
    a.llm_calls += 1
    a.llm_s += event.latency_s


def _on_tool_called(p: MetricsProjection, t: TaskMetrics, event: ToolCalled) -> None:
    t.tool_calls += 1
    p._agent(event.agent).tool_calls += 1
    tool = p.state.tools.get(event.tool)
    if tool is None:
        tool = p.state.tools[event.tool] = ToolTally()
    tool.calls += 1
    tool.total_s += event.duration_s
    if event.ok:
        tool.successes += 1
    else:
        t.tool_failures += 1
    if event.truncated:
        tool.truncated += 1


def _on_parsed(p: MetricsProjection, t: TaskMetrics, event: OutputParsed) -> None:
    _close_dispatch(p, event, succeeded=True)


def _on_parse_failed(p: MetricsProjection, t: TaskMetrics, event: ParseFailed) -> None:
    t.parse_failures += 1
    _close_dispatch(p, event, succeeded=False)


def _on_agent_failed(p: MetricsProjection, t: TaskMetrics, event: AgentFailed) -> None:
    t.agent_failures += 1
    _close_dispatch(p, event, succeeded=False)


def _on_verified(p: MetricsProjection, t: TaskMetrics, event: VerificationCompleted) -> None:
    r = event.report
    t.verdicts = (*t.verdicts, _shared(r.verdict))
    t.final_verifier_version = r.verifier_version
    t.final_warned = r.passed and bool(r.warnings)
    t.final_conclusive = report_conclusive(r)
    t.final_speedup_ci95 = report_interval(r)
    t.final_sol_fraction = r.sol_fraction
    if r.passed:
        t.passes[event.event_id] = (
            t.final_verifier_version,
            t.final_warned,
            t.final_conclusive,
            t.final_speedup_ci95,
            t.final_sol_fraction,
        )
    speedup = counted(r.speedup, t.final_conclusive)
    if r.passed and speedup is not None:
        t.best_speedup = max(t.best_speedup or speedup, speedup)
    _close_dispatch(p, event, succeeded=r.passed)


def _on_reverified(p: MetricsProjection, t: TaskMetrics, event: KernelReverified) -> None:
    r = event.report
    warned = r.passed and bool(r.warnings)
    revision = (r.verifier_version, _shared(r.verdict), r.speedup, warned, report_conclusive(r))
    t.revisions = (*t.revisions, revision)


def _close_dispatch(
    p: MetricsProjection,
    event: OutputParsed | ParseFailed | AgentFailed | VerificationCompleted,
    *,
    succeeded: bool,
) -> None:
    """Count a dispatch's result for its agent, and its time since the dispatch."""
    a = p._agent(event.agent)
    if succeeded:
        a.successes += 1
    else:
        a.failures += 1
    task_opened = p.state.open_dispatches.get(event.task_id)
    opened = task_opened.pop(event.dispatch_id, None) if task_opened is not None else None
    if opened is not None:
        agent, at = opened
        took = max(0.0, event.at - at)
        _append(p.state.agent_latency_s, agent, took)
        a.timed_runs += 1
        a.total_s += took


def _on_decided(p: MetricsProjection, t: TaskMetrics, event: ConductorDecided) -> None:
    _bump(t.decisions_by_mode, event.mode)


def _on_rewarded(p: MetricsProjection, t: TaskMetrics, event: RewardAssigned) -> None:
    t.rewards[_shared(f"{event.reward_fn}@{event.version}")] = event.value


def _on_finished(p: MetricsProjection, t: TaskMetrics, event: TaskFinished) -> None:
    t.status = _shared(event.status)
    t.reason = _shared(event.reason)
    t.ended_at = event.at
    t.final_verdict = _shared(event.verdict) if event.verdict is not None else None
    t.final_speedup = event.speedup
    kept = t.passes.get(event.final_check) if event.final_check is not None else None
    if kept is not None:
        (
            t.final_verifier_version,
            t.final_warned,
            t.final_conclusive,
            t.final_speedup_ci95,
            t.final_sol_fraction,
        ) = kept
    t.passes = {}
    if event.speedup_conclusive is not None:
        t.final_conclusive = event.speedup_conclusive
    p.state.open_dispatches.pop(event.task_id, None)


def _on_stopped(p: MetricsProjection, t: TaskMetrics, event: TaskCancelled | TaskRejected) -> None:
    t.status = "cancelled" if isinstance(event, TaskCancelled) else "rejected"
    t.reason = event.reason
    t.ended_at = event.at
    if isinstance(event, TaskRejected) and event.task_name and not t.task_name:
        t.task_name = event.task_name
    p.state.open_dispatches.pop(event.task_id, None)


_Handler = Callable[[MetricsProjection, TaskMetrics, Any], None]
_HANDLERS: dict[type[Event], _Handler] = handler_table(
    "metrics",
    {
        TaskSubmitted: _on_submitted,
        AgentDispatched: _on_dispatched,
        LLMCalled: _on_llm_called,
        ToolCalled: _on_tool_called,
        OutputParsed: _on_parsed,
        ParseFailed: _on_parse_failed,
        AgentFailed: _on_agent_failed,
        VerificationCompleted: _on_verified,
        ConductorDecided: _on_decided,
        RewardAssigned: _on_rewarded,
        KernelReverified: _on_reverified,
        TaskFinished: _on_finished,
        TaskCancelled: _on_stopped,
        TaskRejected: _on_stopped,
    },
    ignored=(),
)
