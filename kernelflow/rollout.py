"""Batch rollouts (docs/agents.md, "Rollouts"): run every prompt of a dataset N times
through the actor system and score each trajectory.

Each rollout is an ordinary task in the log — a prompt task whose workflow has one agent,
``solver``, of the chosen kind with the chosen tools, or runs the workflow the config names
(``agentflow``: docs/workflows.md) — so trajectories, metrics and the Flow-GRPO export
work on rollouts unchanged. The N rollouts of one prompt share a group
id (GRPO's ``rollout.n``). Rewards are the task's reward functions (``exact_match`` and
``numeric_match`` by default, ``judge`` for an LLM judge), recorded when it finishes.

Prompts are text or ``PromptItem``s, read from a dataset file by
``kernelflow.prompt_datasets``. A verl-format row a prompt came from is recorded with its
rollouts as it was read, so ``export grpo --mode verl`` gives it back; its system message
becomes the solver's system prompt (the agent kind's instructions follow it).

A run has an id (``run_id``; its tasks are ``ro-<run>-<prompt>-<sample>``). Run again with
the same id, the same prompts and the same config, it continues: rollouts it finished are
kept as recorded, rollouts still running are waited for, and each one an interrupt
cancelled is run again as a new task of the same group
(``ro-<run>-<prompt>-r<attempt>-<sample>``), so the resumed run's results are those of a
run never interrupted (the cancelled attempt stays in the log; the Flow-GRPO export leaves
cancelled tasks out, docs/datasets.md).

Python API::

    from kernelflow.rollout import Rollout, RolloutConfig
    trajectories = Rollout(RolloutConfig(agent_type="react", tools=("calculator",),
                                         llm="scripted:answers.yaml")).run(prompts, n=4)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import queue
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from kernelflow.actors.daemon import CONDUCTOR_ROLE, Daemon, DaemonConfig
from kernelflow.actors.kinds import agent_kind
from kernelflow.events import subjects
from kernelflow.events.codec import checked_command
from kernelflow.events.errors import TransportError
from kernelflow.events.model import Event, SubmitTask, TaskCancelled
from kernelflow.host.exits import UsageError
from kernelflow.host.runtime import (
    answer_pings,
    cancel_abandoned,
    connected,
    noting_other_tasks,
    own_work,
    reach_llm,
    stopped_after,
)
from kernelflow.host.settings import Settings
from kernelflow.llm import make_provider
from kernelflow.llm.config import AgentLLM, load_config
from kernelflow.projections.rewards import PROMPT_REWARDS, needs_judge, pending_reward_events
from kernelflow.projections.task_state import TaskState, apply, fold
from kernelflow.projections.trajectory import Trajectory, build_trajectory
from kernelflow.prompt_datasets import PromptItem  # also importable from here: docs/agents.md
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.workflows.loader import parse_workflow, resolve_workflow
from kernelflow.workflows.model import DEFAULT_AGENT_KIND

SOLVER = "solver"
# What a redo adds to a rollout's task id, before its sample number (which stays last, as
# in a search's redo: a scripted model's choices go by it):
# ``ro-<run>-<prompt>-r<attempt>-<sample>``.
REDO = "-r"


def new_run_id() -> str:
    return uuid.uuid4().hex[:10]


@dataclass(frozen=True)
class RolloutConfig:
    """The settings of a rollout (docs/agents.md, "Rollouts"), as kernelflow uses them."""

    agent_type: str = "react"
    tools: tuple[str, ...] = ()
    max_steps: int = 10  # LLM calls per rollout
    max_tokens_per_step: int | None = None
    temperature: float | None = None
    tool_format: Literal["text", "native"] = "text"
    # Further settings of the agent kind (``agent_config``), e.g. max_consecutive_thoughts.
    agent_config: dict[str, Any] = field(default_factory=dict)
    max_concurrency: int = 8  # rollouts in flight at once
    rewards: tuple[str, ...] = PROMPT_REWARDS
    save_trajectories: Path | None = None  # a JSONL file, one trajectory per line
    llm: str | None = None  # provider spec; None: the configured default
    deadline_s: float | None = None  # per rollout
    # The verifier's strictness policy for the kernel tools (compile_kernel, check_kernel).
    policy: str = DEFAULT_POLICY
    # The workflow each rollout runs (docs/workflows.md, "agentflow"): a predefined or named
    # workflow, or a YAML file; its agents replace the one solver (``agent_type``,
    # ``max_steps``, ``tool_format``, ``agent_config`` and a dataset's system prompt are the
    # solver's), and ``tools``, when given, replace the tools of its agents that call tools.
    workflow: str | None = None

    def workflow_yaml(self, system: str | None = None) -> str:
        """The rollout workflow; ``system`` replaces the solver's system prompt."""
        agent: dict[str, Any] = {
            "agent_kind": self.agent_type,
            "possible_next_agent": ["finish"],
            "output_format": {
                "parser_name": "answer_parser",
                "parser_definition": {
                    "output_fields": {
                        "answer": {
                            "field_type": "str",
                            "mandatory": True,
                            "field_description": "the final answer only",
                        }
                    }
                },
            },
        }
        if self.tools:
            agent["tools"] = list(self.tools)
        if system is not None and system.strip():
            # A template: its own "$" must not read as a placeholder.
            agent["prompt"] = {"system": system.replace("$", "$$")}
        if self.agent_type != "llm":
            agent["agent_config"] = {
                "max_steps": self.max_steps,
                "tool_format": self.tool_format,
                **self.agent_config,
            }
        doc = {
            "agent_info": {SOLVER: agent},
            "start_agent": SOLVER,
            "limitation_info": {"required": {"max_step": 1}},
        }
        return yaml.safe_dump(doc, sort_keys=False)

    def task_workflow(
        self, system: str | None = None, dirs: Sequence[Path] = ()
    ) -> tuple[str, str]:
        """``(name, yaml)`` of the workflow a rollout's task runs: ``workflow`` (found in
        ``dirs`` by name), else the solver's. WorkflowError, UnknownAgentKind where it
        cannot be used."""
        if self.workflow is None:
            return f"rollout_{self.agent_type}", self.workflow_yaml(system)
        name, text = resolve_workflow(self.workflow, dirs)
        if not self.tools:
            return name, text
        doc = yaml.load(text, Loader=yaml.SafeLoader)
        agents = doc.get("agent_info") if isinstance(doc, dict) else None
        for entry in (agents or {}).values():
            kind = entry.get("agent_kind", DEFAULT_AGENT_KIND) if isinstance(entry, dict) else None
            if isinstance(kind, str) and agent_kind(kind).uses_tools:
                entry["tools"] = list(self.tools)
        return name, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def rollout_complete(state: TaskState) -> bool:
    """Over, with every reward recorded (the judge's comes after the finish)."""
    return (
        state.terminal is not None and not needs_judge(state) and not pending_reward_events(state)
    )


