"""Metrics: per-task and run-wide numbers, folded from the log in one streaming pass.

``MetricsProjection`` is a read model: it applies events in log order, remembers the
position (stream sequence, or record number in an exported file) of the last one it
applied and ignores anything at or before it, so it can be stopped, snapshotted
(``snapshot`` / ``restore``: JSON) and resumed from its position without counting an
event twice. It keeps one small ``TaskMetrics`` per task and a few numbers per
dispatch, never the events themselves. A quarantined message (a ``QuarantinedEvent``: see
``kernelflow.events.quarantine``) moves the position and is counted (``quarantined``),
nothing else.

``run_metrics`` summarises a set of tasks. Definitions (all over tasks that *ended*:
finished, cancelled or rejected; running tasks are only counted):

- a task's outcome is that of the kernel it ended with, by the newest check of it: the
  verification it ended on, or a later one by a newer verifier (``KernelReverified``,
  ``kernelflow reverify``); ``verifier_version`` asks for the newest check by a verifier
  no newer than that version instead (``TaskMetrics.outcome``);
- faults: ended tasks whose outcome is a check that was not the candidate's doing
  (``task_error``: the task is broken; ``unsupported``: the node cannot check it); they
  are left out of the correctness rate and ``fast_p`` (no policy earned or lost them);
- correctness rate: tasks whose outcome is a pass (status ``success``) / ended, faults
  left out;
- ``fast_p``: tasks that are correct and faster than ``p`` * the baseline / ended, faults
  left out (KernelBench); for ``p = 0`` a correct task counts even without a measured speedup; for
  ``p > 0`` it is None (not measured, never 0) when no task of the set was timed (Triton
  in the CPU interpreter is never timed);
- geometric-mean speedup: over correct tasks with a measured speedup;
- verdict distribution: every verification of every task;
- per-agent latency: seconds from an agent's dispatch to its result (``at`` stamps), and
  the LLM latency each call recorded;
- per agent (``AgentMetrics``): runs (dispatches), LLM calls (the conductor's included),
  tool calls, successes (runs that ended in ``output_parsed``, or for the verifier in a
  passing verification), failures (``parse_failed``, ``agent_failed``, a verification that
  did not pass), and total and mean seconds from dispatch to result;
- per tool (``ToolMetrics``): calls, successes (``tool_called.ok``), failures, truncated
  outputs, total and mean duration of a call.

``FOLD_VERSION`` names what ``apply`` counts: bump it whenever the fold counts something new
or differently, so that persisted snapshots of an older fold (the daemon's read model,
``kernelflow.actors.readmodel``) are rebuilt from the start instead of resumed.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Sequence
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

DEFAULT_FAST_P: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
RUNNING = "running"
FOLD_VERSION = 5


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
    best_speedup: float | None = None  # best speedup of a passing verification
    final_verdict: str | None = None
    final_speedup: float | None = None
    final_verifier_version: int = 0  # of the verification the task ended on
    final_warned: bool = False  # it passed with its policy's warnings
    # Later checks of the kernel the task ended with: (verifier version, verdict, speedup,
    # passed with warnings).
    revisions: tuple[tuple[int, str, float | None, bool], ...] = ()
    rewards: dict[str, float] = {}  # recorded rewards, "name@version" → value

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
    ) -> tuple[int, str, float | None, bool] | None:
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
            verdicts=self.verdicts,
            warned=self.final_warned,
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
    t.revisions = tuple((v, _shared(verdict), s, w) for v, verdict, s, w in t.revisions)
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
    """Running counts for one agent (see ``AgentMetrics`` for the definitions)."""

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
    if r.passed and r.speedup is not None:
        t.best_speedup = max(t.best_speedup or r.speedup, r.speedup)
    _close_dispatch(p, event, succeeded=r.passed)


def _on_reverified(p: MetricsProjection, t: TaskMetrics, event: KernelReverified) -> None:
    r = event.report
    warned = r.passed and bool(r.warnings)
    t.revisions = (*t.revisions, (r.verifier_version, _shared(r.verdict), r.speedup, warned))


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


# --------------------------------------------------------------------------- summaries


class LatencyStats(msgspec.Struct, frozen=True, kw_only=True):
    count: int
    mean_s: float
    p50_s: float
    p90_s: float
    max_s: float


def latency_stats(values: Sequence[float]) -> LatencyStats:
    xs = sorted(values)
    if not xs:
        return LatencyStats(count=0, mean_s=0.0, p50_s=0.0, p90_s=0.0, max_s=0.0)

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, math.ceil(p * len(xs)) - 1)]

    return LatencyStats(
        count=len(xs), mean_s=math.fsum(xs) / len(xs), p50_s=q(0.5), p90_s=q(0.9), max_s=xs[-1]
    )


class AgentMetrics(msgspec.Struct, frozen=True, kw_only=True):
    """One agent over a run. ``runs``: its dispatches; ``successes``: runs that ended in
    parsed output (the verifier: in a passing verification); ``failures``: runs that
    ended in a parse failure, an agent failure or a verification that did not pass;
    ``unfinished``: runs with no result (yet); ``total_s`` / ``mean_s``: dispatch → result
    over the runs whose both ends were read. ``llm_calls`` counts the conductor's too."""

    runs: int
    successes: int
    failures: int
    unfinished: int
    success_rate: float | None
    total_s: float
    mean_s: float | None
    llm_calls: int
    llm_s: float
    tool_calls: int


