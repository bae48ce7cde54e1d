"""A daemon's Prometheus metrics: the work it did, and how its queues stand.

Counters and histograms are read off the events this daemon appends (``after_append``,
on the bridge loop, a few microseconds an event): the conductor that records a task's end
counts the task, the agent that records a step's result counts the step and its LLM and
tool calls, the verifier that records a verdict counts the verification. Each event is
recorded once, by one daemon, so sums over daemons count everything once.

Gauges are read when Prometheus scrapes (``watch``): the pools' busy actors, the work its
consumers have not delivered yet or not had acknowledged, the read model's position and
the log's end. They take one trip to the bridge loop, whose NATS requests are awaited
there (never blocking it), bounded by ``SCRAPE_TIMEOUT_S``. Work waiting in a consumer is
the same number in every daemon that shares it: aggregate those with ``max``, not ``sum``.

Every metric lives in the daemon's own registry (several daemons may share a process).
Labels are agents, models, tools, verdicts, statuses and roles: never a task id, a
prompt, a URL or a key. docs/observability.md lists every metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, get_args
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import Daemon, PoolLoad
from kernelflow.actors.readmodel import ReadModel
from kernelflow.actors.worker import Message
from kernelflow.events import subjects
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    ConductorDecided,
    Event,
    LLMCalled,
    TaskStatus,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.telemetry import kernelflow_version
from kernelflow.telemetry.steps import (
    cause_of,
    dispatch_of,
    gave_up_role,
    routed,
    submitted_of,
)

log = logging.getLogger("kernelflow.metrics")

# How long a scrape waits for the loop's answer (consumers, the log's end).
SCRAPE_TIMEOUT_S = 2.0
# Buckets, seconds: a step, an LLM call, a tool call, a verification (tens of ms to half
# an hour); a whole task; a routing decision (a millisecond to seconds).
WORK_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
TASK_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_TOKEN_TYPES = ("input", "output", "cache_read", "cache_creation")
M = TypeVar("M", Counter, Histogram)


class _Labelled(Generic[M]):
    """A labelled metric whose children are looked up in a dict of its own:
    prometheus_client's ``labels`` checks its arguments and takes a lock on every call,
    which was most of what counting an event cost the bridge loop (one thread: the loop's
    hooks, and the constructor, fill the dict)."""

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def labels(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self._metric.labels(*values)
        return child


class DaemonMetrics:
    """The metrics of one daemon, in a registry of its own."""

    def __init__(self, roles: Iterable[str] = ()) -> None:
        disable_created_metrics()  # a ``_created`` series per counter: noise here
        self.registry = r = CollectorRegistry()
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self.info = Info("kernelflow_daemon", "This daemon: id, roles, version", registry=r)
        self.appended = _Labelled(
            Counter(
                "kernelflow_events_appended",
                "Events this daemon appended, by kind",
                ["kind"],
                registry=r,
            )
        )
        self.submitted = Counter(
            "kernelflow_tasks_submitted", "Tasks this daemon's conductors took in", registry=r
        )
        self.finished = _Labelled(
            Counter(
                "kernelflow_tasks_finished",
                "Tasks whose end this daemon recorded, by status",
                ["status"],
                registry=r,
            )
        )
        self.task_seconds = _Labelled(
            Histogram(
                "kernelflow_task_duration_seconds",
                "From a task's submission to its end, by status",
                ["status"],
                buckets=TASK_BUCKETS,
                registry=r,
            )
        )
        self.step_seconds = _Labelled(
            Histogram(
                "kernelflow_step_duration_seconds",
                "Agent steps this daemon finished, from dispatch to result (its _count counts "
                "steps), by agent and outcome (ok, parse_failed, failed)",
                ["agent", "outcome"],
                buckets=WORK_BUCKETS,
                registry=r,
            )
        )
        self.llm_seconds = _Labelled(
            Histogram(
                "kernelflow_llm_call_duration_seconds",
                "LLM calls this daemon made (its _count counts calls), by agent and model",
                ["agent", "model"],
                buckets=WORK_BUCKETS,
                registry=r,
            )
        )
        self.llm_tokens = _Labelled(
            Counter(
                "kernelflow_llm_tokens",
                "Tokens of this daemon's LLM calls, by agent, model and type "
                "(input, output, cache_read, cache_creation)",
                ["agent", "model", "type"],
                registry=r,
            )
        )
        self.llm_cost = _Labelled(
            Counter(
                "kernelflow_llm_cost_usd",
                "Price of this daemon's LLM calls from the configured price table, USD",
                ["agent", "model"],
                registry=r,
            )
        )
        self.llm_retries = _Labelled(
            Counter(
                "kernelflow_llm_retries",
                "Failed attempts (429, overloaded, 5xx, timeouts) retried before an answer",
                ["agent", "model"],
                registry=r,
            )
        )
        self.tool_seconds = _Labelled(
            Histogram(
                "kernelflow_tool_call_duration_seconds",
                "Tool calls this daemon made (its _count counts calls), by agent, tool and "
                "outcome (ok, error)",
                ["agent", "tool", "outcome"],
                buckets=WORK_BUCKETS,
                registry=r,
            )
        )
        self.verify_seconds = _Labelled(
            Histogram(
                "kernelflow_verification_duration_seconds",
                "Verifications this daemon recorded (its _count counts them), by verdict "
                "and device",
                ["verdict", "device"],
                buckets=WORK_BUCKETS,
                registry=r,
            )
        )
        self.decision_seconds = _Labelled(
            Histogram(
                "kernelflow_decision_latency_seconds",
                "From the event that called for a routing decision to the decision this daemon "
                "recorded, by mode (auto, llm, retry, limit, fallback)",
                ["mode"],
                buckets=DECISION_BUCKETS,
                registry=r,
            )
        )
        self.redeliveries = _Labelled(
            Counter(
                "kernelflow_redeliveries",
                "Messages this daemon took that had been delivered before (a daemon died "
                "holding them, or their work failed and is retried), by role",
                ["role"],
                registry=r,
            )
        )
        self.give_ups = _Labelled(
            Counter(
                "kernelflow_give_ups",
                "Work this daemon gave up on after its last delivery, recorded as a "
                "failure, by role",
                ["role"],
                registry=r,
            )
        )
        # Series a dashboard expects from the start, at zero.
        for status in get_args(TaskStatus):
            self.finished.labels(status)
        for role in roles:
            self.redeliveries.labels(role)
            self.give_ups.labels(role)
        self._count = routed(
            {
                TaskSubmitted: self._submitted,
                LLMCalled: self._llm_called,
                ToolCalled: self._tool_called,
                ConductorDecided: self._decided,
            },
            self._step_ended,
            self._ended,
        )

    # ------------------------------------------------------------------ events

    def after_append(self, event: Event, history: TaskHistory) -> None:
        """Count an event this daemon just recorded (on the bridge loop)."""
        self.appended.labels(event.kind).inc()
        self._count(event, history)

    def on_message(self, role: str, message: Message) -> None:
        """Count a message the daemon took up (``DaemonConfig.on_message``, on the loop)."""
        if message.deliveries > 1:
            self.redeliveries.labels(role).inc()

    def _submitted(self, _event: TaskSubmitted, _history: TaskHistory) -> None:
        self.submitted.inc()

    def _ended(self, event: Event, status: str, history: TaskHistory) -> None:
        self.finished.labels(status).inc()
        if (submitted := submitted_of(history)) is not None:
            self.task_seconds.labels(status).observe(max(0.0, event.at - submitted.at))
        if (role := gave_up_role(event)) is not None:
            self.give_ups.labels(role).inc()

    def _step_ended(self, event: Any, outcome: str, history: TaskHistory) -> None:
        if (dispatched := dispatch_of(history, event.dispatch_id)) is not None:
            elapsed = max(0.0, event.at - dispatched.at)
            self.step_seconds.labels(event.agent, outcome).observe(elapsed)
        if type(event) is VerificationCompleted:
            report = event.report
            self.verify_seconds.labels(report.verdict, report.device).observe(report.duration_s)
        elif (role := gave_up_role(event)) is not None:
            self.give_ups.labels(role).inc()

    def _llm_called(self, event: LLMCalled, _history: TaskHistory) -> None:
        labels = (event.agent, event.model)
        self.llm_seconds.labels(*labels).observe(event.latency_s)
        u = event.usage
        counts = (
            u.input_tokens,
            u.output_tokens,
            u.cache_read_input_tokens,
            u.cache_creation_input_tokens,
        )
        for token_type, count in zip(_TOKEN_TYPES, counts, strict=True):
            if count:
                self.llm_tokens.labels(*labels, token_type).inc(count)
        if event.cost_usd:
            self.llm_cost.labels(*labels).inc(event.cost_usd)
        if event.retries:
            self.llm_retries.labels(*labels).inc(event.retries)

    def _tool_called(self, event: ToolCalled, _history: TaskHistory) -> None:
        outcome = "ok" if event.ok else "error"
        self.tool_seconds.labels(event.agent, event.tool, outcome).observe(event.duration_s)

    def _decided(self, event: ConductorDecided, history: TaskHistory) -> None:
        if (trigger := cause_of(history, event)) is not None:
            self.decision_seconds.labels(event.mode).observe(max(0.0, event.at - trigger.at))

    # ------------------------------------------------------------------ live gauges

    def watch(
        self, bridge: Bridge, daemon: Daemon, read_model: ReadModel | None, daemon_id: str
    ) -> None:
        """Report how ``daemon``'s queues (and ``read_model``) stand at every scrape."""
        self.info.info(
            {
                "daemon_id": daemon_id,
                "roles": ",".join(daemon.config.roles),
                "version": kernelflow_version(),
            }
        )
        self.registry.register(_LiveGauges(bridge, daemon, read_model))

    def serve(self, host: str, port: int) -> MetricsServer:
        """Serve the registry on http://host:port/metrics (any path, in fact). Raises
        OSError when the address cannot be had (the port is in use)."""
        server, thread = start_http_server(port, host, self.registry)
        return MetricsServer(server, thread)


