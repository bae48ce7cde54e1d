"""A search's program database, folded from the log: every candidate kernel a search
tried, who it descends from, and what the verifier said of it (``kernelflow.search``).

A search is a group of tasks (the group id is the search id); each candidate is one task,
submitted with its place in the search in ``TaskSubmitted.metadata``:

- ``search``: the search id; ``strategy``: the strategy's name;
- ``candidate``: its number in the search (0, 1, ... in the order the strategy planned);
- ``generation``: the round of the search it belongs to; ``island``: its island (0 where
  the strategy has none);
- ``parents`` / ``inspirations``: the task ids of the kernels shown to its coder, comma
  separated;
- ``search_settings``: the search's settings as JSON (the same in every candidate);
- ``attempt``: absent for a candidate's first task; 1, 2, ... for the task that redoes it
  after a search was interrupted (below).

A candidate whose task was cancelled because its search was interrupted (Ctrl-C: the
reason ``INTERRUPTED``) is not part of the search: the fold drops it, and the candidate
number is free again, so a resumed search plans it again as it planned it the first time
and submits it as a new task (``<search>-r<attempt>-<n>``), whose outcome is the
candidate's. A resumed search's database is then the one of a search never interrupted
(but for the redone tasks' ids).

A candidate's kernel is the one its task ended with (``TaskFinished.final_code``); its
verdict and speedup are the newest check of that kernel (the verification it ended on, or
a later ``KernelReverified``). Nothing else is read, so the database of a search is the
same whoever folds it, from the live log or an exported file, and whenever.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    ConductorDecided,
    Event,
    KernelReverified,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RewardAssigned,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.handlers import handler_table
from kernelflow.projections.speedups import counted, report_conclusive

# The metadata keys of a candidate task (see the module's docstring).
SEARCH = "search"
STRATEGY = "strategy"
CANDIDATE = "candidate"
GENERATION = "generation"
ISLAND = "island"
PARENTS = "parents"
INSPIRATIONS = "inspirations"
SETTINGS = "search_settings"
ATTEMPT = "attempt"
RUNNING = "running"
# Why the driver cancels the candidates in flight when it is interrupted (Ctrl-C): such a
# candidate is redone when the search resumes (see the module's docstring).
INTERRUPTED = "search interrupted"

# How promising a kernel is to build on, by its verdict (a pass scores 1 + its speedup; an
# untimed or inconclusively timed one, 1 + 1: parity).
# Kernels refused as reward hacks, or that could not be judged, are never built on.
_VERDICT_SCORES = {"mismatch": 0.5, "runtime_error": 0.3, "timeout": 0.2, "compile_error": 0.1}


@dataclass(slots=True, kw_only=True)
class Candidate:
    task_id: str
    index: int
    generation: int
    island: int = 0
    parents: tuple[str, ...] = ()
    inspirations: tuple[str, ...] = ()
    attempt: int = 0  # 0: the candidate's first task; n: its n-th redo after an interrupt
    status: str = RUNNING
    code: str | None = None  # the kernel the task ended with
    verdict: str | None = None  # of that kernel, by its newest check
    speedup: float | None = None
    speedup_conclusive: bool | None = None  # None: not timed (kernelflow.projections.speedups)
    speedups: dict[str, float] = field(default_factory=dict)  # by baseline, on a GPU
    candidate_ms: float | None = None
    feedback: str = ""
    verifier_version: int = 0
    report: VerificationReport | None = None  # the newest check of its kernel
    # Every check of its kernel: the verification it ended on, then later ones.
    checks: list[VerificationReport] = field(default_factory=list)
    verifications: int = 0
    verify_s: float = 0.0  # spent verifying its attempts
    verify_device: str = ""  # where they were verified
    llm_calls: int = 0
    tokens: int = 0
    cost_usd: float | None = None
    submitted_at: float | None = None
    ended_at: float | None = None
    # The last verification's report, until the task ends (its kernel is that one's), and
    # each passing one's by event id (a workflow that improves after a pass ends with the
    # one ``TaskFinished.final_check`` names: docs/workflows.md, "Improving after a pass").
    last_report: VerificationReport | None = None
    passes: dict[str, VerificationReport] = field(default_factory=dict)

    @property
    def ended(self) -> bool:
        return self.status != RUNNING

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def score(self) -> float | None:
        """How promising the kernel is to build on (higher is better), or None when it
        may not be built on (no kernel, a reward hack, unsupported, not over)."""
        if not self.ended or self.code is None or self.verdict is None:
            return None
        if self.verdict == "pass":
            return 1.0 + self.ranked_speedup
        return _VERDICT_SCORES.get(self.verdict)

    @property
    def ranked_speedup(self) -> float:
        """The speedup kernels are ranked by: parity (1.0) where it was not timed or its
        timing was inconclusive."""
        speedup = counted(self.speedup, self.speedup_conclusive)
        return 1.0 if speedup is None else speedup

    def as_of(self, verifier_version: int) -> Candidate:
        """The candidate as judged by the newest check of its kernel by a verifier no
        newer than ``verifier_version`` (the verification it ended on when none is)."""
        later = [r for r in self.checks[1:] if r.verifier_version <= verifier_version]
        judged = later[-1] if later else (self.checks[0] if self.checks else None)
        copy = dataclasses.replace(self, checks=list(self.checks))
        if judged is not None:
            _judged(copy, judged)
        return copy

    def sort_key(self) -> tuple[float, int]:
        """Best first; ties go to the earlier candidate (the same order for everyone)."""
        score = self.score
        return (-(score if score is not None else -math.inf), self.index)


class SearchDatabase:
    """The candidates of one search, folded from its tasks' events (any order of tasks;
    each task's events in order); with no search id, every task of the log is one (in the
    order they were submitted: what the benchmark card of a whole log reads). ``light``
    keeps of a kernel only how it was judged (no code, feedback or report texts): what a
    card of a large log needs. ``apply`` returns True for an event it took."""

    def __init__(self, search_id: str | None, *, light: bool = False) -> None:
        self.search_id = search_id
        self.light = light
        self.candidates: dict[str, Candidate] = {}
        self.settings: str | None = None  # the recorded settings (JSON)
        # Candidate number -> the attempt of its newest task; once that one is dropped
        # (interrupted), the attempt its next task is: what a resumed search submits.
        self.attempts: dict[int, int] = {}

    def apply(self, position: int, event: Event) -> bool:
        if type(event) is TaskSubmitted:
            return self._submitted(event)
        candidate = self.candidates.get(event.task_id)
        if candidate is None:
            return False
        if (
            type(event) is TaskCancelled
            and event.reason == INTERRUPTED
            and self.search_id is not None
            and not candidate.ended
        ):
            self._drop(candidate, candidate.attempt + 1)
            return True
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            if self.light:
                event = _lightened(event)
            handler(candidate, event)
        return True

    def apply_all(self, events: Iterable[Event]) -> SearchDatabase:
        for event in events:
            self.apply(0, event)
        return self

    def _submitted(self, event: TaskSubmitted) -> bool:
        meta = event.metadata
        if self.search_id is not None and (
            meta.get(SEARCH) != self.search_id or event.group_id != self.search_id
        ):
            return False
        if event.task_id in self.candidates:
            return False  # the same task again (an imported log read twice)
        self.settings = self.settings or meta.get(SETTINGS)
        index = _int(meta.get(CANDIDATE)) if self.search_id else len(self.candidates)
        attempt = _int(meta.get(ATTEMPT))
        if self.search_id is not None:
            if attempt < self.attempts.get(index, 0):
                return False  # a task of the candidate's that an interrupt cut off
            self.attempts[index] = attempt
            earlier = [c for c in self.candidates.values() if c.index == index]
            for c in earlier:  # read before its cancel (another task's events came first)
                self._drop(c, attempt)
        self.candidates[event.task_id] = Candidate(
            task_id=event.task_id,
            index=index,
            attempt=attempt,
            generation=_int(meta.get(GENERATION)),
            island=_int(meta.get(ISLAND)),
            parents=_ids(meta.get(PARENTS)),
            inspirations=_ids(meta.get(INSPIRATIONS)),
            submitted_at=event.at,
        )
        return True

    def _drop(self, candidate: Candidate, next_attempt: int) -> None:
        """Forget a task an interrupt cut off: its candidate is to be done again."""
        del self.candidates[candidate.task_id]
        index = candidate.index
        self.attempts[index] = max(self.attempts.get(index, 0), next_attempt)

    # ------------------------------------------------------------------ queries

    def ordered(self) -> list[Candidate]:
        """Every candidate, in the order the strategy planned them."""
        return sorted(self.candidates.values(), key=lambda c: c.index)

    def generation(self, g: int) -> list[Candidate]:
        return [c for c in self.ordered() if c.generation == g]

    def before(self, g: int, island: int | None = None) -> list[Candidate]:
        """The candidates of the generations before ``g`` (of one island), best first."""
        found = [
            c
            for c in self.candidates.values()
            if c.generation < g and (island is None or c.island == island)
        ]
        return sorted(found, key=Candidate.sort_key)

    def best(self) -> Candidate | None:
        """The best kernel found: a pass if any (the fastest), else the most promising."""
        scored = [c for c in self.candidates.values() if c.score is not None]
        return min(scored, key=Candidate.sort_key) if scored else None

    @property
    def tokens(self) -> int:
        return sum(c.tokens for c in self.candidates.values())

    @property
    def cost_usd(self) -> float:
        return math.fsum(c.cost_usd or 0.0 for c in self.candidates.values())

    def busy_s(self) -> float:
        """Seconds the search has had work in flight: the union of its candidates' spans
        (submitted → ended; a running one up to its last event seen), so the time a
        stopped search waited to be resumed does not count."""
        spans = sorted(
            (c.submitted_at, c.ended_at if c.ended_at is not None else c.submitted_at)
            for c in self.candidates.values()
            if c.submitted_at is not None
        )
        total, start, end = 0.0, None, None
        for s, e in spans:
            if start is None or end is None or s > end:
                if start is not None and end is not None:
                    total += end - start
                start, end = s, e
            else:
                end = max(end, e)
        if start is not None and end is not None:
            total += end - start
        return total

    def as_of(self, verifier_version: int | None) -> SearchDatabase:
        """The database with every kernel judged as ``Candidate.as_of`` says (None: as
        it is, by the newest checks)."""
        if verifier_version is None:
            return self
        view = SearchDatabase(self.search_id)
        view.settings = self.settings
        view.candidates = {t: c.as_of(verifier_version) for t, c in self.candidates.items()}
        return view

    def lineage(self) -> list[dict[str, Any]]:
        """The database as plain data: one row per candidate, in planned order (what a
        resumed search is compared by, and what the dashboard draws)."""
        return [
            {
                "task_id": c.task_id,
                "index": c.index,
                "generation": c.generation,
                "island": c.island,
                "parents": list(c.parents),
                "inspirations": list(c.inspirations),
                "status": c.status,
                "verdict": c.verdict,
                "speedup": c.speedup,
                "speedup_conclusive": c.speedup_conclusive,
                "code": c.code,
            }
            for c in self.ordered()
        ]


def _lightened(event: Event) -> Event:
    """``event`` without the texts a light database does not keep."""
    if type(event) is VerificationCompleted or type(event) is KernelReverified:
        report = msgspec.structs.replace(
            event.report, summary="", errors=[], mismatches=[], reasons=[], feedback=""
        )
        if type(event) is VerificationCompleted:
            return msgspec.structs.replace(event, code="", report=report)
        return msgspec.structs.replace(event, report=report)
    if type(event) is TaskFinished and event.final_code is not None:
        return msgspec.structs.replace(event, final_code="")
    return event


def _int(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def _ids(text: str | None) -> tuple[str, ...]:
    return tuple(t for t in (text or "").split(",") if t)


def _llm_called(c: Candidate, event: LLMCalled) -> None:
    c.llm_calls += 1
    c.tokens += event.usage.total_tokens
    if event.cost_usd is not None:
        c.cost_usd = (c.cost_usd or 0.0) + event.cost_usd


def _verified(c: Candidate, event: VerificationCompleted) -> None:
    c.verifications += 1
    c.verify_s += event.report.duration_s
    c.verify_device = event.report.device or c.verify_device
    c.last_report = event.report
    if event.report.passed:
        c.passes[event.event_id] = event.report


def _judged(c: Candidate, report: VerificationReport) -> None:
    """The candidate's kernel as ``report`` judged it."""
    c.report = report
    c.verdict = report.verdict
    c.speedup = report.speedup
    c.speedup_conclusive = report_conclusive(report)
    c.verifier_version = report.verifier_version
    c.feedback = report.feedback or report.summary
    timing = report.timing
    c.speedups = dict(timing.speedups) if timing is not None else {}
    if timing is not None and report.speedup is not None and not c.speedups:
        c.speedups = {timing.baseline: report.speedup}
    c.candidate_ms = timing.candidate_ms.get("median") if timing is not None else None


