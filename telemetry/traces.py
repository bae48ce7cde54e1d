"""A daemon's OpenTelemetry spans, built from the events it appends.

One trace per task: a ``task`` span (submission to end), under it a ``step AGENT`` span
per agent step (dispatch to result) and a ``decide`` span per routing decision (trigger
to decision), and under a step its ``chat MODEL`` (LLM call), ``tool TOOL`` and
``sandbox run`` (a verification) spans. Each span is built, with its recorded start and
end, by the daemon that appends the event ending it: the conductor's daemon the task's
and the decisions', an agent's daemon its steps and calls. The ids come from the log, not
from a process: the trace id from the task id, a step's span id from its dispatch id,
other spans' from their event id (``trace_id_of``, ``span_id_of``). So spans that
different daemons record for one task join one trace, each under its parent, and an
event recorded twice (it never is) would make the same span.

Attributes are ids, names, counts, durations, verdicts and statuses: never a prompt, an
answer, code, a reason text or a credential. Spans go to a ``BatchSpanProcessor`` per
exporter, which exports them from its own thread; on the bridge loop an event costs the
building of its span and a queue append.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    AgentDispatched,
    ConductorDecided,
    Event,
    LLMCalled,
    TaskFinished,
    ToolCalled,
    VerificationCompleted,
)
from kernelflow.telemetry import kernelflow_version
from kernelflow.telemetry.steps import cause_of, dispatch_of, routed, submitted_of

EXPORTERS: dict[str, Callable[[], SpanExporter]] = {
    # Configured by OTel's own variables (OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS…).
    "otlp": OTLPSpanExporter,
    "console": ConsoleSpanExporter,
}
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_ERROR = Status(StatusCode.ERROR)
_UNSET = Status(StatusCode.UNSET)


def trace_id_of(task_id: str) -> int:
    """The id of a task's trace: the same in every daemon, and in any tool that reads the
    log (a link from a task to its trace needs nothing else)."""
    return _id(16, "trace", task_id)


def span_id_of(*key: str) -> int:
    """A span's id from what names it in the log: ("task", TASK_ID), ("step", DISPATCH_ID)
    or ("event", EVENT_ID)."""
    return _id(8, *key)


def _id(size: int, *parts: str) -> int:
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=size).digest()
    return int.from_bytes(digest, "big") or 1  # 0 is no id


def _ns(at: float) -> int:
    return int(at * 1e9)


class EventTracer:
    """Turns the events a daemon appends into spans for ``exporters`` (names of
    ``EXPORTERS``)."""

    def __init__(self, exporters: Sequence[str], daemon_id: str) -> None:
        self._processors = [BatchSpanProcessor(EXPORTERS[name]()) for name in exporters]
        self._resource = _resource(daemon_id)
        self._scope = InstrumentationScope("kernelflow", kernelflow_version())
        # The span an event this daemon just recorded ends, if any (on the bridge loop).
        self.after_append = routed(
            {
                LLMCalled: self._llm_called,
                ToolCalled: self._tool_called,
                ConductorDecided: self._decided,
            },
            self._step_ended,
            self._ended,
        )

    def close(self, timeout_s: float = 5.0) -> None:
        """Export what is still queued (up to ``timeout_s`` per exporter), then stop."""
        for processor in self._processors:
            processor.force_flush(int(timeout_s * 1000))
            processor.shutdown()

    # ------------------------------------------------------------------ spans

    def _ended(self, event: Event, status: str, history: TaskHistory) -> None:
        submitted = submitted_of(history)
        attributes: dict[str, Any] = {
            "kernelflow.status": status,
            "kernelflow.steps": sum(type(e) is AgentDispatched for e in history.events),
        }
        if submitted is not None:
            attributes["kernelflow.task_name"] = submitted.task_name
            attributes["kernelflow.workflow"] = submitted.workflow_name
        if type(event) is TaskFinished and event.verdict is not None:
            attributes["kernelflow.verdict"] = event.verdict
        start = history.events[0].at
        self._span(
            "task", event, ("task", event.task_id), None, start, attributes, status != "success"
        )

    def _step_ended(self, event: Any, outcome: str, history: TaskHistory) -> None:
        dispatched = dispatch_of(history, event.dispatch_id)
        step_key = ("step", event.dispatch_id)
        if dispatched is not None:
            attributes = {
                "kernelflow.agent": event.agent,
                "kernelflow.step": dispatched.step,
                "kernelflow.dispatch_id": event.dispatch_id,
                "kernelflow.outcome": outcome,
            }
            if type(event) is VerificationCompleted:
                attributes["kernelflow.verdict"] = event.report.verdict
            task_key = ("task", event.task_id)
            error = outcome == "failed"
            self._span(
                f"step {event.agent}", event, step_key, task_key, dispatched.at, attributes, error
            )
        if type(event) is VerificationCompleted:
            report = event.report
            sandbox = {
                "kernelflow.agent": event.agent,
                "kernelflow.verdict": report.verdict,
                "kernelflow.device": report.device,
                "kernelflow.backend": report.backend,
                "kernelflow.trials": report.trials,
            }
            if report.speedup is not None:
                sandbox["kernelflow.speedup"] = report.speedup
                if report.speedup_conclusive is not None:
                    sandbox["kernelflow.speedup_conclusive"] = report.speedup_conclusive
            start = event.at - report.duration_s
            self._span("sandbox run", event, ("event", event.event_id), step_key, start, sandbox)

    def _llm_called(self, event: LLMCalled, history: TaskHistory) -> None:
        attributes: dict[str, Any] = {
            "kernelflow.agent": event.agent,
            "gen_ai.system": event.provider,
            "gen_ai.request.model": event.model,
            "gen_ai.usage.input_tokens": event.usage.input_tokens,
            "gen_ai.usage.output_tokens": event.usage.output_tokens,
            "kernelflow.llm.retries": event.retries,
        }
        if event.stop_reason:
            attributes["gen_ai.response.finish_reasons"] = (event.stop_reason,)
        if event.cost_usd is not None:
            attributes["kernelflow.llm.cost_usd"] = event.cost_usd
        start = event.at - event.latency_s
        parent = self._step_or_task(event.task_id, event.dispatch_id, history)
        key = ("event", event.event_id)
        self._span(
            f"chat {event.model}", event, key, parent, start, attributes, kind=SpanKind.CLIENT
        )

    def _tool_called(self, event: ToolCalled, history: TaskHistory) -> None:
        attributes = {"kernelflow.agent": event.agent, "kernelflow.tool": event.tool}
        parent = self._step_or_task(event.task_id, event.dispatch_id, history)
        start = event.at - event.duration_s
        key = ("event", event.event_id)
        self._span(f"tool {event.tool}", event, key, parent, start, attributes, not event.ok)

    def _decided(self, event: ConductorDecided, history: TaskHistory) -> None:
        trigger = cause_of(history, event)
        attributes = {
            "kernelflow.decision.mode": event.mode,
            "kernelflow.decision.after": event.after_agent,
            "kernelflow.decision.chosen": event.chosen,
        }
        start = event.at if trigger is None else trigger.at
        key, parent = ("event", event.event_id), ("task", event.task_id)
        self._span("decide", event, key, parent, start, attributes)

    @staticmethod
    def _step_or_task(task_id: str, dispatch_id: str, history: TaskHistory) -> tuple[str, str]:
        """A call's parent: its agent's step, or the task for the conductor's own calls
        (their ``dispatch_id`` names a decision point, not a dispatch)."""
        if dispatch_of(history, dispatch_id) is not None:
            return ("step", dispatch_id)
        return ("task", task_id)

    def _span(
        self,
        name: str,
        event: Event,
        key: tuple[str, str],
        parent: tuple[str, str] | None,
        start: float,
        attributes: dict[str, Any],
        error: bool = False,
        kind: SpanKind = SpanKind.INTERNAL,
    ) -> None:
        trace_id = trace_id_of(event.task_id)
        span = ReadableSpan(
            name=name,
            context=SpanContext(trace_id, span_id_of(*key), False, _SAMPLED),
            parent=(
                None
                if parent is None
                else SpanContext(trace_id, span_id_of(*parent), True, _SAMPLED)
            ),
            resource=self._resource,
            attributes={"kernelflow.task_id": event.task_id, **attributes},
            kind=kind,
            status=_ERROR if error else _UNSET,
            start_time=_ns(min(start, event.at)),
            end_time=_ns(event.at),
            instrumentation_scope=self._scope,
        )
        for processor in self._processors:
            processor.on_end(span)


def _resource(daemon_id: str) -> Resource:
    """What the spans say of their daemon: OTel's defaults, then kernelflow's (service
    ``kernelflow``, the daemon's id as ``kernelflow health`` shows it), then what
    OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES set, which win."""
    ours = Resource(
        {
            "service.name": "kernelflow",
            "service.instance.id": daemon_id,
            "service.version": kernelflow_version(),
        }
    )
    return Resource.create().merge(ours).merge(OTELResourceDetector().detect())
