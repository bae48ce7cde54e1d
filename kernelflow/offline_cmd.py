"""Offline tools over the event log, live or exported: ``log export|import|verify|replay``,
``export grpo`` and ``report``.

Every tool reads events as ``(position, event)`` pairs from one of two sources: the live
JetStream log (position = stream sequence) or an exported file (``--from FILE``;
position = record number), and folds them with the pure projections of ``projections/``.
Nothing is held in memory beyond what the projections keep (per-task summaries; the turns
of tasks not yet ended during a dataset export). Output files are written next to their
target and renamed into place at the end, so a failed run leaves nothing half-written.

Where to start: the whole log (default), ``--start-seq N`` (events from that stream
sequence or record number on), or ``--since TIME`` (an ISO-8601 time, or a duration back
from now such as ``30m``, ``2h``, ``1d``): the tasks that *began* at or after TIME, each
with its whole history, so that an export is still a valid log file, a dataset holds
whole rollouts and a report counts whole tasks. On the live log the read starts at the
first event JetStream stored at or after TIME (``DeliverPolicy.BY_START_TIME``); in a
file, a task's first event's ``at`` decides.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import gzip
import itertools
import json
import os
import re
import sys
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import msgspec
import nats.errors
import nats.js.errors
from nats.js import api

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import AppendConflict, EventLog
from kernelflow.events.model import Event, TaskSubmitted
from kernelflow.progress import Progress, for_terminal, phase_of
from kernelflow.projections import flow_grpo, logfile
from kernelflow.projections.flow_grpo import (
    GrpoOptions,
    GrpoSample,
    PromptCollector,
    RewardTable,
    SampleBuilder,
    VerlPrompt,
)
from kernelflow.projections.metrics import (
    DEFAULT_FAST_P,
    MetricsProjection,
    by_workflow,
    projection_metrics,
)
from kernelflow.projections.report import agent_rows, report_json, report_text, tool_rows
from kernelflow.projections.rewards import REWARD_FUNCTIONS, UnknownReward, get_reward

if TYPE_CHECKING:
    from kernelflow.actors.bridge import Bridge
    from kernelflow.settings import Settings

Apply = Callable[[int, Event], object]


def _usage(message: str) -> Exception:
    from kernelflow.cli import UsageError

    return UsageError(message)


# --------------------------------------------------------------------------- files


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[BinaryIO]:
    """A (possibly gzip-compressed) file opened to read; a damaged one is a corrupt log."""
    try:
        raw: Any = gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")  # noqa: SIM115
    except OSError as exc:
        raise _usage(f"{path}: cannot read: {exc}") from exc
    with raw:
        try:
            yield raw
        except (OSError, EOFError) as exc:  # a damaged gzip stream
            raise logfile.CorruptLogFile(f"{path}: cannot be read: {exc}") from exc


def open_lines(path: Path) -> Iterator[bytes]:
    """The lines of a (possibly gzip-compressed) file, as bytes with their newline."""
    with _reading(path) as raw:
        yield from raw


def open_blocks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of a (possibly gzip-compressed) file, ``size`` at a time."""
    with _reading(path) as raw:
        while block := raw.read(size):
            yield block


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path that becomes ``path`` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def _open_write(path: Path, final_name: str) -> BinaryIO:
    if final_name.endswith(".gz"):
        # mtime=0 and no file name in the gzip header: the same log gives the same bytes.
        return gzip.GzipFile(filename="", mode="wb", fileobj=path.open("wb"), mtime=0)  # type: ignore[return-value]
    return path.open("wb")


@contextlib.contextmanager
def _refusing_corrupt() -> Iterator[None]:
    """A corrupt log file is the user's input error: exit 2 with one line saying why."""
    try:
        yield
    except logfile.CorruptLogFile as exc:
        raise _usage(f"refusing {exc}") from exc