def _finished(c: Candidate, event: TaskFinished) -> None:
    c.status = event.status
    c.ended_at = event.at
    c.code = event.final_code
    kept = c.passes.get(event.final_check or "", c.last_report)
    if kept is not None and event.final_code is not None:
        c.checks.append(kept)
        _judged(c, kept)
    c.last_report, c.passes = None, {}


def _stopped(c: Candidate, event: TaskCancelled | TaskRejected) -> None:
    c.status = "cancelled" if type(event) is TaskCancelled else "rejected"
    c.ended_at = event.at
    c.last_report, c.passes = None, {}


def _reverified(c: Candidate, event: KernelReverified) -> None:
    c.checks.append(event.report)
    _judged(c, event.report)


_HANDLERS: dict[type[Event], Callable[[Candidate, Any], None]] = handler_table(
    "search database",
    {
        LLMCalled: _llm_called,
        VerificationCompleted: _verified,
        TaskFinished: _finished,
        TaskCancelled: _stopped,
        TaskRejected: _stopped,
        KernelReverified: _reverified,
    },
    ignored=(
        TaskSubmitted,  # ``SearchDatabase.apply`` makes the candidate of it
        AgentDispatched,
        AgentFailed,
        ConductorDecided,
        OutputParsed,
        ParseFailed,
        RewardAssigned,
        ToolCalled,
    ),
)
