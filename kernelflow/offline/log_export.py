"""``kernelflow log export``: events from a source to a portable log file."""

from __future__ import annotations

from pathlib import Path

from kernelflow.events.model import Event, QuarantinedEvent
from kernelflow.offline.files import atomic_output, open_write
from kernelflow.offline.sources import EventFilter, Source
from kernelflow.projections import logfile


def export_log(source: Source, out: Path, flt: EventFilter) -> logfile.FileSummary:
    writer = logfile.LogWriter(flt.as_dict())
    tasks: dict[str, int] = {}
    with atomic_output(out) as tmp:
        f = open_write(tmp, out.name)
        with f:
            f.write(writer.header())

            def write(_: int, event: Event) -> None:
                f.write(writer.record(event))  # a quarantined message as its record
                if type(event) is not QuarantinedEvent:
                    tasks[event.task_id] = tasks.get(event.task_id, 0) + 1

            source.feed(write, label="exporting")
            f.write(writer.trailer())
    header = logfile.Header(format=logfile.FORMAT, version=logfile.VERSION, filter=flt.as_dict())
    quarantined = source.quarantine.count
    return logfile.FileSummary(header, writer.records, writer._hash.hexdigest(), tasks, quarantined)