def verify_file(path: Path) -> logfile.FileSummary:
    with _refusing_corrupt():
        return logfile.verify(open_lines(path), name=str(path))


def _file_events(path: Path) -> Iterator[tuple[int, Event]]:
    with _refusing_corrupt():
        yield from logfile.read_events(open_lines(path), name=str(path))


# --------------------------------------------------------------------------- since

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SINCE_HELP = (
    "only the tasks that began at or after TIME: ISO-8601 (2025-06-01T12:00, "
    "2025-06-01T12:00:00Z; no zone = local time) or a duration back from now (90s, 30m, 2h, "
    "1d, 1h30m)"
)


class BadTime(ValueError):
    pass


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``'s value as a Unix time. Raises BadTime saying what is accepted."""
    now = time.time() if now is None else now
    raw = text.strip()
    if raw and _DURATION.sub("", raw) == "" and (parts := _DURATION.findall(raw)):
        back = sum(float(n) * _UNIT_S[unit] for n, unit in parts)
        return float(int(now - back))  # whole seconds: a readable boundary in file headers
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise BadTime(
            f"--since {text!r}: not a time; use ISO-8601 (2025-06-01T12:00:00Z, "
            "2025-06-01 12:00 in local time) or a duration back from now (30m, 2h, 1d)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a time without a zone is the local time
    at = when.timestamp()
    if at > now:
        raise BadTime(f"--since {text!r} is in the future ({when.isoformat()})")
    return at


def iso_utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


async def first_seq_at(js: nats.js.JetStreamContext, at: float) -> int:
    """The stream sequence of the first event JetStream stored at or after ``at`` (one
    past the last event when there is none), found with a ``BY_START_TIME`` consumer."""
    info = await js.add_consumer(
        subjects.EVENTS_STREAM,
        api.ConsumerConfig(
            filter_subject=subjects.ALL_EVENTS,
            deliver_policy=api.DeliverPolicy.BY_START_TIME,
            opt_start_time=datetime.fromtimestamp(at, UTC),
            ack_policy=api.AckPolicy.NONE,
            mem_storage=True,
            inactive_threshold=30.0,
        ),
    )
    sub = None
    try:
        if info.num_pending:
            sub = await js.pull_subscribe_bind(consumer=info.name, stream=subjects.EVENTS_STREAM)
            msgs = await sub.fetch(batch=1, timeout=10)
            return int(msgs[0].metadata.sequence.stream)
        stream = await js.stream_info(subjects.EVENTS_STREAM)
        return int(stream.state.last_seq) + 1
    finally:
        if sub is not None:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(subjects.EVENTS_STREAM, info.name)


# --------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class EventFilter:
    task: str | None = None
    group: str | None = None
    workflow: str | None = None
    start_seq: int = 1
    since: float | None = None  # Unix time: only tasks whose first event is at or after it

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
        return self.group is not None or self.workflow is not None

    def matches_submission(self, e: TaskSubmitted) -> bool:
        return (self.group is None or e.group_id == self.group) and (
            self.workflow is None or e.workflow_name == self.workflow
        )


def filter_from(args: argparse.Namespace) -> EventFilter:
    since = None
    if getattr(args, "since", None) is not None:
        try:
            since = parse_since(args.since)
        except BadTime as exc:
            raise _usage(str(exc)) from exc
    return EventFilter(
        task=getattr(args, "task", None),
        group=getattr(args, "group", None),
        workflow=getattr(args, "workflow", None),
        start_seq=getattr(args, "start_seq", None) or 1,
        since=since,
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
    progress: Progress | None = None

    def feed(self, apply: Apply, end: int | None = None, *, label: str = "reading") -> int:
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

    def last_position(self) -> int:
        """The position of the source's last event now (progress is shown against it)."""
        raise NotImplementedError


class FileSource(Source):
    def __init__(self, path: Path, flt: EventFilter) -> None:
        self.path, self.flt = path, flt
        # The digest first, so that nothing is computed from a modified file; what only
        # decoding shows is refused as the feed reaches it.
        with _refusing_corrupt():
            digest = logfile.check_digest(open_blocks(path), name=str(path))
        self.description = {"file": path.name, "sha256": digest.sha256, "records": digest.records}
        if flt.since is not None:
            self.description["since"] = iso_utc(flt.since)
        self._tasks: set[str] | None = None
        if flt.by_submission:
            self._tasks = {
                e.task_id
                for _, e in _file_events(path)
                if isinstance(e, TaskSubmitted) and flt.matches_submission(e)
            }

    def last_position(self) -> int:
        return int(self.description["records"])

    def _feed(self, apply: Apply, end: int | None) -> int:
        last = 0
        flt, tasks = self.flt, self._tasks
        started = _Started(flt.since, by_event_time=True)
        for pos, event in _file_events(self.path):
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
            apply(pos, event)
            last = pos
        return last


async def live_events(
    log: EventLog, flt: EventFilter, end: int | None = None
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
        start = max(start, await first_seq_at(log.jetstream, flt.since))
    started = _Started(flt.since, by_event_time=False)  # the read starts at the time
    # Closed as soon as the range ends (or the caller stops): its consumer is deleted then,
    # not whenever the garbage collector gets to it.
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
                    apply(seq, event)
                    last = seq
            return last

        last = self.bridge.call(run())
        self.description["end_seq"] = max(last, self.description.get("end_seq", 0))
        return last

    def last_position(self) -> int:
        js = self.bridge.log.jetstream
        info = self.bridge.call(js.stream_info(subjects.EVENTS_STREAM))
        return int(info.state.last_seq)


@contextlib.contextmanager
def source_for(args: argparse.Namespace, settings: Settings) -> Iterator[Source]:
    """The source the command's options name; its reads show their progress on stderr
    when that is a terminal."""
    with _opened(args, settings) as source:
        source.progress = for_terminal(sys.stderr)
        yield source


@contextlib.contextmanager
def _opened(args: argparse.Namespace, settings: Settings) -> Iterator[Source]:
    flt = filter_from(args)
    if getattr(args, "from_file", None):
        yield FileSource(Path(args.from_file), flt)
        return
    from kernelflow.cli import connected

    with connected(settings) as bridge:
        yield LiveSource(bridge, flt)


# --------------------------------------------------------------------------- log export


def export_log(source: Source, out: Path, flt: EventFilter) -> logfile.FileSummary:
    writer = logfile.LogWriter(flt.as_dict())
    tasks: dict[str, int] = {}
    with atomic_output(out) as tmp:
        f = _open_write(tmp, out.name)
        with f:
            f.write(writer.header())

            def write(_: int, event: Event) -> None:
                f.write(writer.record(event))
                tasks[event.task_id] = tasks.get(event.task_id, 0) + 1

            source.feed(write, label="exporting")
            f.write(writer.trailer())
    header = logfile.Header(format=logfile.FORMAT, version=logfile.VERSION, filter=flt.as_dict())
    return logfile.FileSummary(header, writer.records, writer._hash.hexdigest(), tasks)


def cmd_log_export(args: argparse.Namespace, settings: Settings) -> int:
    out = Path(args.out)
    with source_for(args, settings) as source:
        summary = export_log(source, out, source.flt)
    print(
        f"exported {summary.records} events of {len(summary.tasks)} tasks to {out} "
        f"(sha256 {summary.sha256})"
    )
    return 0


# --------------------------------------------------------------------------- log import


class ImportConflict(Exception):
    pass


# Imported events in flight at most (each is a publish awaiting its acknowledgement), and
# reads of the target's tasks at once.
_IMPORT_WINDOW = 1024
_IMPORT_READS = 64


@dataclass
class ImportResult:
    appended: int = 0
    skipped: int = 0  # already in the target log
    tasks: int = 0


async def import_file(
    log: EventLog, path: Path, summary: logfile.FileSummary, progress: Progress | None = None
) -> ImportResult:
    """Append the file's events to ``log`` in file order. A task already in the target is
    compared event by event with the file: a matching prefix is skipped (so importing
    twice adds nothing), a differing one refuses the whole import before anything is
    written. Each append names the task's last stream sequence, as the EventLog does, so
    a concurrent writer is detected rather than interleaved."""
    existing: dict[str, list[bytes]] = {}
    last: dict[str, int] = {}
    reads = asyncio.Semaphore(_IMPORT_READS)
    read_so_far = itertools.count(1)

    async def read(task_id: str, update: Callable[[int], None]) -> None:
        async with reads:
            history = await log.read_task(task_id)
        if history.events:
            existing[task_id] = [encode(e) for e in history.events]
            last[task_id] = history.last_stream_seq
        update(next(read_so_far))

    with phase_of(progress, "reading the target", len(summary.tasks), "task") as update:
        await asyncio.gather(*(read(task_id, update) for task_id in summary.tasks))
    name = str(path)
    with phase_of(progress, "checking", summary.records) as update:
        for pos, event in logfile.read_events(open_lines(path), name=name):
            update(pos)
            have = existing.get(event.task_id)
            if have is not None and event.seq <= len(have) and have[event.seq - 1] != encode(event):
                raise ImportConflict(
                    f"{path}: task {event.task_id} already exists in the target log with a "
                    f"different history (event {event.event_id} differs); nothing was imported"
                )
    result = ImportResult(tasks=len(summary.tasks))
    # Sent in file order, so the target stores the file's order. A task's next event names
    # its previous one's stream sequence, so it waits for that answer; other tasks' events
    # go on meanwhile, up to _IMPORT_WINDOW in flight (one at a time took ~0.6 ms each).
    sent: dict[str, asyncio.Future[int]] = {}
    window: deque[asyncio.Future[int]] = deque()
    try:
        with phase_of(progress, "importing", summary.records) as update:
            for pos, event in logfile.read_events(open_lines(path), name=name):
                update(pos)
                task_id = event.task_id
                have = existing.get(task_id)
                if have is not None and event.seq <= len(have):
                    result.skipped += 1
                    continue
                if (previous := sent.get(task_id)) is not None:
                    last[task_id] = await previous
                sent[task_id] = await log.send_recorded(event, last.get(task_id, 0))
                window.append(sent[task_id])
                result.appended += 1
                if len(window) > _IMPORT_WINDOW:
                    await window.popleft()
            while window:
                await window.popleft()
    except AppendConflict as exc:
        raise ImportConflict(
            f"a task was written to by someone else during the import ({exc}); import again "
            "to continue"
        ) from exc
    finally:
        for answer in window:  # after a failure: the answers nobody will wait for
            answer.add_done_callback(_retrieved)
    return result


def _retrieved(answer: asyncio.Future[int]) -> None:
    """Mark an answer's outcome seen (asyncio reports exceptions never retrieved)."""
    if not answer.cancelled():
        answer.exception()


def cmd_log_import(args: argparse.Namespace, settings: Settings) -> int:
    from kernelflow.cli import connected

    path = Path(args.file)
    summary = verify_file(path)
    with connected(settings) as bridge:
        try:
            progress = for_terminal(sys.stderr)
            result = bridge.call(import_file(bridge.log, path, summary, progress))
        except ImportConflict as exc:
            raise _usage(str(exc)) from exc
        except nats.errors.Error as exc:
            from kernelflow.cli import CommandFailed

            raise CommandFailed(
                f"NATS failed during the import ({exc}); the events it acknowledged are "
                "kept: import again to continue"
            ) from exc
    print(
        f"imported {path}: {result.appended} events appended, {result.skipped} already "
        f"present, {result.tasks} tasks"
    )
    return 0


def cmd_log_verify(args: argparse.Namespace, settings: Settings) -> int:
    summary = verify_file(Path(args.file))
    info = {
        "file": args.file,
        "records": summary.records,
        "tasks": len(summary.tasks),
        "sha256": summary.sha256,
        "filter": summary.header.filter,
    }
    print(
        json.dumps(info)
        if args.json
        else f"{args.file}: ok, " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "file")
    )
    return 0


# --------------------------------------------------------------------------- replay


def cmd_log_replay(args: argparse.Namespace, settings: Settings) -> int:
    from kernelflow.actors.worker import workflow_of
    from kernelflow.projections.counters import repeat_counters
    from kernelflow.projections.task_state import fold
    from kernelflow.projections.trajectory import build_trajectory
    from kernelflow.render import counters_text, counters_view, trajectory_text

    events: list[Event] = []
    with source_for(args, settings) as source:
        source.feed(lambda _, e: events.append(e))
    if not events:
        raise _usage(f"no task {args.task} in the log")
    if args.view == "metrics":
        projection = MetricsProjection().apply_all(enumerate(events, 1))
        t = projection.tasks[args.task]
        run = projection_metrics(projection)
        view = {**msgspec.to_builtins(t), "wall_s": t.wall_s, "total_tokens": t.total_tokens}
        if args.json:
            view["agents"] = msgspec.to_builtins(run.agents)
            view["tools"] = msgspec.to_builtins(run.tools)
            print(json.dumps(view, indent=2))
        else:
            for k, v in view.items():
                print(f"{k:<20} {v}")
            print(f"\nPer agent (time: dispatch → result)\n{agent_rows(run)}")
            if run.tools:
                print(f"\nPer tool ({run.tool_calls} calls)\n{tool_rows(run)}")
        return 0
    if args.view == "counters":
        state = fold(args.task, events)
        if state.submitted is None:
            raise _usage(f"task {args.task} was never accepted: no workflow to count for")
        workflow = workflow_of(state)
        cview = counters_view(repeat_counters(state.history, workflow.sequence_patterns), workflow)
        print(json.dumps(cview, indent=2) if args.json else counters_text(cview))
        return 0
    trajectory = build_trajectory(args.task, events)
    print(json.dumps(trajectory.to_dict(), indent=2) if args.json else trajectory_text(trajectory))
    return 0


# --------------------------------------------------------------------------- report


def metrics_of(source: Source) -> MetricsProjection:
    projection = MetricsProjection()
    source.feed(projection.apply)
    return projection


def parse_floats(text: str, what: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise _usage(f"{what} {text!r}: expected comma-separated numbers") from exc


def cmd_report(args: argparse.Namespace, settings: Settings) -> int:
    fast_ps = parse_floats(args.fast_p, "--fast-p")
    with source_for(args, settings) as source:
        projection = metrics_of(source)
    tasks = list(projection.tasks.values())
    overall = projection_metrics(projection, fast_ps)
    per_workflow = by_workflow(tasks, fast_ps)
    if args.json:
        print(json.dumps(report_json(overall, per_workflow, tasks), indent=2))
    elif not tasks:
        print("no tasks in the log")
    else:
        print(report_text(overall, per_workflow, tasks))
    return 0


# --------------------------------------------------------------------------- export grpo


def _message_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def sample_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("uid", pa.string()),
            ("group_id", pa.string()),
            ("rollout_id", pa.string()),
            ("turn_index", pa.int32()),
            ("agent", pa.string()),
            ("dispatch_id", pa.string()),
            ("event_seq", pa.int64()),
            ("prompt", _message_type()),
            ("response", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int64())),
            ("response_token_ids", pa.list_(pa.int64())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("reward_fn", pa.string()),
            ("reward_source", pa.string()),
            ("status", pa.string()),
            ("model", pa.string()),
            ("provider", pa.string()),
            ("workflow", pa.string()),
            ("task_name", pa.string()),
            ("data_source", pa.string()),
            ("truncated", pa.bool_()),
        ]
    )


def verl_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", _message_type()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("task_id", pa.string()),
                        ("task_name", pa.string()),
                        ("group_id", pa.string()),
                        ("workflow", pa.string()),
                        ("backend", pa.string()),
                        ("reward_fn", pa.string()),
                    ]
                ),
            ),
        ]
    )


