"""A daemon's telemetry, put together from its configuration (docs/observability.md):
Prometheus metrics served on ``--metrics-port`` (``KF_METRICS_PORT``), and OpenTelemetry
spans when OTel's standard environment names an exporter (``trace_exporters``).

Both are off by default, and then neither ``prometheus_client`` nor the OpenTelemetry SDK
is imported: a daemon without the ``observability`` extra starts as before, and its
appends pay nothing. Asked for but not installed, each says in one line what to install.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import Daemon
from kernelflow.actors.readmodel import ReadModel
from kernelflow.actors.worker import Message
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import Event
from kernelflow.host.exits import UsageError
from kernelflow.host.runtime import AppendHook
from kernelflow.host.settings import Settings

if TYPE_CHECKING:  # imported at run time only when asked for (the observability extra)
    from kernelflow.telemetry.prometheus import DaemonMetrics, MetricsServer
    from kernelflow.telemetry.traces import EventTracer

log = logging.getLogger("kernelflow.host.observability")

INSTALL = "pip install 'kernelflow[observability]'"
# Span exporters a daemon can use, by OTEL_TRACES_EXPORTER's names: "otlp" is OTLP over
# HTTP (protobuf), configured by OTel's OTEL_EXPORTER_OTLP_* variables.
SPAN_EXPORTERS = ("otlp", "console")


def trace_exporters(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The span exporters OTel's standard environment asks for: those OTEL_TRACES_EXPORTER
    names (comma-separated; "none": none), or "otlp" when it is unset and an OTLP endpoint
    is (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT). None at all
    when nothing is set, or with OTEL_SDK_DISABLED=true. UsageError for what kernelflow
    cannot export with."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return ()
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT"
        )
        raw = "otlp" if endpoint else "none"
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    for name in names:
        if name not in (*SPAN_EXPORTERS, "none"):
            raise UsageError(
                f"OTEL_TRACES_EXPORTER={raw!r}: kernelflow exports spans with "
                f"{', '.join(SPAN_EXPORTERS)} (or none), not {name!r}"
            )
    chosen = tuple(dict.fromkeys(n for n in names if n != "none"))
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if "otlp" in chosen and protocol != "http/protobuf":
        raise UsageError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: kernelflow sends spans over "
            "http/protobuf only; point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's OTLP "
            "HTTP port (4318)"
        )
    return chosen


class Telemetry:
    """What a daemon reports: its metrics (and their server) and its tracer, each None
    when not asked for."""

    def __init__(
        self,
        metrics: DaemonMetrics | None = None,
        server: MetricsServer | None = None,
        tracer: EventTracer | None = None,
    ) -> None:
        self.metrics = metrics
        self.server = server
        self.tracer = tracer
        self._failed: set[str] = set()

    @property
    def after_append(self) -> AppendHook | None:
        """What sees each event the daemon appends (None: nothing to do)."""
        hooks = [h.after_append for h in (self.metrics, self.tracer) if h is not None]
        return self._guarded(hooks) if hooks else None

    @property
    def on_message(self) -> Callable[[str, Message], None] | None:
        return self.metrics.on_message if self.metrics is not None else None

    def watch(
        self, bridge: Bridge, daemon: Daemon, read_model: ReadModel | None, daemon_id: str
    ) -> None:
        if self.metrics is not None:
            self.metrics.watch(bridge, daemon, read_model, daemon_id)

    def close(self) -> None:
        """Stop serving metrics; export the spans still queued."""
        if self.server is not None:
            self.server.close()
        if self.tracer is not None:
            self.tracer.close()

    def _guarded(self, hooks: Iterable[AppendHook]) -> AppendHook:
        """The hooks, one after the other, none of them able to fail an append: a bug in
        telemetry is logged (its first time with the traceback), never the log's error."""
        hooks = tuple(hooks)

        def observe(event: Event, history: TaskHistory) -> None:
            for hook in hooks:
                try:
                    hook(event, history)
                except Exception:
                    name = getattr(hook, "__qualname__", repr(hook))
                    first = name not in self._failed
                    self._failed.add(name)
                    log.warning("telemetry: %s failed on %s", name, event.kind, exc_info=first)

        return observe


def start_telemetry(
    settings: Settings,
    roles: Iterable[str],
    daemon_id: str,
    environ: Mapping[str, str] = os.environ,
) -> Telemetry:
    """The telemetry ``settings`` and OTel's ``environ`` ask for, its metrics already
    served (so that a port in use ends the command before it connects to anything)."""
    exporters = trace_exporters(environ)
    telemetry = Telemetry()
    if settings.metrics_port is not None:
        try:
            from kernelflow.telemetry.prometheus import DaemonMetrics
        except ImportError as exc:
            raise UsageError(
                f"--metrics-port needs prometheus_client, which is not installed ({exc.name}): "
                f"{INSTALL}"
            ) from None
        host, port = settings.metrics_host, settings.metrics_port
        telemetry.metrics = DaemonMetrics(roles)
        try:
            telemetry.server = telemetry.metrics.serve(host, port)
        except OSError as exc:
            raise UsageError(
                f"metrics: cannot listen on {host}:{port} ({exc.strerror or exc}); choose "
                "another --metrics-port (KF_METRICS_PORT)"
            ) from None
        log.info("metrics on http://%s:%d/metrics", host, port)
    if exporters:
        try:
            from kernelflow.telemetry.traces import EventTracer
        except ImportError as exc:
            telemetry.close()
            raise UsageError(
                f"OTEL_* settings ask for traces, but the OpenTelemetry SDK is not installed "
                f"({exc.name}): {INSTALL}"
            ) from None
        telemetry.tracer = EventTracer(exporters, daemon_id)
        log.info("traces: spans of each task go to %s", ", ".join(exporters))
    return telemetry