class ToolMetrics(msgspec.Struct, frozen=True, kw_only=True):
    calls: int
    successes: int
    failures: int
    truncated: int
    success_rate: float | None
    total_s: float
    mean_s: float | None


def agent_metrics(tally: AgentTally) -> AgentMetrics:
    ended = tally.successes + tally.failures
    return AgentMetrics(
        runs=tally.runs,
        successes=tally.successes,
        failures=tally.failures,
        unfinished=max(0, tally.runs - ended),
        success_rate=tally.successes / ended if ended else None,
        total_s=tally.total_s,
        mean_s=tally.total_s / tally.timed_runs if tally.timed_runs else None,
        llm_calls=tally.llm_calls,
        llm_s=tally.llm_s,
        tool_calls=tally.tool_calls,
    )


def tool_metrics(tally: ToolTally) -> ToolMetrics:
    return ToolMetrics(
        calls=tally.calls,
        successes=tally.successes,
        failures=tally.calls - tally.successes,
        truncated=tally.truncated,
        success_rate=tally.successes / tally.calls if tally.calls else None,
        total_s=tally.total_s,
        mean_s=tally.total_s / tally.calls if tally.calls else None,
    )


class RunMetrics(msgspec.Struct, frozen=True, kw_only=True):
    tasks: int
    ended: int
    running: int
    statuses: dict[str, int]
    correct: int
    faults: int  # ended on the task's or the node's fault: not in the rates
    correctness_rate: float | None
    fast_p: dict[str, float | None]
    geomean_speedup: float | None
    speedups_measured: int
    verdicts: dict[str, int]
    verifications: int
    llm_calls: int
    total_tokens: int
    cost_usd: float | None
    mean_steps: float | None
    mean_wall_s: float | None
    rewards_mean: dict[str, float]
    agent_latency: dict[str, LatencyStats] = {}
    llm_latency: dict[str, LatencyStats] = {}
    tool_calls: int = 0
    agents: dict[str, AgentMetrics] = {}
    tools: dict[str, ToolMetrics] = {}


def fast_p(
    tasks: Sequence[TaskMetrics], p: float, verifier_version: int | None = None
) -> float | None:
    """The share of ended tasks (faults left out) whose kernel is correct and more than
    ``p`` times faster than the baseline; None without such tasks, or for ``p > 0`` when
    none was timed."""
    outcomes = [o for t in tasks if t.ended and not (o := t.outcome(verifier_version)).fault]
    if not outcomes or (p > 0 and all(o.speedup is None for o in outcomes)):
        return None
    hits = sum(
        1
        for o in outcomes
        if o.status == "success" and (p == 0 or (o.speedup is not None and o.speedup > p))
    )
    return hits / len(outcomes)


