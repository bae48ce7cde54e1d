"""Run-wide statistics over folded tasks: what ``kernelflow report``, ``replay --view
metrics``, the HTML report, the dashboard and the benchmark summary say about a set of
tasks (pure: ``TaskMetrics`` and the fold's tallies in, plain data out). The fold that
gives them is ``kernelflow.projections.metrics``.

``run_metrics`` summarises a set of tasks (``projection_metrics``: every task of a fold,
with its per-agent and per-tool tallies; ``by_workflow``: one summary per workflow).
Definitions (all over tasks that *ended*: finished, cancelled or rejected; running tasks
are only counted):

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
  in the CPU interpreter is never timed), and only a conclusive speedup is faster than
  anything (``kernelflow.projections.speedups``): a correct task whose timing was
  inconclusive stays in the denominator, not among the hits, and is counted apart
  (``speedups_inconclusive``);
- geometric-mean speedup: over correct tasks with a conclusive measured speedup
  (``speedups_measured``; the inconclusive ones: ``speedups_inconclusive``);
- verdict distribution: every verification of every task;
- per-agent latency: seconds from an agent's dispatch to its result (``at`` stamps), and
  the LLM latency each call recorded;
- per agent (``AgentMetrics``): runs (dispatches), LLM calls (the conductor's included),
  tool calls, successes (runs that ended in ``output_parsed``, or for the verifier in a
  passing verification), failures (``parse_failed``, ``agent_failed``, a verification that
  did not pass), and total and mean seconds from dispatch to result;
- per tool (``ToolMetrics``): calls, successes (``tool_called.ok``), failures, truncated
  outputs, total and mean duration of a call.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import msgspec

from kernelflow.projections.metrics import AgentTally, MetricsProjection, TaskMetrics, ToolTally
from kernelflow.projections.speedups import counted

DEFAULT_FAST_P: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


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
    speedups_measured: int  # conclusive speedups of correct tasks: the geomean's
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
    # Correct tasks whose speedup was inconclusive: left out of fast_p's hits and the
    # geomean (the machine was busy, or no difference could be told).
    speedups_inconclusive: int = 0


def fast_p(
    tasks: Sequence[TaskMetrics], p: float, verifier_version: int | None = None
) -> float | None:
    """The share of ended tasks (faults left out) whose kernel is correct and, by a
    conclusive speedup, more than ``p`` times faster than the baseline; None without such
    tasks, or for ``p > 0`` when none was timed. (:func:`inconclusive` counts the
    correct ones an inconclusive timing kept out.)"""
    outcomes = [o for t in tasks if t.ended and not (o := t.outcome(verifier_version)).fault]
    if not outcomes or (p > 0 and all(o.speedup is None for o in outcomes)):
        return None
    hits = sum(
        1
        for o in outcomes
        if o.status == "success"
        and (p == 0 or ((s := counted(o.speedup, o.speedup_conclusive)) is not None and s > p))
    )
    return hits / len(outcomes)


def inconclusive(tasks: Iterable[TaskMetrics], verifier_version: int | None = None) -> int:
    """The ended, correct tasks whose speedup was inconclusive (faults left out)."""
    return sum(
        1
        for t in tasks
        if t.ended
        and (o := t.outcome(verifier_version)).status == "success"
        and not o.fault
        and o.speedup is not None
        and o.speedup_conclusive is False
    )


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
    statuses = Counter(t.status for t in ts)
    verdicts = Counter(v for t in ts for v in t.verdicts)
    reward_sums: dict[str, list[float]] = {}
    for t in ts:
        for name, value in t.rewards.items():
            reward_sums.setdefault(name, []).append(value)
    speedups = [
        s
        for t in correct
        if (s := counted(outcomes[t.task_id].speedup, outcomes[t.task_id].speedup_conclusive))
        is not None
    ]
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
        speedups_inconclusive=inconclusive(ended, verifier_version),
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
