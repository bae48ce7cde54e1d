"""Where the offline tools read events: an exported file (``FileSource``) or the live
JetStream log (``LiveSource``), narrowed by an ``EventFilter`` (a task, a group, a
workflow, a start position, ``--since``). A message of the log that is not an event of
its task comes as its ``QuarantinedEvent`` placeholder (the projections skip it); a
source counts those it fed (``quarantine``) and says so on stderr when its command is
done with it."""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.events import subjects
from kernelflow.events.model import Event, QuarantinedEvent, TaskSubmitted
from kernelflow.events.port import EventLogPort
from kernelflow.events.quarantine import Quarantine
from kernelflow.host.exits import UsageError
from kernelflow.host.runtime import connected
from kernelflow.host.settings import Settings
from kernelflow.offline.files import file_events, open_blocks, refusing_corrupt
from kernelflow.offline.since import BadTime, iso_utc, parse_since
from kernelflow.progress import ProgressLine, for_terminal
from kernelflow.projections import logfile
from kernelflow.projections.metrics import MetricsProjection

Apply = Callable[[int, Event], object]
# The metadata key naming a candidate's ``kernelflow bench`` run.
BENCH_RUN = "bench"


@dataclass(frozen=True)
class EventFilter:
    task: str | None = None
    group: str | None = None
    workflow: str | None = None
    start_seq: int = 1
    since: float | None = None  # Unix time: only tasks whose first event is at or after it
    bench: str | None = None  # only the candidates of this ``kernelflow bench`` run

    def as_dict(self) -> dict[str, str]:
        out = {
            k: str(v)
            for k, v in asdict(self).items()
            if v is not None and k not in ("start_seq", "since")
        }
        if self.since is not None:
            out["since"] = iso_utc(self.since)
        return out

    @property
    def by_submission(self) -> bool:
        return self.group is not None or self.workflow is not None or self.bench is not None

    def matches_submission(self, e: TaskSubmitted) -> bool:
        return (
            (self.group is None or e.group_id == self.group)
            and (self.workflow is None or e.workflow_name == self.workflow)
            and (self.bench is None or e.metadata.get(BENCH_RUN) == self.bench)
        )


def filter_from(args: argparse.Namespace) -> EventFilter:
    since = None
    if getattr(args, "since", None) is not None:
        try:
            since = parse_since(args.since)
        except BadTime as exc:
            raise UsageError(str(exc)) from exc
    return EventFilter(
        task=getattr(args, "task", None),
        group=getattr(args, "group", None),
        workflow=getattr(args, "workflow", None),
        start_seq=getattr(args, "start_seq", None) or 1,
        since=since,
        bench=getattr(args, "bench", None),
    )


class _Started:
    """The ``--since`` selection while reading in log order: a task is in once its first
    event (``seq`` 1) was read at or after the time; events of older tasks are skipped."""

    def __init__(self, since: float | None, by_event_time: bool) -> None:
        self.since, self.by_event_time = since, by_event_time
        self.tasks: set[str] = set()

    def keeps(self, event: Event) -> bool:
        if self.since is None:
            return True
        if event.seq == 1 and (not self.by_event_time or event.at >= self.since):
            self.tasks.add(event.task_id)
        return event.task_id in self.tasks


