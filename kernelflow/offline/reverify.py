"""``kernelflow reverify``: check the kernels tasks ended with again, with this verifier,
and record what it finds.

A task's kernel is re-checked when its newest check is by an older verifier version
(``VerificationReport.verifier_version``; ``force``: whatever the version). Each new
check is appended to its task as a ``KernelReverified`` event, with the task's rewards
recomputed on the new verdict (``revised_reward_events``): what happened stays in the log
as it happened, and what judges it (rewards, datasets, reports, benchmarks) takes the
newest check by default. A check that finds the kernel judged the same is recorded too: it
says that this version agrees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.pins import differences, toolchain
from kernelflow.events.log import AppendConflict
from kernelflow.events.model import (
    Event,
    KernelReverified,
    TaskFinished,
    TaskSubmitted,
    VerificationReport,
)
from kernelflow.offline.sources import Source
from kernelflow.projections.rewards import revised_reward_events
from kernelflow.projections.search import SearchDatabase
from kernelflow.projections.task_state import TaskState, apply
from kernelflow.verification.engine import VERIFIER_VERSION, VerifierConfig, verify


@dataclass(frozen=True)
class Kernel:
    """A task's final kernel, and what judged it last."""

    task_id: str
    task_name: str
    group_id: str
    task_source: str
    backend: str
    policy: str  # the task's strictness policy: the new check applies it too
    code: str
    verdict: str | None
    version: int
    versions: dict[str, str] = field(default_factory=dict)  # pinned when the task started


@dataclass
class Outcome:
    kernel: Kernel
    report: VerificationReport
    recorded: bool = False

    @property
    def changed(self) -> bool:
        return self.report.verdict != self.kernel.verdict

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.kernel.task_id,
            "task_name": self.kernel.task_name,
            "group_id": self.kernel.group_id,
            "before": self.kernel.verdict,
            "before_version": self.kernel.version,
            "after": self.report.verdict,
            "after_version": self.report.verifier_version,
            "policy": self.report.policy,
            "speedup": self.report.speedup,
            "speedup_conclusive": self.report.speedup_conclusive,
            "summary": self.report.summary,
            "recorded": self.recorded,
            "versions_differ": self.versions_differ,
        }

    @property
    def versions_differ(self) -> list[str]:
        """What the task started with that this check ran otherwise (the verifier, its
        toolchain): ``name: then → now``."""
        return differences(self.kernel.versions, {"verifier": str(VERIFIER_VERSION), **toolchain()})


@dataclass
class _Kernels:
    """Pass over the source: each kernel task's submission and final kernel."""

    db: SearchDatabase = field(default_factory=lambda: SearchDatabase(None))
    submitted: dict[str, TaskSubmitted] = field(default_factory=dict)

    def apply(self, position: int, event: Event) -> None:
        if type(event) is TaskSubmitted:
            if event.prompt is not None:
                return  # an answer, not a kernel
            self.submitted[event.task_id] = event
        if event.task_id in self.submitted:
            self.db.apply(position, event)


def kernels_to_check(source: Source, *, force: bool = False) -> tuple[list[Kernel], int]:
    """The final kernels of the source's tasks whose newest check is older than this
    verifier (every one with ``force``), in the order the tasks were submitted; and how
    many are checked by this version already."""
    found = _Kernels()
    source.feed(found.apply, label="reading the log")
    kernels, current = [], 0
    for c in found.db.ordered():
        if c.code is None or not c.ended:
            continue
        if c.verifier_version >= VERIFIER_VERSION and not force:
            current += 1
            continue
        sub = found.submitted[c.task_id]
        kernels.append(
            Kernel(
                task_id=c.task_id,
                task_name=sub.task_name,
                group_id=sub.group_id,
                task_source=sub.task_source,
                backend=sub.backend,
                policy=sub.policy,
                code=c.code,
                verdict=c.verdict,
                version=c.verifier_version,
                versions=dict(sub.versions),
            )
        )
    return kernels, current


def check_again(
    kernels: list[Kernel],
    config: VerifierConfig,
    on_done: Callable[[Outcome], None] | None = None,
) -> Iterator[Outcome]:
    """Each kernel checked by this verifier, one after the other (timings on a GPU need
    the device to themselves)."""
    for kernel in kernels:
        report = verify(
            kernel.task_source,
            kernel.code,
            backend=kernel.backend,
            policy=kernel.policy,
            config=config,
        )
        outcome = Outcome(kernel, report)
        if on_done is not None:
            on_done(outcome)
        yield outcome


def record(bridge: Bridge, outcome: Outcome, *, force: bool = False) -> bool:
    """Append the new check to its task (with its revised rewards); False when the task's
    kernel is no longer the one checked, or (unless ``force``) a check by this version is
    there already."""
    for _ in range(3):
        history = bridge.call(bridge.log.read_task(outcome.kernel.task_id, leader=True))
        state = TaskState(outcome.kernel.task_id)
        for event in history.events:
            apply(state, event)
        finished = state.finished
        if not isinstance(finished, TaskFinished) or finished.final_code != outcome.kernel.code:
            return False
        if not force and any(
            r.report.verifier_version == outcome.report.verifier_version
            and r.kernel_of == finished.event_id
            for r in state.reverified
        ):
            return False  # another reverify of this version got there first
        check = KernelReverified(
            task_id=state.task_id,
            cause=finished.event_id,
            kernel_of=finished.event_id,
            report=outcome.report,
            previous_verdict=outcome.kernel.verdict,
            previous_version=outcome.kernel.version,
        )
        try:
            bridge.call(bridge.log.append(history, [check, *revised_reward_events(state, check)]))
        except AppendConflict:
            continue
        outcome.recorded = True
        return True
    return False