@dataclass
class RolloutProgress:
    total: int
    done: int = 0
    running: int = 0
    rewards: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    printed_at: int = -1  # rollouts done when a line was last written to a log
    told_at: float = 0.0  # when ``on_progress`` was last called

    def line(self) -> str:
        width = 30
        filled = width * self.done // max(self.total, 1)
        mean = sum(self.rewards) / len(self.rewards) if self.rewards else 0.0
        return (
            f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} done, "
            f"{self.running} running, mean reward {mean:.3f}, "
            f"{time.monotonic() - self.started:.0f}s"
        )


class Rollout:
    def __init__(self, config: RolloutConfig, settings: Settings | None = None) -> None:
        self.config = config
        self.settings = settings or Settings()

    def commands(
        self, prompts: Sequence[str | PromptItem], n: int, run_id: str | None = None
    ) -> list[SubmitTask]:
        """One task per rollout: prompt i's n rollouts share the group ``<run>-p<i>``."""
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        run = run_id or new_run_id()
        out = []
        dirs = self.settings.workflow_dirs
        for i, raw in enumerate(prompts):
            item = raw if isinstance(raw, PromptItem) else PromptItem(prompt=raw)
            name = item.id or f"p{i}"
            workflow_name, workflow = self.config.task_workflow(item.system, dirs)
            for k in range(n):
                command = SubmitTask(
                    task_id=f"ro-{run}-{i}-{k}",
                    task_name=name,
                    task_source="",
                    prompt=item.prompt,
                    reference_answer=item.reference,
                    files=item.files,
                    workflow_name=workflow_name,
                    workflow_yaml=workflow,
                    group_id=f"{run}-p{i}",
                    rewards=list(self.config.rewards),
                    deadline_s=self.config.deadline_s,
                    policy=self.config.policy,
                    metadata={
                        "rollout": run,
                        "prompt_index": str(i),
                        "sample": str(k),
                        **item.metadata,
                    },
                )
                # What a daemon would refuse (a deadline <= 0) is refused here instead.
                checked_command(command)
                out.append(command)
        return out

    def run(
        self,
        prompts: Sequence[str | PromptItem],
        n: int = 1,
        on_progress: Callable[[RolloutProgress], None] | None = None,
        *,
        run_id: str | None = None,
        resume: bool = False,
    ) -> list[Trajectory]:
        """Run every prompt ``n`` times; the trajectories in submission order. ``run_id``:
        this run's id (default: a new one); an earlier run's continues it (the module's
        docstring). ``resume``: refuse a ``run_id`` the log holds no rollout of."""
        if resume and not run_id:
            raise ValueError("resume needs the run_id of the run to continue")
        commands = self.commands(prompts, n, run_id)
        agents = self._agents(commands)
        provider = self._provider(agents)
        pool = max(1, self.config.max_concurrency)
        with connected(self.settings) as bridge:
            start = bridge.call(bridge.log.end_seq())
            # A new run's id is new to the log: only a given one is looked up.
            if run_id is None:
                slots = [_Slot(c, []) for c in commands]
            else:
                slots = [_recorded(bridge, c) for c in commands]
            if resume and not any(s.events for s in slots):
                raise UsageError(
                    f"--resume {run_id}: the log holds no rollout of this run (its tasks "
                    f"are ro-{run_id}-<prompt>-<sample>)"
                )
            commands = [s.command for s in slots]
            ours = {c.task_id or "" for c in commands}
            reach_llm(bridge, provider, [SOLVER, CONDUCTOR_ROLE])
            daemon = Daemon(
                bridge,
                DaemonConfig(
                    roles=(CONDUCTOR_ROLE, *agents),
                    pool_sizes={**dict.fromkeys(agents, pool), CONDUCTOR_ROLE: min(pool, 8)},
                    ack_wait_s=self.settings.ack_wait_s,
                    llm=provider,
                    on_message=noting_other_tasks(bridge, ours, "this rollout", serving=False),
                    serves=own_work(ours),
                ),
            ).start()
            answer_pings(bridge, daemon, ours)
            with stopped_after(daemon):  # interrupted, _drive cancels what it leaves
                events = self._drive(bridge, slots, start, pool, on_progress)
        trajectories = [
            build_trajectory(c.task_id or "", events[c.task_id or ""]) for c in commands
        ]
        if self.config.save_trajectories is not None:
            self.config.save_trajectories.parent.mkdir(parents=True, exist_ok=True)
            with self.config.save_trajectories.open("w", encoding="utf-8") as out:
                for t in trajectories:
                    out.write(json.dumps(t.to_dict()) + "\n")
        return trajectories

    @staticmethod
    def _agents(commands: list[SubmitTask]) -> tuple[str, ...]:
        """The agents of the rollouts' workflows: what this process hosts."""
        texts = {(c.workflow_name, c.workflow_yaml or "") for c in commands}
        agents = (a for name, text in texts for a in parse_workflow(text, name).agents)
        return tuple(dict.fromkeys(agents))

    def _provider(self, agents: tuple[str, ...]) -> Any:
        """The LLM, with the rollout's sampling settings for every agent of it."""
        config = load_config()
        sampling = AgentLLM(
            temperature=self.config.temperature, max_tokens=self.config.max_tokens_per_step
        )
        per_agent = dict(config.agents)
        for agent in agents:
            per_agent[agent] = sampling.over(per_agent.get(agent, AgentLLM()))
        return make_provider(self.config.llm, dataclasses.replace(config, agents=per_agent))

    def _drive(
        self,
        bridge: Any,
        slots: list[_Slot],
        start: int,
        pool: int,
        on_progress: Callable[[RolloutProgress], None] | None,
    ) -> dict[str, list[Event]]:
        """Submit what is left to submit, at most ``pool`` running at once, and follow the
        log from ``start`` (read before the slots were) until every rollout is complete."""
        ours = {s.command.task_id or "" for s in slots}
        events = {s.command.task_id or "": list(s.events) for s in slots}
        states = {t: fold(t, recorded) for t, recorded in events.items()}
        inbox: queue.Queue[Event] = queue.Queue()

        async def tail() -> None:
            position = start + 1
            while True:
                try:
                    reading = bridge.log.read(start_seq=position, follow=True)
                    async with contextlib.aclosing(reading):  # its consumer goes with it
                        async for seq, event in reading:
                            position = seq + 1
                            if event.task_id in ours:
                                inbox.put(event)
                except (TransportError, TimeoutError):
                    continue  # a slow or restarting server: resume where we were

        pump = bridge.spawn(tail())
        waiting = [s.command for s in reversed(slots) if not s.events]
        progress = RolloutProgress(total=len(slots))
        finished: set[str] = set()
        for task_id, state in states.items():
            if rollout_complete(state):
                finished.add(task_id)
                progress.done += 1
                self._note_reward(progress, state)
            elif events[task_id]:
                progress.running += 1  # submitted by the run this one continues
        try:
            while len(finished) < len(slots):
                while waiting and progress.running < pool:
                    bridge.call(bridge.commands.publish(waiting.pop(), subjects.SUBMIT))
                    progress.running += 1
                if on_progress is not None and time.monotonic() - progress.told_at >= 1.0:
                    progress.told_at = time.monotonic()  # a terminal's line ticks on
                    on_progress(progress)
                try:
                    event = inbox.get(timeout=0.5)
                except queue.Empty:
                    if pump.done():
                        pump.result()  # the log could not be read: raise why
                    continue
                known = events[event.task_id]
                if known and event.seq <= known[-1].seq:
                    continue  # read with the recorded history already
                apply(states[event.task_id], event)
                known.append(event)
                state = states[event.task_id]
                if event.task_id not in finished and rollout_complete(state):
                    finished.add(event.task_id)
                    progress.running -= 1
                    progress.done += 1
                    self._note_reward(progress, state)
                    if on_progress is not None:
                        progress.told_at = time.monotonic()
                        on_progress(progress)
        except KeyboardInterrupt:
            unsubmitted = {c.task_id or "" for c in waiting}
            unfinished = [t for t in ours if t not in unsubmitted and t not in finished]
            cancel_abandoned(bridge, sorted(unfinished), "rollout interrupted")
            raise
        finally:
            pump.cancel()
        return events

    def _note_reward(self, progress: RolloutProgress, state: TaskState) -> None:
        primary = self.config.rewards[0].split("@")[0] if self.config.rewards else ""
        if primary in state.rewards:
            progress.rewards.append(state.rewards[primary].value)


