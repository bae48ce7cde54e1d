"""One kernel task from Python (docs/workflows.md, "The Task API")::

    from kernelflow import Task

    task = Task(op_name="relu", task_desc=open("relu.py").read(), workflow="custom_workflow",
                llm="scripted:examples/scripted/relu.yaml")
    op_name, success, state = await task.run()      # or task.run_sync()
    print(success, state.verdict, state.speedup, state.kernel_code)

``task_desc`` is the reference model in KernelBench format (what ``kernelflow run`` reads
from a file); ``workflow`` names a predefined workflow, a named one (``NAME.yaml`` in the
current directory or the workflows dir) or a YAML file. The task runs as ``kernelflow run``
runs one: a daemon in this process hosts every agent its workflow names, on the embedded
NATS unless a NATS URL is given (then the daemons already there run it, unless
``host_daemon=True``). Everything it did is in the log, as for any task.

Also what ``run`` and ``submit`` share with it: the submit command of a kernel task, its
workflow resolved and checked (``kernel_task``), and reading a finished task back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import CONDUCTOR_ROLE
from kernelflow.actors.kinds.check import check_agents
from kernelflow.events import subjects
from kernelflow.events.codec import checked_command
from kernelflow.events.model import Event, SubmitTask, TaskSubmitted
from kernelflow.fork import ForkChanges, plan_fork, record_fork
from kernelflow.host.exits import WaitTimeout
from kernelflow.host.runtime import (
    cancel_abandoned,
    connected,
    follow_task,
    noting_other_tasks,
    start_daemon,
    stopped_after,
)
from kernelflow.host.settings import Settings
from kernelflow.projections.render import summary
from kernelflow.projections.rewards import check_reward_names
from kernelflow.projections.task_state import TaskState, fold
from kernelflow.projections.trajectory import Trajectory, build_trajectory
from kernelflow.rollout import rollout_complete
from kernelflow.verification.backends import DEFAULT_BACKEND
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.verification.taskfile import check_task_source
from kernelflow.workflows.loader import (
    WorkflowError,
    check_candidate,
    parse_workflow,
    resolve_workflow,
)
from kernelflow.workflows.model import VERIFIER


def kernel_task(
    *,
    name: str,
    source: str,
    workflow: str,
    dirs: Sequence[Path] = (),
    backend: str = DEFAULT_BACKEND,
    policy: str = DEFAULT_POLICY,
    candidate: str | None = None,
    task_id: str | None = None,
    deadline_s: float | None = None,
    group_id: str | None = None,
) -> SubmitTask:
    """The submit command of a kernel task, refused before anything is published where its
    workflow cannot be used (``WorkflowError``: its structure, kinds, tools; ``UnknownReward``:
    its rewards). ``dirs``: where a named workflow is found."""
    workflow_name, workflow_yaml = resolve_workflow(workflow, dirs)
    checked = parse_workflow(workflow_yaml, workflow_name, source=workflow)
    check_agents(checked)
    check_reward_names(checked.rewards)
    check_candidate(checked, has_candidate=bool(candidate))
    if VERIFIER not in checked.agents:
        raise WorkflowError(
            f"{workflow}: no agent hands over to the verifier, and a kernel task ends judged "
            "by its last verification: it could only fail (a workflow for prompt tasks runs "
            f"with kernelflow rollout --workflow {workflow})"
        )
    return SubmitTask(
        task_id=new_id_for(task_id),
        task_name=name,
        task_source=source,
        workflow_name=workflow_name,
        workflow_yaml=workflow_yaml,
        backend=backend,
        policy=policy,
        candidate_code=candidate,
        deadline_s=deadline_s,
        group_id=group_id,
        rewards=list(checked.rewards),
    )


def roles_for(command: SubmitTask) -> tuple[str, ...]:
    """The conductor and every agent the task's workflow names: all that a process running
    the task itself must host."""
    assert command.workflow_yaml is not None
    workflow = parse_workflow(command.workflow_yaml, command.workflow_name)
    return (CONDUCTOR_ROLE, *workflow.agents)


def fork_roles(forked: Sequence[Event]) -> tuple[str, ...]:
    """What a process running a fork itself must host: its conductor and agents."""
    first = forked[0]
    assert isinstance(first, TaskSubmitted)
    workflow = parse_workflow(first.workflow_yaml, first.workflow_name)
    return (CONDUCTOR_ROLE, *workflow.agents)


def new_id_for(task_id: str | None) -> str:
    """``task_id``, or a new task id."""
    return task_id or f"t-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class _Forking:
    """What ``Task.fork`` was asked for."""

    task_id: str
    at: int | None
    after_step: int | None
    changes: ForkChanges


def read_back(bridge: Bridge, task_id: str, wait_s: float = 10.0) -> list[Event]:
    """The task's events once what follows its finish (its rewards) is in: the daemon
    stopped, but a reward it was appending as the finish arrived may still be on its way
    (a loaded machine), and the trajectory written now must be the one the log replays."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            events = list(bridge.call(bridge.log.read_task(task_id)).events)
        except TimeoutError:
            # A loaded server answered late: the task is over and its outputs still to be
            # written, so ask again while there is time rather than lose them.
            if time.monotonic() > deadline:
                raise
            continue
        if rollout_complete(fold(task_id, events)) or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