@dataclass(frozen=True)
class MetricsServer:
    server: WSGIServer
    thread: threading.Thread

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@dataclass(frozen=True)
class _Snapshot:
    connected: bool
    loads: list[PoolLoad]
    # Per consumer: messages not delivered yet, and delivered but not acknowledged.
    consumers: dict[str, tuple[int, int]]
    log_end: int | None
    read_model: dict[str, Any] | None


class _LiveGauges(Collector):
    """Gauges read from the daemon, the read model and JetStream at each scrape."""

    def __init__(self, bridge: Bridge, daemon: Daemon, read_model: ReadModel | None) -> None:
        self.bridge = bridge
        self.daemon = daemon
        self.read_model = read_model

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.bridge.call(self._snapshot(), timeout=SCRAPE_TIMEOUT_S + 1)
        except Exception as exc:  # the loop is stopping, or stuck: the counters still go out
            log.debug("metrics: no live gauges this scrape: %r", exc)
            return
        yield _gauge(
            "kernelflow_nats_connected", "1 while the NATS connection is up", snap.connected
        )
        by_pool = ["role", "consumer"]
        actors = GaugeMetricFamily(
            "kernelflow_pool_actors", "Actors in this daemon's pool", None, by_pool
        )
        busy = GaugeMetricFamily(
            "kernelflow_pool_busy_actors", "Actors holding a message", None, by_pool
        )
        held = GaugeMetricFamily(
            "kernelflow_pool_waiting_messages",
            "Messages this daemon took while every actor of the pool was busy",
            None,
            by_pool,
        )
        pending = GaugeMetricFamily(
            "kernelflow_consumer_pending_messages",
            "Work not delivered yet by a shared consumer (the same in every daemon that "
            "consumes it: aggregate with max)",
            None,
            by_pool,
        )
        unacked = GaugeMetricFamily(
            "kernelflow_consumer_unacked_messages",
            "Work a shared consumer delivered that no daemon has finished yet (aggregate with max)",
            None,
            by_pool,
        )
        for load in snap.loads:
            labels = [load.role, load.consumer]
            actors.add_metric(labels, load.actors)
            busy.add_metric(labels, load.busy)
            held.add_metric(labels, load.waiting)
            if (counts := snap.consumers.get(load.consumer)) is not None:
                pending.add_metric(labels, counts[0])
                unacked.add_metric(labels, counts[1])
        yield from (actors, busy, held, pending, unacked)
        if snap.log_end is not None:
            yield _gauge(
                "kernelflow_log_last_sequence",
                f"Stream sequence of the newest message in {subjects.EVENTS_STREAM}",
                snap.log_end,
            )
        if snap.read_model is not None:
            yield _gauge(
                "kernelflow_readmodel_position",
                "Stream sequence this daemon's read model has folded the log through",
                snap.read_model["position"],
            )
            yield _gauge(
                "kernelflow_readmodel_tasks",
                "Tasks in this daemon's read model",
                snap.read_model["tasks"],
            )
            yield _gauge(
                "kernelflow_readmodel_quarantined",
                "Messages of the log the read model met that are not events of their task",
                snap.read_model["quarantined"],
            )

    async def _snapshot(self) -> _Snapshot:
        """On the bridge loop: what the pools and the read model hold now, and what
        JetStream says of the consumers and the log (requests awaited, never blocking)."""
        loads = self.daemon.pool_loads()
        read_model = self.read_model.describe() if self.read_model is not None else None
        connected = self.bridge.connected
        consumers: dict[str, tuple[int, int]] = {}
        log_end = None
        if connected:
            asked = [self.daemon.backlog(load) for load in loads]
            with contextlib.suppress(TimeoutError):
                backlogs, end = await asyncio.wait_for(
                    asyncio.gather(
                        asyncio.gather(*asked, return_exceptions=True),
                        self.bridge.log.end_seq(),
                        return_exceptions=True,
                    ),
                    SCRAPE_TIMEOUT_S,
                )
                if not isinstance(backlogs, BaseException):
                    for load, backlog in zip(loads, backlogs, strict=True):
                        if not isinstance(backlog, BaseException):
                            consumers[load.consumer] = backlog
                if not isinstance(end, BaseException):
                    log_end = end
        return _Snapshot(connected, loads, consumers, log_end, read_model)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
