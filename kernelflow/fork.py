"""Forking a task (docs/workflows.md, "Forking a task"): a new task whose history up to one
of the original's events is the original's, reused as recorded, and which continues from
there like any task.

A fork starts where the conductor decides: right after one of the original's steps ended
(its dispatch's result). ``--at SEQ`` takes the last step that ended at or before event
SEQ; ``--after-step N`` the end of step N. The fork's first event is the original's
``TaskSubmitted`` with the fork's changes and ``forked_from`` (the task and event it was
cut at); its events 2 to that event are the original's, with the same ``seq``, only their
task id and the ids naming it rewritten. Every copy but the last is recorded as history
only (``subjects.HISTORY_ONLY_HEADER``: no daemon's consumer works on it, so nothing is
done again); the last, a step's end, is the conductor's trigger, as it was in the
original, and the conductor decides from there with the fork's workflow and LLM.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

from kernelflow.actors.kinds.check import check_agents
from kernelflow.actors.pins import differences, pinned_versions
from kernelflow.common.redact import scrub
from kernelflow.events.log import AppendConflict
from kernelflow.events.model import (
    DISPATCH_RESULTS,
    AgentDispatched,
    Event,
    ForkOrigin,
    TaskSubmitted,
    UnknownEvent,
    ends_task,
)
from kernelflow.events.port import EventLogPort
from kernelflow.verification.backends import backend
from kernelflow.verification.policy import policy
from kernelflow.workflows.loader import check_candidate, parse_workflow, resolve_workflow
from kernelflow.workflows.model import VERIFIER, Workflow


class ForkError(ValueError):
    """A fork that cannot be made: no such task, no step ended there, a workflow that cannot
    continue the history, an id in use. Its message is one line for the user."""


@dataclass(frozen=True)
class ForkChanges:
    """What a fork changes of the original (None: kept as recorded)."""

    workflow: str | None = None  # a workflow's name or file (``resolve_workflow``)
    policy: str | None = None
    backend: str | None = None
    llm: str | None = None  # the LLM spec its daemon answers with (recorded, not applied)
    workflow_dirs: Sequence[Path] = ()


def step_ends(events: Sequence[Event]) -> dict[int, int]:
    """The seq of the event that ended each step of a task, by step, up to its end."""
    steps: dict[str, int] = {}
    ends: dict[int, int] = {}
    for event in events:
        if ends_task(event):
            break
        if isinstance(event, AgentDispatched):
            steps[event.dispatch_id] = event.step
        elif isinstance(event, DISPATCH_RESULTS):
            step = steps.get(event.dispatch_id)  # type: ignore[attr-defined]
            if step is not None:
                ends[step] = event.seq
    return ends


def cut_of(
    task_id: str, events: Sequence[Event], *, at: int | None = None, after_step: int | None = None
) -> int:
    """The seq of the last event a fork copies: the end of ``after_step``, or of the last
    step that ended at or before event ``at``."""
    ends = step_ends(events)
    if after_step is not None:
        if after_step not in ends:
            done = f"steps 1 to {max(ends)}" if ends else "no step"
            raise ForkError(f"task {task_id} has no step {after_step} that ended ({done} did)")
        return ends[after_step]
    assert at is not None
    if not 1 <= at <= len(events):
        raise ForkError(f"task {task_id} has events 1 to {len(events)}: no event {at}")
    before = [seq for seq in ends.values() if seq <= at]
    if not before:
        raise ForkError(
            f"task {task_id}: no step ended at or before event {at} (a fork starts after a "
            f"step; the first ended at event {min(ends.values(), default=len(events))})"
        )
    return max(before)


def forked_events(
    original: Sequence[Event], cut: int, new_id: str, changes: ForkChanges
) -> list[Event]:
    """The fork's history: its ``TaskSubmitted`` and the copies of events 2 to ``cut``."""
    first = original[0]
    if not isinstance(first, TaskSubmitted):
        raise ForkError(f"task {first.task_id} was not submitted: nothing to fork")
    old = first.task_id
    copies = [_copied(e, old, new_id) for e in original[1:cut]]
    submitted, workflow = _submitted(first, cut, new_id, changes)
    ran = {e.agent for e in copies if isinstance(e, AgentDispatched)}
    if missing := sorted(ran - set(workflow.agents)):
        raise ForkError(
            f"workflow {workflow.name} has no agent {', '.join(missing)}, which ran in the "
            f"history the fork keeps: it cannot continue it"
        )
    return [submitted, *copies]


