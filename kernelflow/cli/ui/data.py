"""What the dashboard reads from NATS, and what tells its pages to read again.

- The task list: a daemon's read model (``query_status``, as ``kernelflow status`` asks
  it), or, when none answers, the fold kept here (``LocalFold``).
- A task's page: the task's events (``EventLogPort.read_task``; a task still running is
  remembered, so reading it again fetches only its new events).
- Group, search and run pages: ``LocalFold``, the whole log folded in this process and
  moved on from where it stopped whenever such a page is asked for: every task's metrics,
  the reward facts Flow-GRPO's rewards need, each group's tasks, each search's database
  (``projections.search``) and each bench run's searches. A dashboard nobody looks at
  reads nothing.
- ``LogView.watching``: wakes a page's live stream when events it shows are recorded (a
  plain subscription to their subjects: no consumer, and the messages are not read).

NATS is the bridge's (its own thread and loop, as every command's); the web server awaits
what runs there from its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.readmodel_client import NoAnswer, query_status, status_rows
from kernelflow.events import subjects
from kernelflow.events.model import (
    TERMINAL_EVENTS,
    AgentDispatched,
    Event,
    RewardAssigned,
    TaskSubmitted,
    VerificationCompleted,
)
from kernelflow.events.port import EventLogPort, TaskHistory
from kernelflow.events.quarantine import HistoryCheck
from kernelflow.offline.sources import BENCH_RUN
from kernelflow.projections.benchmark import PROBLEM
from kernelflow.projections.flow_grpo import RewardFacts
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.search import SEARCH, SearchDatabase

T = TypeVar("T")

# A task list this young is shared by every page that asks (a read-model query each time
# a page is rendered would be one per viewer and change), unless a page heard of an event
# since it was asked for.
_ROWS_FRESH_S = 0.5


# The events that change a task's row in the list (its status, steps, verdicts, rewards):
# what the list, group, run and bench pages wait for.
ROW_SUBJECTS = (
    *(subjects.of_kind(kind) for kind in (TaskSubmitted, VerificationCompleted, RewardAssigned)),
    *(subjects.of_kind(kind) for kind in TERMINAL_EVENTS),
    subjects.of_kind(AgentDispatched) + ".*",  # kf.ev.<task>.agent_dispatched.<agent>
)


@dataclass(frozen=True)
class TaskRows:
    """The task list: every task's status row, in the order tasks entered the log, and
    where the rows came from."""

    rows: list[dict[str, Any]]
    source: str


class LocalFold:
    """The whole log folded in this process (the module's doc says what for). ``catch_up``
    runs on the bridge loop, one at a time (``LogView.folded``)."""

    def __init__(self) -> None:
        self.metrics = MetricsProjection()
        self.rewards = RewardFacts()
        self.groups: dict[str, list[str]] = {}  # group id → its tasks, in submission order
        self.searches: dict[str, SearchDatabase] = {}  # search id (its group's) → its fold
        self._search_of: dict[str, SearchDatabase] = {}  # a candidate's task id → its search
        self.benches: dict[str, dict[str, str]] = {}  # bench run → problem → its search id
        self.through = 0  # the stream sequence read up to

    def _last_seq(self, task_id: str) -> int:
        t = self.metrics.tasks.get(task_id)
        return t.last_seq if t is not None else 0

    def apply(self, position: int, event: Event) -> None:
        if not self.metrics.apply(position, event):
            return
        self.rewards.apply(position, event)
        if isinstance(event, TaskSubmitted):
            self.groups.setdefault(event.group_id, []).append(event.task_id)
            if (search_id := event.metadata.get(SEARCH)) is not None:
                search = self.searches.setdefault(search_id, SearchDatabase(search_id))
                if search.apply(position, event):
                    self._search_of[event.task_id] = search
                if (run := event.metadata.get(BENCH_RUN)) is not None:
                    problem = event.metadata.get(PROBLEM) or search_id
                    self.benches.setdefault(run, {}).setdefault(problem, search_id)
        elif (candidate_of := self._search_of.get(event.task_id)) is not None:
            candidate_of.apply(position, event)

    async def catch_up(self, log: EventLogPort) -> None:
        """Fold what was recorded since the last call (messages that are not events of
        their task are quarantined, as every read of the log does)."""
        end = await log.end_seq()
        if end <= self.through:
            return
        check = HistoryCheck(self._last_seq)
        reading = log.read_stored(self.through + 1, subjects.ALL_EVENTS, through=end)
        async with contextlib.aclosing(reading):
            async for batch in reading:
                for stream_seq, subject, data in batch:
                    self.apply(stream_seq, check.place(subject, data, stream_seq))
        self.through = end

    def group_tasks(self, group_id: str) -> list[str]:
        return [t for t in self.groups.get(group_id, ()) if t in self.metrics.tasks]


class LogView:
    """The dashboard's access to NATS through a started bridge."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.fold = LocalFold()
        self._fold_lock = asyncio.Lock()
        self._rows_lock = asyncio.Lock()
        self._rows: tuple[float, int, TaskRows] | None = None
        self._heard = 0  # events the pages' subscriptions heard of (``watching``)

    async def _on_bridge(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(self.bridge.spawn(coro))

    async def task_rows(self) -> TaskRows:
        async with self._rows_lock:
            asked_at, heard = time.monotonic(), self._heard
            if self._rows is not None:
                at, heard_then, rows = self._rows
                if asked_at - at < _ROWS_FRESH_S and heard_then == heard:
                    return rows
            try:
                bridge = self.bridge
                answer = await self._on_bridge(query_status(bridge.requests, bridge.log))
                rows = TaskRows(
                    answer.rows,
                    f"the read model of {answer.instance} (log position {answer.position:,})",
                )
            except NoAnswer as exc:
                async with self.folded() as fold:
                    rows = TaskRows(
                        status_rows(fold.metrics),
                        f"the log, folded here ({exc}; position {fold.metrics.position:,})",
                    )
            self._rows = (asked_at, heard, rows)
            return rows

    async def task_history(self, task_id: str) -> TaskHistory:
        return await self._on_bridge(self.bridge.log.read_task(task_id))

    @contextlib.asynccontextmanager
    async def folded(self) -> AsyncIterator[LocalFold]:
        """The local fold, caught up with the end of the log as it is now, to read while
        nothing moves it on (it is folded on the bridge's thread)."""
        async with self._fold_lock:
            await self._on_bridge(self.fold.catch_up(self.bridge.log))
            yield self.fold

    @contextlib.asynccontextmanager
    async def watching(self, watched: Sequence[str]) -> AsyncIterator[asyncio.Event]:
        """An event set (on the caller's loop) whenever a message is recorded on one of
        the ``watched`` subjects; the caller clears it."""
        loop = asyncio.get_running_loop()
        moved = asyncio.Event()

        def heard() -> None:
            self._heard += 1
            moved.set()

        def wake() -> None:  # on the bridge's loop
            loop.call_soon_threadsafe(heard)

        log = self.bridge.log
        stops = [await self._on_bridge(log.watch(s, wake)) for s in watched]
        try:
            yield moved
        finally:
            # Not awaited: a stream is also left this way when its request was cancelled.
            for stop in stops:
                with contextlib.suppress(RuntimeError):  # the bridge is already stopped
                    self.bridge.spawn(stop())