def geomean(values: Iterable[float]) -> float | None:
    logs = [math.log(v) for v in values if v > 0]
    return math.exp(math.fsum(logs) / len(logs)) if logs else None


def run_metrics(
    tasks: Iterable[TaskMetrics],
    *,
    fast_ps: Sequence[float] = DEFAULT_FAST_P,
    agent_latency_s: dict[str, list[float]] | None = None,
    llm_latency_s: dict[str, list[float]] | None = None,
    agents: dict[str, AgentTally] | None = None,
    tools: dict[str, ToolTally] | None = None,
    verifier_version: int | None = None,
) -> RunMetrics:
    """The run's numbers over ``tasks``; outcomes by the newest check of each kernel, or
    by the newest by a verifier no newer than ``verifier_version``."""
    ts = sorted(tasks, key=lambda t: t.task_id)
    ended = [t for t in ts if t.ended]
    outcomes = {t.task_id: t.outcome(verifier_version) for t in ended}
    correct = [t for t in ended if outcomes[t.task_id].status == "success"]
    faults = sum(1 for t in ended if outcomes[t.task_id].fault)
    judged = len(ended) - faults
    statuses: dict[str, int] = {}
    verdicts: dict[str, int] = {}
    reward_sums: dict[str, list[float]] = {}
    for t in ts:
        _bump(statuses, t.status)
        for v in t.verdicts:
            _bump(verdicts, v)
        for name, value in t.rewards.items():
            reward_sums.setdefault(name, []).append(value)
    speedups = [s for t in correct if (s := outcomes[t.task_id].speedup) is not None]
    costs = [t.cost_usd for t in ts if t.cost_usd is not None]
    walls = [w for t in ended if (w := t.wall_s) is not None]
    return RunMetrics(
        tasks=len(ts),
        ended=len(ended),
        running=len(ts) - len(ended),
        statuses=dict(sorted(statuses.items())),
        correct=len(correct),
        correctness_rate=len(correct) / judged if judged else None,
        faults=faults,
        fast_p={f"fast_{p:g}": fast_p(ts, p, verifier_version) for p in fast_ps},
        geomean_speedup=geomean(speedups),
        speedups_measured=len(speedups),
        verdicts=dict(sorted(verdicts.items())),
        verifications=sum(verdicts.values()),
        llm_calls=sum(t.llm_calls for t in ts),
        total_tokens=sum(t.total_tokens for t in ts),
        cost_usd=math.fsum(costs) if costs else None,
        mean_steps=(sum(t.steps for t in ended) / len(ended)) if ended else None,
        mean_wall_s=(math.fsum(walls) / len(walls)) if walls else None,
        rewards_mean={k: math.fsum(v) / len(v) for k, v in sorted(reward_sums.items())},
        agent_latency={a: latency_stats(v) for a, v in sorted((agent_latency_s or {}).items())},
        llm_latency={a: latency_stats(v) for a, v in sorted((llm_latency_s or {}).items())},
        tool_calls=sum(t.tool_calls for t in ts),
        agents={a: agent_metrics(v) for a, v in sorted((agents or {}).items())},
        tools={name: tool_metrics(v) for name, v in sorted((tools or {}).items())},
    )


def projection_metrics(
    projection: MetricsProjection,
    fast_ps: Sequence[float] = DEFAULT_FAST_P,
    verifier_version: int | None = None,
) -> RunMetrics:
    st = projection.state
    return run_metrics(
        st.tasks.values(),
        fast_ps=fast_ps,
        agent_latency_s=st.agent_latency_s,
        llm_latency_s=st.llm_latency_s,
        agents=st.agents,
        tools=st.tools,
        verifier_version=verifier_version,
    )


def by_workflow(
    tasks: Iterable[TaskMetrics],
    fast_ps: Sequence[float] = DEFAULT_FAST_P,
    verifier_version: int | None = None,
) -> dict[str, RunMetrics]:
    groups: dict[str, list[TaskMetrics]] = {}
    for t in tasks:
        groups.setdefault(t.workflow or "?", []).append(t)
    return {
        w: run_metrics(ts, fast_ps=fast_ps, verifier_version=verifier_version)
        for w, ts in sorted(groups.items())
    }
