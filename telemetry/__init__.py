"""A daemon's telemetry: Prometheus metrics and OpenTelemetry spans of the work it did,
read off the events it appends (``EventLog``'s ``after_append``), so that every daemon
counts only its own work and nothing is counted twice across daemons. The modules that
need ``prometheus_client`` or the OpenTelemetry SDK (the ``observability`` extra) are
imported only when a daemon is asked for metrics or traces (``kernelflow.host.observability``)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def kernelflow_version() -> str:
    """The installed kernelflow's version, for the daemon's info metric and its traces."""
    try:
        return version("kernelflow")
    except PackageNotFoundError:  # run from a tree that was never installed
        return "unknown"