@dataclass(frozen=True)
class _Slot:
    """One rollout of a run: the task this run waits for (the last attempt) and what the
    log already holds of it (nothing: not submitted yet)."""

    command: SubmitTask
    events: list[Event]


def _recorded(bridge: Any, command: SubmitTask) -> _Slot:
    """What the log holds of ``command``'s rollout: its last attempt, or a new attempt
    where the last one was cancelled (an interrupt's doing, not the policy's)."""
    attempt, current = 0, command
    while True:
        history = bridge.call(bridge.log.read_task(current.task_id or ""))
        if not history.events:
            return _Slot(current, [])
        state = fold(current.task_id or "", history.events)
        _check_same(state, current)
        if not isinstance(state.terminal, TaskCancelled):
            return _Slot(current, list(history.events))
        attempt += 1
        prompt, sample = command.metadata["prompt_index"], command.metadata["sample"]
        current = msgspec.structs.replace(
            command,
            task_id=f"ro-{command.metadata['rollout']}-{prompt}{REDO}{attempt}-{sample}",
            metadata={**command.metadata, "attempt": str(attempt)},
        )


def _check_same(state: TaskState, command: SubmitTask) -> None:
    """A rollout is continued only with what it was started with."""
    s = state.submitted
    if s is None:
        return  # its submission was quarantined or not read yet: the daemons say why
    run = command.metadata.get("rollout", "")
    if (s.prompt, s.reference_answer, s.workflow_yaml) != (
        command.prompt,
        command.reference_answer,
        command.workflow_yaml,
    ):
        raise UsageError(
            f"rollout {run}: {command.task_id} was started with another prompt, answer or "
            "agent; continue a run with the dataset and options it was started with"
        )


def print_progress(progress: RolloutProgress) -> None:
    """A bar redrawn in place on a terminal (every second: its time ticks on); in a log,
    a line every 5% of the rollouts."""
    last = progress.done == progress.total
    if sys.stderr.isatty():
        print(f"\r{progress.line()}", end="\n" if last else "", file=sys.stderr, flush=True)
    elif progress.done != progress.printed_at and (
        last or progress.done % max(1, progress.total // 20) == 0
    ):
        progress.printed_at = progress.done
        print(progress.line(), file=sys.stderr, flush=True)


def rollout_summary(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """Counts and mean rewards of a batch (what ``kernelflow rollout`` prints)."""
    by_fn: dict[str, list[float]] = {}
    for t in trajectories:
        for name, value in t.metadata.get("rewards", {}).items():
            by_fn.setdefault(name, []).append(value)
    statuses: dict[str, int] = {}
    for t in trajectories:
        status = str(t.metadata.get("status", "unfinished"))
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "rollouts": len(trajectories),
        "statuses": statuses,
        "mean_reward": {k: sum(v) / len(v) for k, v in sorted(by_fn.items())},
        "tokens": sum(t.total_tokens for t in trajectories),
    }