@dataclass(frozen=True)
class TaskOutcome:
    """Where a task ended: the final state ``Task.run`` returns."""

    task_id: str
    status: str  # success, failed, rejected, cancelled, timeout, budget_exceeded
    reason: str
    kernel_code: str | None  # the last verified kernel
    verdict: str | None  # its verdict
    speedup: float | None
    verifications: tuple[str, ...]  # every verdict, in order
    trajectory: Trajectory  # the whole run (docs/agents.md, "Trajectories")
    # Whether ``speedup`` says anything (False: its 95 % interval holds 1 or spans more
    # than 2x, the machine was busy; None: not timed).
    speedup_conclusive: bool | None = None


class TaskResult(NamedTuple):
    """``op_name, success, state = await task.run()``."""

    op_name: str
    success: bool
    state: TaskOutcome


class Task:
    """A kernel to generate: ``op_name`` names it, ``task_desc`` is the reference model."""

    def __init__(
        self,
        op_name: str,
        task_desc: str,
        workflow: str = "default",
        backend: str = DEFAULT_BACKEND,
        llm: str | None = None,
        *,
        policy: str = DEFAULT_POLICY,
        candidate: str | None = None,
        task_id: str | None = None,
        deadline_s: float | None = None,
        timeout_s: float | None = None,
        nats_url: str | None = None,
        host_daemon: bool | None = None,
        serve_others: bool = False,
        settings: Settings | None = None,
    ) -> None:
        self.op_name = op_name
        self.task_desc = task_desc
        self.workflow = workflow
        self.backend = backend
        self.policy = policy
        self.candidate = candidate
        self.task_id = task_id
        self.deadline_s = deadline_s
        self.timeout_s = timeout_s  # how long ``run`` waits for the end; None: until it ends
        base = settings or Settings()
        self.settings = dataclasses.replace(
            base, llm=llm or base.llm, nats_url=nats_url or base.nats_url
        )
        # Host the agents here: by default only on the embedded NATS (given a NATS URL, the
        # daemons already there run the task).
        self.host_daemon = self.settings.nats_url is None if host_daemon is None else host_daemon
        # Whether the daemon hosted here also works on tasks others left queued (as
        # ``kernelflow run --serve-others``); by default it leaves them to their daemons.
        self.serve_others = serve_others
        self.forking: _Forking | None = None  # set by ``Task.fork``

    @classmethod
    def fork(
        cls,
        task_id: str,
        *,
        at: int | None = None,
        after_step: int | None = None,
        workflow: str | None = None,
        llm: str | None = None,
        policy: str | None = None,
        backend: str | None = None,
        new_task_id: str | None = None,
        timeout_s: float | None = None,
        nats_url: str | None = None,
        host_daemon: bool | None = None,
        settings: Settings | None = None,
    ) -> Task:
        """A fork of task ``task_id`` (docs/workflows.md, "Forking a task"): its history
        up to the end of step ``after_step``, or of the last step ended at or before event
        ``at``, reused as recorded; ``run`` goes on from there with the changes given
        (``llm``: the LLM the daemon hosted here answers with)."""
        if (at is None) == (after_step is None):
            raise ValueError("fork at an event (at=SEQ) or after a step (after_step=N)")
        task = cls("", "", llm=llm, task_id=new_id_for(new_task_id), timeout_s=timeout_s,
                   nats_url=nats_url, host_daemon=host_daemon, settings=settings)  # fmt: skip
        base = task.settings
        changes = ForkChanges(workflow, policy, backend, llm, base.workflow_dirs)
        task.forking = _Forking(task_id, at, after_step, changes)
        return task

    def command(self) -> SubmitTask:
        """The task's submit command: ``TaskFileError`` for a ``task_desc`` that is no
        KernelBench task, ``WorkflowError`` for a workflow that cannot be used,
        ``MalformedMessage`` for a field no daemon would take (a task id's alphabet)."""
        check_task_source(self.task_desc, self.op_name)
        command = kernel_task(
            name=self.op_name,
            source=self.task_desc,
            workflow=self.workflow,
            dirs=self.settings.workflow_dirs,
            backend=self.backend,
            policy=self.policy,
            candidate=self.candidate,
            task_id=self.task_id,
            deadline_s=self.deadline_s,
        )
        checked_command(command)
        return command

    async def run(self) -> TaskResult:
        """Run the task to its end (in a thread of its own: the loop is not blocked)."""
        return await asyncio.to_thread(self.run_sync)

    def run_sync(self) -> TaskResult:
        """Run the task (or the fork) to its end, blocking."""
        command = None if self.forking else self.command()
        with connected(self.settings) as bridge:
            if command is None:
                forked = self._forked(bridge)
                task_id, roles = forked[0].task_id, fork_roles(forked)
            else:
                task_id, roles = command.task_id or "", roles_for(command)
            with contextlib.ExitStack() as hosting:
                if self.host_daemon:
                    serving, runner = self.serve_others, f"Task {self.op_name}"
                    own = noting_other_tasks(bridge, {task_id}, runner, serving=serving)
                    only = None if serving else {task_id}
                    daemon = start_daemon(bridge, self.settings, roles, {}, own, only=only)
                    hosting.enter_context(stopped_after(daemon))
                if command is None:
                    bridge.call(record_fork(bridge.log, forked))
                else:
                    bridge.call(bridge.commands.publish(command, subjects.SUBMIT))
                try:
                    state = follow_task(
                        bridge, task_id, lambda _: None, self.timeout_s, explain_waits=False
                    )
                except (KeyboardInterrupt, WaitTimeout):
                    if self.host_daemon:
                        cancel_abandoned(bridge, [task_id], f"Task {self.op_name} abandoned")
                    raise
            events = read_back(bridge, task_id)
        return self._result(state, events)

    def _forked(self, bridge: Bridge) -> list[Event]:
        """The fork's events, planned from the original in the log (``ForkError``)."""
        f = self.forking
        assert f is not None
        new_id = self.task_id or new_id_for(None)
        plan = plan_fork(bridge.log, f.task_id, new_id, at=f.at, after_step=f.after_step,
                         changes=f.changes)  # fmt: skip
        forked = bridge.call(plan).events
        first = forked[0]
        assert isinstance(first, TaskSubmitted)
        self.op_name, self.task_desc = first.task_name, first.task_source
        return forked

    def _result(self, state: TaskState, events: list[Event]) -> TaskResult:
        shown = summary(state)
        outcome = TaskOutcome(
            task_id=state.task_id,
            status=shown["status"],
            reason=shown["reason"] or "",
            kernel_code=shown["final_code"],
            verdict=shown["verdict"],
            speedup=shown["speedup"],
            verifications=tuple(shown["verifications"]),
            trajectory=build_trajectory(state.task_id, events),
            speedup_conclusive=shown["speedup_conclusive"],
        )
        return TaskResult(self.op_name, outcome.status == "success", outcome)
