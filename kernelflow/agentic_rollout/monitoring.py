"""Monitoring of AgenticRollout's runs (docs/agents.md, "Monitoring"):
``PerformanceMetrics``, ``MetricsCollector``, and what ``agent.metrics`` lists (the health
checks: ``health.py``).

Every number but the process's memory and CPU is a fold of the log's events (the runs'
``task_submitted``, ``llm_called``, ``tool_called``, ``output_parsed``, ``task_finished``,
``reward_assigned``...), never of objects in memory: a collector rebuilt from a saved log
(``MetricsCollector.from_log_file``) reads the same numbers as the one that watched the
runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import sys
import time
import weakref
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelflow.agentic_rollout.analysis import TrajectoryAnalyzer
from kernelflow.agentic_rollout.recording import RunLog
from kernelflow.events import subjects
from kernelflow.events.codec import decode_event
from kernelflow.events.memory import MemoryEventLog
from kernelflow.events.model import (
    Event,
    LLMCalled,
    OutputParsed,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.offline.files import file_events
from kernelflow.projections.trajectory import build_trajectory


@dataclass
class PerformanceMetrics:
    """Seed 003 §10.1, over every run a collector has seen. Times in seconds."""

    total_execution_time: float  # the ended runs' durations, summed
    avg_step_time: float  # per LLM or tool call
    llm_call_time: float  # the LLM calls' latencies, summed
    tool_execution_time: float  # the tool calls' durations, summed
    completion_rate: float  # of the ended runs, the share that gave an answer
    avg_steps_per_trajectory: float  # steps of each run's trajectory (as the log folds it)
    tool_usage_rate: float  # the share of runs that called a tool
    error_rate: float  # the share of tool calls that failed
    memory_usage_mb: float  # the process's resident memory now (not from the log)
    cpu_usage_percent: float  # the process's CPU time over the collector's life (not from the log)
    concurrent_requests: int  # runs started and not ended
    total_tokens_used: int  # input and output tokens of every LLM call
    estimated_cost_usd: float  # the priced LLM calls' cost (docs/llm.md: the price table)


@dataclass
class _Run:
    events: list[Event] = dataclasses.field(default_factory=list)
    record: dict[str, Any] | None = None  # its numbers, until another event comes

    def numbers(self, task_id: str) -> dict[str, Any]:
        if self.record is None:
            self.record = _record(task_id, self.events)
        return self.record


class MetricsCollector:
    """Per-run records and ``PerformanceMetrics``, folded from the log's events: fed by
    ``apply``/``feed``, by ``refresh`` from the ``RunLog`` it watches, or read from a saved
    log (``from_log_file``). ``track_execution`` times operations of one's own
    (``current_session``); ``track_trajectory`` appends a run's record to
    ``metrics_history``."""

    def __init__(self, run_log: RunLog | None = None) -> None:
        self.metrics_history: list[dict[str, Any]] = []
        self.current_session: dict[str, dict[str, float]] = {}
        self.run_log = run_log
        self._runs: dict[str, _Run] = {}
        self._read: MemoryEventLog | None = None  # the log object read so far, and how far
        self._position = 0
        self._started = time.monotonic()
        self._cpu_started = _cpu_seconds()

    # ------------------------------------------------------------------ feeding

    def apply(self, event: Event) -> None:
        """Fold one event (those of tasks not seen submitted are left out)."""
        if isinstance(event, TaskSubmitted):
            self._runs.setdefault(event.task_id, _Run())
        run = self._runs.get(event.task_id)
        if run is not None:
            run.events.append(event)
            run.record = None

    def feed(self, events: Iterable[Event]) -> None:
        for event in events:
            self.apply(event)

    def refresh(self) -> None:
        """Read what the watched ``RunLog`` recorded since the last read (a log that
        ``save`` replaced is read from its start)."""
        if self.run_log is None:
            return
        log = self.run_log.log
        if log is not self._read:
            self._read, self._position = log, 0
        stored = log.streams.messages(self._position + 1, subjects.ALL_EVENTS)
        for seq, _, data in stored:
            self.apply(decode_event(data))
            self._position = seq

    @classmethod
    def from_events(cls, events: Iterable[Event]) -> MetricsCollector:
        collector = cls()
        collector.feed(events)
        return collector

    @classmethod
    def from_log_file(cls, path: str | Path) -> MetricsCollector:
        """A collector of the runs in a saved log (``AgenticRollout.save_log``, ``kernelflow
        log export``)."""
        return cls.from_events(event for _, event in file_events(Path(path)))

    # ------------------------------------------------------------------ reading

    def runs(self, agent: str | None = None) -> list[dict[str, Any]]:
        """A record per run (of agent ``agent``, if given), in the order they started."""
        self.refresh()
        records = [dict(run.numbers(task_id)) for task_id, run in self._runs.items()]
        return [r for r in records if agent is None or r["agent_type"] == agent]

    def performance_metrics(self) -> PerformanceMetrics:
        records = self.runs()
        ended = [r for r in records if r["execution_time"] is not None]
        calls = sum(r["llm_calls"] + r["tool_calls"] for r in records)
        llm_time = sum(r["llm_call_time"] for r in records)
        tool_time = sum(r["tool_execution_time"] for r in records)
        tool_calls = sum(r["tool_calls"] for r in records)
        failed = sum(
            perf["call_count"] - perf["success_count"]
            for r in records
            for perf in r["tool_performance"].values()
        )
        wall = time.monotonic() - self._started
        return PerformanceMetrics(
            total_execution_time=sum(r["execution_time"] for r in ended),
            avg_step_time=(llm_time + tool_time) / calls if calls else 0.0,
            llm_call_time=llm_time,
            tool_execution_time=tool_time,
            completion_rate=_share(sum(r["completion_status"] for r in ended), len(ended)),
            avg_steps_per_trajectory=_share(sum(r["total_steps"] for r in records), len(records)),
            tool_usage_rate=_share(sum(1 for r in records if r["tool_calls"]), len(records)),
            error_rate=_share(failed, tool_calls),
            memory_usage_mb=resident_mb(),
            cpu_usage_percent=100.0 * (_cpu_seconds() - self._cpu_started) / wall if wall else 0.0,
            concurrent_requests=len(records) - len(ended),
            total_tokens_used=sum(r["tokens"] for r in records),
            estimated_cost_usd=sum(r["cost_usd"] for r in records),
        )

    # ------------------------------------------------------------------ the seed's API

    @contextlib.contextmanager
    def track_execution(self, operation_name: str) -> Iterator[None]:
        """Time the block, and the change of the process's resident memory, under
        ``current_session[operation_name]``."""
        start_time, start_memory = time.time(), resident_mb()
        try:
            yield
        finally:
            end_time = time.time()
            self.current_session[operation_name] = {
                "execution_time": end_time - start_time,
                "memory_delta": resident_mb() - start_memory,
                "timestamp": end_time,
            }

    async def track_trajectory(self, trajectory: Any, agent_type: str) -> dict[str, Any]:
        """The record of the run ``trajectory`` is (its ``metadata["task_id"]``, else its
        ``request_id``) as the log holds it, appended to ``metrics_history``."""
        task_id = str(trajectory.metadata.get("task_id") or trajectory.request_id)
        self.refresh()
        run = self._runs.get(task_id)
        if run is None:
            raise ValueError(f"track_trajectory: run {task_id!r} is not in this collector's log")
        metrics = {**run.numbers(task_id), "agent_type": agent_type}
        self.metrics_history.append(metrics)
        return metrics


_COLLECTORS: weakref.WeakKeyDictionary[RunLog, MetricsCollector] = weakref.WeakKeyDictionary()


def collector_of(run_log: RunLog) -> MetricsCollector:
    """The collector that watches ``run_log`` (one per log)."""
    if run_log not in _COLLECTORS:
        _COLLECTORS[run_log] = MetricsCollector(run_log)
    return _COLLECTORS[run_log]


def _record(task_id: str, events: list[Event]) -> dict[str, Any]:
    """One run's numbers, from its events."""
    submitted = next(e for e in events if isinstance(e, TaskSubmitted))
    finished = next((e for e in events if isinstance(e, TaskFinished)), None)
    llm = [e for e in events if isinstance(e, LLMCalled)]
    tools = [e for e in events if isinstance(e, ToolCalled)]
    performance: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"call_count": 0, "success_count": 0, "total_time": 0.0}
    )
    for call in tools:
        perf = performance[call.tool]
        perf["call_count"] += 1
        perf["success_count"] += int(call.ok)
        perf["total_time"] += call.duration_s
    trajectory = build_trajectory(task_id, events)
    breakdown: dict[str, int] = defaultdict(int)
    for step in trajectory.steps:
        breakdown[step.step_type.value] += 1
    return {
        "trajectory_id": submitted.task_name,
        "task_id": task_id,
        "agent_type": str(submitted.metadata.get("agent", "")),
        "total_steps": len(trajectory.steps),
        "completion_status": any(isinstance(e, OutputParsed) for e in events),
        "final_reward": trajectory.final_reward,
        "execution_time": None if finished is None else finished.at - submitted.at,
        "llm_calls": len(llm),
        "llm_call_time": sum(e.latency_s for e in llm),
        "tool_calls": len(tools),
        "tool_execution_time": sum(e.duration_s for e in tools),
        "tokens": sum(e.usage.input_tokens + e.usage.output_tokens for e in llm),
        "cost_usd": sum(e.cost_usd or 0.0 for e in llm),
        "step_breakdown": dict(breakdown),
        "efficiency_metrics": TrajectoryAnalyzer.analyze_efficiency(trajectory),
        "tool_performance": {name: dict(p) for name, p in performance.items()},
    }


def _share(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def resident_mb() -> float:
    """The process's resident memory (Linux: now; elsewhere: its peak)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 1024 / 1024
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB; bytes on macOS
        return peak / 1024 / (1024 if sys.platform == "darwin" else 1)


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system