# A fold keeps each task's events until the task ends: at the default gen-0 threshold
# (700) the cyclic collector runs every few events and scans those again and again, about
# 5% of a replay's time. Events and projections form no cycles, so collecting rarely
# frees the same memory.
_FOLD_GC_THRESHOLD = 50_000


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """Run the cyclic garbage collector rarely (not never) while folding a log."""
    before = gc.get_threshold()
    gc.set_threshold(_FOLD_GC_THRESHOLD, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


class Source:
    """Where events come from; ``feed`` runs the whole (filtered) range through ``apply``
    and returns the position of the last event read."""

    description: dict[str, Any]
    flt: EventFilter
    # Where a feed shows how far it got (a terminal); None: it does not.
    progress: ProgressLine | None = None
    # The quarantined messages the last feed passed on.
    quarantine = Quarantine()

    def feed(self, apply: Apply, end: int | None = None, *, label: str = "reading") -> int:
        self.quarantine = Quarantine()
        with rare_collections():
            if self.progress is None:
                return self._feed(apply, end)
            with self.progress.phase(label, end or self.last_position()) as update:

                def shown(position: int, event: Event) -> None:
                    apply(position, event)
                    update(position)

                return self._feed(shown, end)

    def _feed(self, apply: Apply, end: int | None) -> int:
        raise NotImplementedError

    def _tally(self, event: Event) -> None:
        if type(event) is QuarantinedEvent:
            self.quarantine = self.quarantine.add(event)

    def last_position(self) -> int:
        """The position of the source's last event now (progress is shown against it)."""
        raise NotImplementedError


class FileSource(Source):
    def __init__(self, path: Path, flt: EventFilter) -> None:
        self.path, self.flt = path, flt
        # The digest first, so that nothing is computed from a modified file; what only
        # decoding shows is refused as the feed reaches it.
        with refusing_corrupt():
            digest = logfile.check_digest(open_blocks(path), name=str(path))
        self.description = {"file": path.name, "sha256": digest.sha256, "records": digest.records}
        if flt.since is not None:
            self.description["since"] = iso_utc(flt.since)
        self._tasks: set[str] | None = None
        if flt.by_submission:
            self._tasks = {
                e.task_id
                for _, e in file_events(path)
                if isinstance(e, TaskSubmitted) and flt.matches_submission(e)
            }

    def last_position(self) -> int:
        return int(self.description["records"])

    def _feed(self, apply: Apply, end: int | None) -> int:
        last = 0
        flt, tasks = self.flt, self._tasks
        started = _Started(flt.since, by_event_time=True)
        for pos, event in file_events(self.path):
            if end is not None and pos > end:
                break
            if pos < flt.start_seq:
                continue
            if flt.task is not None and event.task_id != flt.task:
                continue
            if tasks is not None and event.task_id not in tasks:
                continue
            if not started.keeps(event):
                continue
            self._tally(event)
            apply(pos, event)
            last = pos
        return last


async def live_events(
    log: EventLogPort, flt: EventFilter, end: int | None = None
) -> AsyncGenerator[tuple[int, Event], None]:
    tasks: set[str] | None = None
    if flt.by_submission:
        tasks = set()
        submissions = log.read(subject=f"{subjects.EVENTS_ROOT}.*.task_submitted")
        async with contextlib.aclosing(submissions):
            async for _, e in submissions:
                if isinstance(e, TaskSubmitted) and flt.matches_submission(e):
                    tasks.add(e.task_id)
    subject = subjects.task_events(flt.task) if flt.task else subjects.ALL_EVENTS
    start = flt.start_seq
    if flt.since is not None:
        first = await log.first_seq_at(flt.since, subjects.ALL_EVENTS)
        if first is None:
            return  # nothing was recorded since
        start = max(start, first)
    started = _Started(flt.since, by_event_time=False)  # the read starts at the time
    # Closed as soon as the range ends (or the caller stops): no request of it is left
    # waiting for the garbage collector.
    reading = log.read(start_seq=start, subject=subject)
    async with contextlib.aclosing(reading):
        async for seq, event in reading:
            if end is not None and seq > end:
                break
            if tasks is not None and event.task_id not in tasks:
                continue
            if not started.keeps(event):
                continue
            yield seq, event


class LiveSource(Source):
    def __init__(self, bridge: Bridge, flt: EventFilter) -> None:
        self.bridge, self.flt = bridge, flt
        self.description = {"live": subjects.EVENTS_STREAM}
        if flt.since is not None:
            self.description["since"] = iso_utc(flt.since)

    def _feed(self, apply: Apply, end: int | None) -> int:
        async def run() -> int:
            last = 0
            events = live_events(self.bridge.log, self.flt, end)
            async with contextlib.aclosing(events):  # also when ``apply`` raises
                async for seq, event in events:
                    self._tally(event)
                    apply(seq, event)
                    last = seq
            return last

        last = self.bridge.call(run())
        self.description["end_seq"] = max(last, self.description.get("end_seq", 0))
        return last

    def last_position(self) -> int:
        return self.bridge.call(self.bridge.log.end_seq())


@contextlib.contextmanager
def source_for(args: argparse.Namespace, settings: Settings) -> Iterator[Source]:
    """The source the command's options name; its reads show their progress on stderr
    when that is a terminal."""
    with _opened(args, settings) as source:
        source.progress = for_terminal(sys.stderr)
        yield source
    say_quarantined(source)


def say_quarantined(source: Source) -> None:
    """Tell stderr about the quarantined messages the source's last feed met."""
    if note := source.quarantine.note():
        print(note, file=sys.stderr)


@contextlib.contextmanager
def _opened(args: argparse.Namespace, settings: Settings) -> Iterator[Source]:
    flt = filter_from(args)
    if getattr(args, "from_file", None):
        yield FileSource(Path(args.from_file), flt)
        return
    with connected(settings) as bridge:
        yield LiveSource(bridge, flt)


def metrics_of(source: Source) -> MetricsProjection:
    projection = MetricsProjection()
    source.feed(projection.apply)
    return projection