def _submitted(
    first: TaskSubmitted, cut: int, new_id: str, changes: ForkChanges
) -> tuple[TaskSubmitted, Workflow]:
    changed: dict[str, str] = {}
    name, text = first.workflow_name, first.workflow_yaml
    if changes.workflow is not None:
        name, text = resolve_workflow(changes.workflow, changes.workflow_dirs)
        changed["workflow"] = name
    workflow = parse_workflow(text, name, source=changes.workflow)
    check_agents(workflow)
    check_candidate(workflow, has_candidate=bool(first.candidate_code))
    if first.prompt is None and VERIFIER not in workflow.agents:
        raise ForkError(f"workflow {name} has no verifier: a kernel task could only fail")
    if changes.policy is not None:
        policy(changes.policy)  # UnknownPolicy
        changed["policy"] = changes.policy
    if changes.backend is not None:
        backend(changes.backend)  # UnknownBackend
        changed["backend"] = changes.backend
    llm = {k: v for k, v in first.versions.items() if k == "llm" or k.startswith("llm.")}
    if changes.llm is not None:
        changed["llm"] = scrub(changes.llm)
        llm = {"llm": changed["llm"]}
    submitted = msgspec.structs.replace(
        first,
        task_id=new_id,
        cause=f"{first.task_id}:{cut}",
        at=time.time(),  # the fork starts now: its deadline counts from here
        workflow_name=name,
        workflow_yaml=text,
        policy=changes.policy or first.policy,
        backend=changes.backend or first.backend,
        group_id=f"g-{uuid.uuid4().hex[:12]}",
        forked_from=ForkOrigin(task_id=first.task_id, at=cut, changed=changed),
        # What it goes on with (docs/workflows.md, "Versions pinned on a task").
        versions=pinned_versions(text, changes.policy or first.policy, llm),
    )
    return submitted, workflow


def _copied(event: Event, old: str, new: str) -> Event:
    """``event`` as an event of task ``new``: its ids that name task ``old`` renamed."""
    if isinstance(event, UnknownEvent):
        raise ForkError(
            f"event {event.event_id} is of a kind this kernelflow does not know "
            f"({event.original_kind}): fork before it, or with the kernelflow that wrote it"
        )
    renamed: dict[str, object] = {"task_id": new, "cause": _renamed(event.cause, old, new)}
    dispatch_id = getattr(event, "dispatch_id", None)
    if isinstance(dispatch_id, str):
        renamed["dispatch_id"] = _renamed(dispatch_id, old, new)
    return msgspec.structs.replace(event, **renamed)


def _renamed(value: str, old: str, new: str) -> str:
    return new + value[len(old) :] if value.startswith(f"{old}:") else value


async def record_fork(log: EventLogPort, events: Sequence[Event]) -> None:
    """Record a fork's events into a task id not used yet: every one but the last as
    history only; the last (a step's end) is what the conductor goes on from."""
    last_stream_seq = 0
    for n, event in enumerate(events):
        answer = await log.send_recorded(event, last_stream_seq, history_only=n < len(events) - 1)
        try:
            last_stream_seq = await answer
        except AppendConflict:
            if n == 0:
                raise ForkError(
                    f"task {event.task_id} exists already: fork into another id"
                ) from None
            raise


@dataclass(frozen=True)
class PlannedFork:
    """A fork's events (recorded by ``record_fork``), and the versions the original
    started with that the fork goes on with otherwise (``name: then → now``)."""

    events: list[Event]
    versions_differ: list[str]


async def plan_fork(
    log: EventLogPort,
    task_id: str,
    new_id: str,
    *,
    at: int | None = None,
    after_step: int | None = None,
    changes: ForkChanges = ForkChanges(),
) -> PlannedFork:
    """Read the original and make the fork's events."""
    original = (await log.read_task(task_id)).events
    if not original:
        raise ForkError(f"no task {task_id} in the log")
    cut = cut_of(task_id, original, at=at, after_step=after_step)
    events = forked_events(original, cut, new_id, changes)
    before, after = original[0], events[0]
    assert isinstance(before, TaskSubmitted) and isinstance(after, TaskSubmitted)
    return PlannedFork(events, differences(before.versions, after.versions))
