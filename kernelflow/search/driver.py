"""Running searches: each candidate a task in the log, submitted as its strategy plans it,
followed to its end, folded into its search's database; any number of searches at once
under one bound on the candidates in flight.

Nothing here is a source of truth: a search's state is its database, folded from the log
(``kernelflow.projections.search``). Started again after a kill, the driver reads the log
first, then asks each strategy for the generation to run (the same one, planned the same
way), submits what of it is not in the log yet under the same task ids, and waits for the
rest: candidates that were running are resumed by the daemons like any task. Stopped by
Ctrl-C, the driver cancels the candidates in flight (``INTERRUPTED``); the fold drops them
(``kernelflow.projections.search``), so a resumed search plans and submits them again, as
new tasks (``SearchTask.task_id``'s ``attempt``), and ends with the database of a search
never interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import queue
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.events import subjects
from kernelflow.events.errors import TransportError
from kernelflow.events.model import CancelTask, Event, PriorKernel, SubmitTask
from kernelflow.host.runtime import cancel_abandoned, request_reply
from kernelflow.projections.search import (
    ATTEMPT,
    CANDIDATE,
    GENERATION,
    INSPIRATIONS,
    INTERRUPTED,
    ISLAND,
    PARENTS,
    SEARCH,
    SETTINGS,
    STRATEGY,
    Candidate,
    SearchDatabase,
)
from kernelflow.search.strategies import (
    CandidateSpec,
    SearchConfig,
    Strategy,
    plan,
    strategy,
)
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.verification.results import cut_at_line

# What a prompt shows of a prior kernel at most: a search's prompts stay bounded however
# long the kernels it builds on.
MAX_PRIOR_CODE_CHARS = 24_000
MAX_PRIOR_FEEDBACK_CHARS = 1_500
# What a redo adds to a candidate's task id, before its number: ``<search>-r<attempt>-<n>``
# (the number last, as a scripted model picks a sample's answer by: llm/scripted.py).
_REDO = re.compile(r"-r\d+$")


@dataclass(frozen=True)
class Budget:
    """Limits of one search; None: no limit. Checked before every submission: candidates
    in flight when one is reached finish (but for ``wall_s``, which cancels them)."""

    candidates: int | None = None
    tokens: int | None = None
    dollars: float | None = None
    wall_s: float | None = None  # seconds with work in flight, over every run of it

    def reached(self, db: SearchDatabase, submitted: int = 0) -> str | None:
        """Which limit the search has reached, ``submitted`` candidates not in the log
        yet counted, or None."""
        if self.candidates is not None and len(db.candidates) + submitted >= self.candidates:
            return f"candidate budget ({self.candidates}) reached"
        if self.tokens is not None and db.tokens >= self.tokens:
            return f"token budget ({self.tokens}) reached: {db.tokens} used"
        if self.dollars is not None and db.cost_usd >= self.dollars:
            return f"dollar budget (${self.dollars:g}) reached: ${db.cost_usd:.4f} spent"
        if self.wall_s is not None and db.busy_s() >= self.wall_s:
            return f"wall-time budget ({self.wall_s:g}s) reached"
        return None


@dataclass(frozen=True)
class SearchTask:
    """One search: the problem, how to search it, and what its candidates carry."""

    search_id: str
    task_name: str
    task_source: str
    workflow: str
    workflow_yaml: str
    backend: str = "triton"
    policy: str = DEFAULT_POLICY  # the verifier's strictness policy
    settings: SearchConfig = field(default_factory=SearchConfig)
    budget: Budget = field(default_factory=Budget)
    deadline_s: float | None = None
    metadata: dict[str, str] = field(default_factory=dict)

    def task_id(self, index: int, attempt: int = 0) -> str:
        """The task of candidate ``index``; ``attempt`` > 0: its redo after an interrupt."""
        redo = f"-r{attempt}" if attempt else ""
        return f"{self.search_id}{redo}-{index}"


class SettingsChanged(ValueError):
    """A search id whose log was recorded with other settings."""


@dataclass
class _Search:
    task: SearchTask
    strategy: Strategy
    db: SearchDatabase
    early_win: bool
    done: str | None = None  # why the search is over
    published: set[int] = field(default_factory=set)  # candidate numbers submitted here
    stopping: str | None = None  # a budget reached or an early win: submit nothing more


@dataclass
class SearchProgress:
    searches: int
    finished: int = 0
    candidates_done: int = 0
    running: int = 0
    solved: int = 0
    started: float = field(default_factory=time.monotonic)
    printed_at: int = 0  # searches finished when a line was last written to a log
    told_at: float = 0.0  # when ``on_progress`` was last called

    def line(self) -> str:
        width = 24
        filled = width * self.finished // max(self.searches, 1)
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.finished}/{self.searches} "
            f"searched, {self.solved} solved; {self.candidates_done} candidates done, "
            f"{self.running} running, {time.monotonic() - self.started:.0f}s"
        )


class SearchRunner:
    """Runs ``searches`` over ``bridge``'s NATS, at most ``concurrency`` candidates in
    flight; daemons (this process's or others') do the candidates' work."""

    def __init__(
        self,
        bridge: Bridge,
        searches: Sequence[SearchTask],
        concurrency: int = 4,
        on_progress: Callable[[SearchProgress], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.bridge = bridge
        self.concurrency = concurrency
        self.on_progress = on_progress
        self.searches = {
            s.search_id: _Search(
                s,
                strategy(s.settings.strategy),
                SearchDatabase(s.search_id),
                s.settings.early_win
                if s.settings.early_win is not None
                else strategy(s.settings.strategy).early_win,
            )
            for s in searches
        }
        self.progress = SearchProgress(searches=len(self.searches))
        self._inbox: queue.Queue[Event | int] = queue.Queue()
        # Seconds spent planning, folding and submitting (the search's own overhead).
        self.overhead_s = 0.0

    # ------------------------------------------------------------------ running

    def run(self) -> dict[str, SearchDatabase]:
        """Run every search to its end; their databases, by search id."""
        end = self.bridge.call(self.bridge.log.end_seq())
        pump = self.bridge.spawn(self._tail(end))
        try:
            self._catch_up(pump)
            for search in self.searches.values():
                self._check_settings(search)
            while not all(s.done for s in self.searches.values()):
                began = time.perf_counter()
                for search in self.searches.values():
                    self._advance(search)
                self._report()
                self.overhead_s += time.perf_counter() - began
                if all(s.done for s in self.searches.values()):
                    break
                self._wait(pump)
        except KeyboardInterrupt:
            cancel_abandoned(self.bridge, self._ours_running(), INTERRUPTED)
            raise
        finally:
            pump.cancel()
        return {search_id: s.db for search_id, s in self.searches.items()}

    async def _tail(self, caught_up_at: int) -> None:
        """Every event of the log, from the first, into the inbox (ours only); the
        position ``caught_up_at`` once reached (the log as it was when the run began)."""
        position, told = 1, caught_up_at == 0
        if told:
            self._inbox.put(0)
        while True:
            try:
                reading = self.bridge.log.read(start_seq=position, follow=True)
                async with contextlib.aclosing(reading):
                    async for seq, event in reading:
                        position = seq + 1
                        if self._search_of(event.task_id) is not None:
                            self._inbox.put(event)
                        if not told and seq >= caught_up_at:
                            told = True
                            self._inbox.put(seq)
            except (TransportError, TimeoutError):
                await asyncio.sleep(0.2)  # a slow or restarting server: resume where we were

    def _catch_up(self, pump: Any) -> None:
        """Fold what the log held when the run began before planning anything: a plan
        made on part of a search's history would differ from the one made on all of it."""
        while True:
            try:
                item = self._inbox.get(timeout=0.5)
            except queue.Empty:
                if pump.done():
                    pump.result()
                continue
            if isinstance(item, int):
                return
            self._apply(item)

    def _wait(self, pump: Any) -> None:
        """Fold events until one ends a candidate (or half a second passes)."""
        deadline = time.monotonic() + 0.5
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._inbox.get(timeout=left)
            except queue.Empty:
                break
            if isinstance(item, int):
                continue
            began = time.perf_counter()
            ended = self._apply(item)
            self.overhead_s += time.perf_counter() - began
            if ended:
                break
        if pump.done():
            pump.result()  # the log could not be read: raise why

    def _apply(self, event: Event) -> bool:
        """Fold ``event`` into its search; True if it ended a candidate."""
        search = self._search_of(event.task_id)
        if search is None:
            return False
        before = search.db.candidates.get(event.task_id)
        running = before is not None and not before.ended
        search.db.apply(0, event)
        after = search.db.candidates.get(event.task_id)
        return running and after is not None and after.ended

    def owns(self, task_id: str) -> bool:
        """Whether ``task_id`` is a candidate of one of these searches."""
        return self._search_of(task_id) is not None

    def _search_of(self, task_id: str) -> _Search | None:
        prefix, _, index = task_id.rpartition("-")
        if not index.isdigit():
            return None
        return self.searches.get(prefix) or self.searches.get(_REDO.sub("", prefix))

    # ------------------------------------------------------------------ planning

    def _check_settings(self, search: _Search) -> None:
        recorded, wanted = search.db.settings, search.task.settings.to_json()
        if recorded is not None and recorded != wanted:
            raise SettingsChanged(
                f"search {search.task.search_id} was recorded with other settings "
                f"({recorded}); use another id (--run) for these ({wanted})"
            )

    def _advance(self, search: _Search) -> None:
        """Submit what the search's plan needs now, or find that it is over."""
        if search.done:
            return
        db = search.db
        if search.stopping is None:
            passed = next((c for c in db.ordered() if c.passed), None)
            if search.early_win and passed is not None:
                search.stopping = f"early win: {passed.task_id} passed"
                self._cancel_running(search, search.stopping)
            elif (reached := search.task.budget.reached(db)) is not None:
                search.stopping = reached
                if search.task.budget.wall_s is not None and "wall-time" in reached:
                    self._cancel_running(search, reached)
        running = [c for c in db.candidates.values() if not c.ended]
        if search.stopping is not None:
            if not running and not self._awaited(search):
                self._finish(search, search.stopping)
            return
        generation = plan(search.strategy, db, search.task.settings)
        if generation is None:
            if not running:
                self._finish(search, "all generations done")
            return
        recorded = {c.index for c in db.candidates.values()}
        for spec in generation.candidates:
            if spec.index in search.published or spec.index in recorded:
                continue
            if self._in_flight() >= self.concurrency:
                return
            reached = search.task.budget.reached(db, len(self._awaited(search)))
            if reached is not None:
                search.stopping = reached
                return
            self._submit(search, spec)

    def _awaited(self, search: _Search) -> set[int]:
        """Candidates submitted here that the log does not hold yet."""
        recorded = {c.index for c in search.db.candidates.values()}
        return search.published - recorded

    def _in_flight(self) -> int:
        running = sum(
            1 for s in self.searches.values() for c in s.db.candidates.values() if not c.ended
        )
        return running + sum(len(self._awaited(s)) for s in self.searches.values())

    def _submit(self, search: _Search, spec: CandidateSpec) -> None:
        task = search.task
        db = search.db
        prior = [
            _prior(db.candidates[t], role)
            for role, ids in (("parent", spec.parents), ("inspiration", spec.inspirations))
            for t in ids
            if t in db.candidates
        ]
        attempt = db.attempts.get(spec.index, 0)
        redo = {ATTEMPT: str(attempt)} if attempt else {}
        command = SubmitTask(
            task_id=task.task_id(spec.index, attempt),
            task_name=task.task_name,
            task_source=task.task_source,
            workflow_name=task.workflow,
            workflow_yaml=task.workflow_yaml,
            backend=task.backend,
            policy=task.policy,
            group_id=task.search_id,
            deadline_s=task.deadline_s,
            prior_kernels=prior,
            metadata={
                **task.metadata,
                SEARCH: task.search_id,
                STRATEGY: task.settings.strategy,
                CANDIDATE: str(spec.index),
                GENERATION: str(spec.generation),
                ISLAND: str(spec.island),
                PARENTS: ",".join(spec.parents),
                INSPIRATIONS: ",".join(spec.inspirations),
                SETTINGS: task.settings.to_json(),
                **redo,
            },
        )
        self.bridge.call(self.bridge.commands.publish(command, subjects.SUBMIT))
        search.published.add(spec.index)

    def _cancel_running(self, search: _Search, reason: str) -> None:
        running = [c.task_id for c in search.db.candidates.values() if not c.ended]

        async def cancel_all() -> None:
            await asyncio.gather(
                *(
                    request_reply(
                        self.bridge, CancelTask(task_id=t, reason=reason), subjects.CANCEL, 5.0
                    )
                    for t in running
                )
            )

        if running:
            self.bridge.call(cancel_all(), timeout=15)

    def _finish(self, search: _Search, why: str) -> None:
        search.done = why
        self.progress.finished += 1
        if any(c.passed for c in search.db.candidates.values()):
            self.progress.solved += 1

    def _ours_running(self) -> list[str]:
        return sorted(
            c.task_id
            for s in self.searches.values()
            for c in s.db.candidates.values()
            if not c.ended
        )

    def _report(self) -> None:
        """Tell ``on_progress`` what changed, and at least every second (a terminal's
        line then shows the time going on while candidates take long)."""
        p = self.progress
        candidates = [c for s in self.searches.values() for c in s.db.candidates.values()]
        done = sum(1 for c in candidates if c.ended)
        running = len(candidates) - done
        now = time.monotonic()
        if (done, running) != (p.candidates_done, p.running) or now - p.told_at >= 1.0:
            p.candidates_done, p.running, p.told_at = done, running, now
            if self.on_progress is not None:
                self.on_progress(p)


def _prior(c: Candidate, role: str) -> PriorKernel:
    """What a coder is shown of an earlier candidate (bounded)."""
    code = c.code or ""
    if len(code) > MAX_PRIOR_CODE_CHARS:
        code = code[:MAX_PRIOR_CODE_CHARS] + "\n# … (cut: the kernel is longer)"
    return PriorKernel(
        task_id=c.task_id,
        role="parent" if role == "parent" else "inspiration",
        code=code,
        verdict=c.verdict or "unknown",
        speedup=c.speedup if c.speedup is None or math.isfinite(c.speedup) else None,
        feedback=cut_at_line(c.feedback, MAX_PRIOR_FEEDBACK_CHARS),
        candidate_ms=c.candidate_ms,
        speedup_conclusive=c.speedup_conclusive,
    )


def print_progress(progress: SearchProgress) -> None:
    """A line redrawn in place on a terminal; in a log, a line each time a search ends."""
    last = progress.finished == progress.searches
    if sys.stderr.isatty():
        print(f"\r{progress.line()}", end="\n" if last else "", file=sys.stderr, flush=True)
    elif progress.finished != progress.printed_at:
        progress.printed_at = progress.finished
        print(progress.line(), file=sys.stderr, flush=True)
