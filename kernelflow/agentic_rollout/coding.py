"""``CodingAgent`` (docs/agents.md, "CodingAgent"): the ``coding`` kind as a
``BaseAgent``, with its tools working in a sandboxed workspace, and its state
(``CodebaseState``) and phase (``SWEPhase``) read off what it did.

The tools are kernelflow's coding tools (``tools/coding.py``: ``view_file``, ``edit_file``,
``create_file``, ``search_code``, ``search_files``, ``execute_bash``, ``run_tests``), run
with their own limits by ``run_tool``. Their files are a ``Workspace``: text in memory,
never the disk. Each run works on a copy of its own (the workspace's files, and the
prompt's ``files``), changed only through the file tools' pure effects, as a daemon's
workspace is the projection of those effects in the log (``tools/workspace.py``); commands
run in the sandbox on a fresh copy of it, and what they write is discarded.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kernelflow.actors.kinds import Step, Turn
from kernelflow.actors.kinds.coding import (
    CodebaseState,
    CodingConfig,
    SWEPhase,
    codebase_state,
    phase_of,
)
from kernelflow.actors.kinds.durable import Journal
from kernelflow.agentic_rollout.kinds import ReactAgent
from kernelflow.agentic_rollout.registry import register_agent
from kernelflow.agentic_rollout.session import active_journal
from kernelflow.agentic_rollout.tools import BaseTool, ToolExecutionError
from kernelflow.projections.trajectory import StepType, Trajectory
from kernelflow.rollout import SOLVER
from kernelflow.tools.base import ToolContext, ToolError, run_tool
from kernelflow.tools.registry import make_tool
from kernelflow.tools.workspace import MAX_FILE_CHARS, check_content, check_path

__all__ = ["CODING_TOOLS", "CodebaseState", "CodingAgent", "SWEPhase", "Workspace", "WorkspaceTool"]

# The tools a CodingAgent comes with (docs/agents.md, "CodingAgent"), in its order.
CODING_TOOLS = (
    "view_file",
    "edit_file",
    "create_file",
    "search_code",
    "search_files",
    "execute_bash",
    "run_tests",
)
# Most files ``Workspace.from_directory`` takes (a workspace is held in memory).
MAX_DIRECTORY_FILES = 5000


class Workspace:
    """The files a coding agent works on: relative path → text. ``files`` are where every
    run starts; a run's changes stay in that run's copy (``current`` within it)."""

    def __init__(self, files: Mapping[str, str] | None = None) -> None:
        self.files: dict[str, str] = {}
        for path, content in (files or {}).items():
            try:
                normal = check_path(str(path))
                check_content(normal, content)
            except ToolError as exc:
                raise ValueError(f"workspace: {exc}") from None
            self.files[normal] = content
        self._runs: weakref.WeakKeyDictionary[Journal, dict[str, str]] = weakref.WeakKeyDictionary()

    @classmethod
    def from_directory(cls, root: str | Path) -> Workspace:
        """The text files under ``root`` (hidden folders, ``__pycache__``, links that lead
        out of it and files that are not UTF-8 text left out), read once: the agent never
        writes to the disk."""
        base = Path(root)
        if not base.is_dir():
            raise ValueError(f"workspace: {root} is not a directory")
        inside = base.resolve()
        files: dict[str, str] = {}
        for path in sorted(base.rglob("*")):
            relative = path.relative_to(base)
            if any(p.startswith(".") or p == "__pycache__" for p in relative.parts[:-1]):
                continue
            if not path.is_file() or not path.resolve().is_relative_to(inside):
                continue
            if path.stat().st_size > MAX_FILE_CHARS:
                continue
            try:
                files[relative.as_posix()] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue
            if len(files) > MAX_DIRECTORY_FILES:
                raise ValueError(
                    f"workspace: {root} holds more than {MAX_DIRECTORY_FILES} text files"
                )
        return cls(files)

    def start_run(self, files: Mapping[str, str] | None = None) -> None:
        """Give the run in progress a fresh copy of the workspace, with ``files`` (the
        prompt's) added."""
        journal = active_journal()
        if journal is None:
            raise RuntimeError("Workspace.start_run: only within a run")
        self._runs[journal] = {**self.files, **Workspace(files).files}

    def current(self) -> dict[str, str]:
        """The files of the run in progress (its copy, made on first use); outside a run,
        the workspace's own."""
        journal = active_journal()
        if journal is None:
            return self.files
        if journal not in self._runs:
            self._runs[journal] = dict(self.files)
        return self._runs[journal]

    def update(self, files: dict[str, str]) -> None:
        """The files of the run in progress (outside a run, the workspace's own) become
        ``files``."""
        journal = active_journal()
        if journal is None:
            self.files = files
        else:
            self._runs[journal] = files


class WorkspaceTool(BaseTool):
    """A coding tool of kernelflow's (``tools/coding.py``) on a ``Workspace``: its
    description and parameters, its limits (time, output size, rate); a failure raises
    ``ToolExecutionError`` with what the model is to read."""

    def __init__(self, name: str, workspace: Workspace) -> None:
        super().__init__()
        self.tool = make_tool(name)
        self.workspace = workspace
        self.description = self.tool.description
        self.parameters_schema = self.tool.parameters

    async def execute(self, **kwargs: Any) -> str:
        journal = active_journal()
        context = ToolContext(
            task_id=journal.task_id if journal is not None else "standalone",
            agent=SOLVER,
            files=self.workspace.current(),
        )
        outcome = await run_tool(self.tool, kwargs, context)
        if not outcome.ok:
            raise ToolExecutionError(outcome.error)
        try:
            # On the files as they are now: another call of the run may have changed them.
            changed = self.tool.effect(self.workspace.current(), kwargs)
        except ToolError as exc:
            raise ToolExecutionError(str(exc)) from None
        if changed is not None:
            self.workspace.update(changed)
        return outcome.output


@register_agent("coding")
class CodingAgent(ReactAgent):
    """A ReAct engineer in a workspace: ``CODING_TOOLS`` on ``workspace`` (a ``Workspace``,
    a mapping of files or a directory to read), phases understanding → exploration →
    planning → implementation → testing → refinement → complete, read off what it did.
    ``codebase_state`` and ``current_phase`` are those of its latest step. Settings: the
    ``react`` ones, ``answer_file``, ``exploration_before_planning``."""

    kind_name = "coding"

    def __init__(
        self,
        max_steps: int = 10,
        max_tokens_per_step: int = 512,
        temperature: float = 0.7,
        workspace: Workspace | Mapping[str, str] | str | Path | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(max_steps, max_tokens_per_step, temperature, **kwargs)
        if isinstance(workspace, Workspace):
            self.workspace = workspace
        elif isinstance(workspace, str | Path):
            self.workspace = Workspace.from_directory(workspace)
        else:
            self.workspace = Workspace(workspace)
        self.codebase_state = CodebaseState()
        self.current_phase = SWEPhase.UNDERSTANDING
        self.set_tools(self.default_tools())

    def default_tools(self) -> dict[str, Any]:
        return {name: WorkspaceTool(name, self.workspace) for name in CODING_TOOLS}

    async def run_trajectory(
        self, prompt: dict[str, Any], llm_generate_func: Any, request_id: str, **kwargs: Any
    ) -> Trajectory:
        """Run the ``coding`` kind on a copy of the workspace with the prompt's ``files``
        added; the files the run changed are ``metadata["workspace_changes"]``."""
        files = prompt.get("files") if isinstance(prompt, Mapping) else None
        self.workspace.start_run(files if isinstance(files, Mapping) else None)
        self.codebase_state = CodebaseState()
        self.current_phase = SWEPhase.UNDERSTANDING
        trajectory = await super().run_trajectory(prompt, llm_generate_func, request_id, **kwargs)
        now = self.workspace.current()
        trajectory.metadata["workspace_changes"] = {
            path: now[path] for path in sorted(self.codebase_state.modified_files) if path in now
        }
        return trajectory

    def next_step(self, turn: Turn, trajectory: Trajectory) -> Step:
        """The kind's step, on the run's files; the state and phase brought up to date."""
        self._update_phase(turn, trajectory)
        return super().next_step(
            dataclasses.replace(turn, files=self.workspace.current()), trajectory
        )

    def _update_phase(self, turn: Turn, trajectory: Trajectory) -> None:
        """Seed 003 §3.3: the state and phase from the run's tool calls so far, and the
        plan from the thoughts the agent stated while it was planning."""
        config = self.kind.config
        assert isinstance(config, CodingConfig)
        threshold = config.exploration_before_planning
        results = turn.tool_calls
        plan, done = [], 0
        for step in trajectory.steps:
            if step.step_type == StepType.ACTION_RESULT:
                done += 1
            elif (
                step.step_type == StepType.THOUGHT
                and phase_of(codebase_state(results[:done]), threshold) == SWEPhase.PLANNING
            ):
                plan.append(step.content)
        state = codebase_state(results)
        state.implementation_plan = plan
        self.codebase_state = state
        self.current_phase = phase_of(state, threshold)

    def finalize_trajectory(self, trajectory: Trajectory) -> None:
        super().finalize_trajectory(trajectory)
        if trajectory.metadata.get("final_answer_given"):
            self.current_phase = SWEPhase.COMPLETE
        trajectory.metadata["phase"] = self.current_phase.value