class RowWriter:
    """Rows to ``.jsonl`` (one msgspec-encoded object per line) or ``.parquet`` (row groups
    of ``batch`` rows, fixed schema); deterministic for the same rows."""

    def __init__(self, path: Path, final_name: str, schema: Any, batch: int = 2048) -> None:
        self.parquet = final_name.endswith(".parquet")
        self.rows = 0
        self._buffer: list[dict[str, Any]] = []
        self._batch = batch
        self._schema = schema
        if self.parquet:
            import pyarrow.parquet as pq

            self._pq = pq.ParquetWriter(str(path), schema, compression="zstd")
        else:
            self._file = _open_write(path, final_name)

    def write(self, row: GrpoSample | VerlPrompt) -> None:
        self.rows += 1
        if not self.parquet:
            self._file.write(msgspec.json.encode(row) + b"\n")
            return
        self._buffer.append(msgspec.to_builtins(row))
        if len(self._buffer) >= self._batch:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._buffer:
            self._pq.write_table(pa.Table.from_pylist(self._buffer, schema=self._schema))
            self._buffer = []

    def close(self) -> None:
        if self.parquet:
            self._flush()
            self._pq.close()
        else:
            self._file.close()


def grpo_options(args: argparse.Namespace) -> GrpoOptions:
    agents = None
    if args.agents:
        agents = frozenset(a.strip() for a in args.agents.split(",") if a.strip())
    try:
        get_reward(args.reward)
    except UnknownReward as exc:
        raise _usage(str(exc)) from exc
    if args.epsilon < 0:
        raise _usage(f"--epsilon {args.epsilon}: must not be negative")
    for flag in ("max_prompt_chars", "max_response_chars"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise _usage(f"--{flag.replace('_', '-')} {value}: expected at least 1")
    return GrpoOptions(
        agents=agents,
        reward=args.reward,
        normalize=args.normalize,
        scale_std=not args.no_std,
        epsilon=args.epsilon,
        singleton=args.singleton,
        zero_variance=args.zero_variance,
        max_prompt_chars=args.max_prompt_chars,
        max_response_chars=args.max_response_chars,
        overlong=args.overlong,
    )


def _rewards_pass(source: Source, options: GrpoOptions) -> tuple[RewardTable, dict[str, Any]]:
    """Pass 1 of the samples export: the reward table, and the facts about the run that
    the metadata reports. The per-task metrics it folds are the export's largest holding
    (about 1.4 KB a task); they are released here, before pass 2 adds its own."""
    metrics = MetricsProjection()
    end = source.feed(metrics.apply, label="pass 1 of 2, rewards")
    table = RewardTable.from_tasks(metrics.tasks.values(), options, end)
    tasks = metrics.tasks.values()
    return table, {
        "models": sorted({m for t in tasks for m in t.models}),
        "llm_calls_by_agent": {
            name: a.llm_calls for name, a in sorted(metrics.state.agents.items()) if a.llm_calls
        },
        "workflows": sorted({t.workflow for t in tasks if t.workflow}),
    }


def export_grpo(
    source: Source, out: Path, options: GrpoOptions, mode: str = "samples"
) -> dict[str, Any]:
    """Write the dataset; return its provenance and counts (also written to
    ``<out>.meta.json``). Nothing in either file depends on when it was written."""
    if not (out.name.endswith(".parquet") or out.name.endswith((".jsonl", ".jsonl.gz"))):
        raise _usage(f"{out}: the output must end in .parquet, .jsonl or .jsonl.gz")
    meta: dict[str, Any] = {
        "format": f"kernelflow-{'grpo-samples' if mode == 'samples' else 'verl-prompts'}",
        "version": 1,
        "options": {
            **asdict(options),
            "agents": sorted(options.agents) if options.agents is not None else None,
            "reward": options.reward_fn.key,
        },
        "reward_fn_doc": options.reward_fn.doc,
    }
    with atomic_output(out) as tmp:
        if mode == "verl":
            writer = RowWriter(tmp, out.name, verl_schema())
            collector = PromptCollector(options, writer.write)
            source.feed(collector.apply, label="collecting prompts")
            collector.finish()
            writer.close()
            meta["rows"] = writer.rows
        else:
            writer = RowWriter(tmp, out.name, sample_schema())
            table, run_facts = _rewards_pass(source, options)
            builder = SampleBuilder(table, writer.write)
            source.feed(builder.apply, end=table.end_position, label="pass 2 of 2, samples")
            drops = builder.finish()
            writer.close()
            groups = table.groups.values()
            meta.update(
                rows=writer.rows,
                rollouts=sum(1 for r in table.rollouts.values() if r.ended),
                groups=len(table.groups),
                groups_singleton=sum(1 for g in groups if g.verdict == "singleton"),
                groups_zero_variance=sum(1 for g in groups if g.verdict == "zero_variance"),
                reward_sources=table.reward_sources(),
                drops=msgspec.to_builtins(drops),
                **run_facts,
            )
        meta["source"] = {k: v for k, v in source.description.items()}
        meta_path = out.with_name(out.name + ".meta.json")
        with atomic_output(meta_path) as meta_tmp:
            meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta


def cmd_export_grpo(args: argparse.Namespace, settings: Settings) -> int:
    options = grpo_options(args)
    with source_for(args, settings) as source:
        meta = export_grpo(source, Path(args.out), options, args.mode)
    print(json.dumps(meta, sort_keys=True) if args.json else _grpo_summary(args.out, meta))
    # A misspelt agent is not an error (a log may lack an agent), but it is never silent.
    called: dict[str, int] | None = meta.get("llm_calls_by_agent")  # samples mode only
    if options.agents and called is not None and (absent := sorted(options.agents - called.keys())):
        print(
            f"kernelflow: --agents: no LLM calls by {', '.join(absent)} in this log "
            f"(calls by: {', '.join(called) or 'nobody'})",
            file=sys.stderr,
        )
    return 0


def _grpo_summary(out: str, meta: dict[str, Any]) -> str:
    lines = [f"wrote {meta['rows']} rows to {out} (provenance: {out}.meta.json)"]
    if "drops" in meta:
        drops = {k: v for k, v in meta["drops"].items() if v}
        lines.append(
            f"rollouts {meta['rollouts']} in {meta['groups']} groups "
            f"({meta['groups_singleton']} of one, {meta['groups_zero_variance']} with equal "
            f"rewards); reward {meta['options']['reward']}: {meta['reward_sources']}"
        )
        lines.append("dropped/truncated turns: " + (json.dumps(drops) if drops else "none"))
    return "\n".join(lines)


# --------------------------------------------------------------------------- parser


def _connection(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats-url", help="NATS server to use (env KF_NATS_URL); default: embedded")
    p.add_argument("--data-dir", help="embedded NATS store and outputs (env KF_DATA_DIR)")


def _source(p: argparse.ArgumentParser, *, task_required: bool = False) -> None:
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="read an exported log file instead of the live log",
    )
    p.add_argument("--task", required=task_required, help="only this task")
    if not task_required:
        p.add_argument("--group", help="only the tasks of this group")
        p.add_argument("--workflow", help="only tasks run with this workflow")
        p.add_argument(
            "--start-seq", type=int, help="start at this stream sequence (file: record number)"
        )
        p.add_argument("--since", metavar="TIME", help=SINCE_HELP)
    _connection(p)


def register(subparsers: Any) -> None:
    """Add ``log``, ``replay``, ``export`` and ``report`` to the ``kernelflow`` parser."""
    log = subparsers.add_parser("log", help="export, import or verify the event log")
    log_sub = log.add_subparsers(dest="log_command", required=True)

    exp = log_sub.add_parser("export", help="write the log (or part of it) to a portable file")
    exp.add_argument("--out", required=True, help="output file (.jsonl, or .jsonl.gz)")
    _source(exp)
    exp.set_defaults(func=cmd_log_export)

    imp = log_sub.add_parser("import", help="append an exported log file to this NATS")
    imp.add_argument("file")
    _connection(imp)
    imp.set_defaults(func=cmd_log_import)

    ver = log_sub.add_parser("verify", help="check an exported log file's integrity")
    ver.add_argument("file")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=cmd_log_verify)

    rep = subparsers.add_parser(
        "replay", help="a task's trajectory, counters or metrics, from the log or a file"
    )
    _source(rep, task_required=True)
    rep.add_argument("--view", choices=["trajectory", "counters", "metrics"], default="trajectory")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_log_replay)

    export = subparsers.add_parser("export", help="training data from the log")
    export_sub = export.add_subparsers(dest="export_command", required=True)
    grpo = export_sub.add_parser(
        "grpo", help="Flow-GRPO samples (one row per LLM turn) or verl prompts"
    )
    grpo.add_argument("--out", required=True, help="FILE.parquet, FILE.jsonl or FILE.jsonl.gz")
    grpo.add_argument(
        "--mode",
        choices=["samples", "verl"],
        default="samples",
        help="per-turn samples with rewards and advantages, or the verl prompt dataset",
    )
    grpo.add_argument(
        "--agents", help="comma-separated agents whose turns are samples (default all)"
    )
    grpo.add_argument(
        "--reward",
        default="binary@1",
        help=f"reward function name[@version]: {', '.join(sorted(REWARD_FUNCTIONS))}",
    )
    grpo.add_argument(
        "--normalize",
        choices=["trajectory", "turn"],
        default="trajectory",
        help="group statistics over rollouts, or over all turns (AgentFlow)",
    )
    grpo.add_argument("--no-std", action="store_true", help="r - mean only (Dr.GRPO)")
    grpo.add_argument("--epsilon", type=float, default=1e-6, help="added to the std")
    grpo.add_argument(
        "--singleton",
        choices=["keep", "drop"],
        default="keep",
        help="groups of one rollout: keep with advantage 0, or drop",
    )
    grpo.add_argument(
        "--zero-variance",
        choices=["keep", "drop"],
        default="keep",
        help="groups whose rewards are all equal: keep with advantage 0, or drop",
    )
    grpo.add_argument("--max-prompt-chars", type=int, help="longest prompt (characters)")
    grpo.add_argument("--max-response-chars", type=int, help="longest response (characters)")
    grpo.add_argument(
        "--overlong",
        choices=["truncate", "drop"],
        default="truncate",
        help="what to do with a turn over a maximum length",
    )
    grpo.add_argument("--json", action="store_true", help="print the provenance as JSON")
    _source(grpo)
    grpo.set_defaults(func=cmd_export_grpo)

    report = subparsers.add_parser("report", help="run metrics: per task, per workflow, overall")
    report.add_argument(
        "--fast-p",
        default=",".join(f"{p:g}" for p in DEFAULT_FAST_P),
        help="speedup thresholds p for fast_p (comma-separated)",
    )
    report.add_argument("--json", action="store_true")
    _source(report)
    report.set_defaults(func=cmd_report)


__all__ = [
    "EventFilter",
    "FileSource",
    "LiveSource",
    "export_grpo",
    "export_log",
    "flow_grpo",
    "import_file",
    "register",
]
