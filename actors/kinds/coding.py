"""The ``coding`` kind: a ReAct agent for software work in a workspace
(docs/agents.md, "Kinds").

It works through the phases understanding → exploration → planning → implementation →
testing → refinement, which are read off what it has done (``CodebaseState``: files
viewed and modified, test runs and errors), and after every observation it is shown that
state and its phase, so a long session stays oriented. Its workspace is the projection of
its file tools (``kernelflow.tools.workspace``).

Extra setting: ``answer_file`` — when set (e.g. ``candidate.py`` for a kernel coder) the
agent's answer is that file's content in the workspace when it gives its Final Answer, so
the model never has to repeat a long file in its reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from kernelflow.actors.kinds.base import Finish, KindConfig, Step, Turn
from kernelflow.actors.kinds.formats import format_call
from kernelflow.actors.kinds.react import ReactConfig, ReactKind
from kernelflow.actors.kinds.registry import register_kind
from kernelflow.events.model import LLMCalled, ToolCalled


class SWEPhase(StrEnum):
    """The phases of docs/agents.md, "CodingAgent", in order; ``COMPLETE`` once the agent
    gave its answer."""

    UNDERSTANDING = "understanding"
    EXPLORATION = "exploration"
    PLANNING = "planning"
    IMPLEMENTATION = "implementation"
    TESTING = "testing"
    REFINEMENT = "refinement"
    COMPLETE = "complete"


EXPLORING = frozenset({"view_file", "search_code", "search_files"})
SEARCHING = frozenset({"search_code", "search_files"})
MODIFYING = frozenset({"edit_file", "create_file"})
TESTING = frozenset({"run_tests", "execute_bash"})
MAX_ERRORS_SHOWN = 3
MAX_ERROR_CHARS = 300
# What ``test_results`` keeps of a run's output (its end: where the summary is).
MAX_TEST_OUTPUT_CHARS = 2000
# The workspace root: commands run there, and no tool changes directory (tools/coding.py).
WORKSPACE_ROOT = "."


class CodingConfig(ReactConfig, frozen=True, forbid_unknown_fields=True):
    max_steps: int = 30
    answer_file: str | None = None
    # Explorations after which the agent is considered to be planning its change.
    exploration_before_planning: int = 3


@dataclass
class CodebaseState:
    """What a coding agent did so far, read off its tool calls (the AgenticRollout
    document's fields, then the counts its phase is read from)."""

    viewed_files: set[str] = field(default_factory=set)
    modified_files: set[str] = field(default_factory=set)
    # Each command run (``run_tests``, ``execute_bash``): ``passed`` and its output's end.
    test_results: dict[str, Any] = field(default_factory=dict)
    # Each search (as its call reads: ``search_code(pattern='def')``): the lines it found.
    search_cache: dict[str, list[str]] = field(default_factory=dict)
    current_dir: str = WORKSPACE_ROOT
    errors_encountered: list[str] = field(default_factory=list)
    # The thoughts the agent stated while planning (filled by whoever reads its replies:
    # kernelflow.agentic_rollout.coding); the calls alone hold none.
    implementation_plan: list[str] = field(default_factory=list)
    test_runs: int = 0
    tests_failed: int = 0
    last_test_passed: bool | None = None
    explorations: int = 0
    edited_since_test: bool = False
    last_tool: str | None = None


def command_passed(result: ToolCalled) -> bool:
    """Whether a test or shell run succeeded (the tool reports a non-zero exit as a failed
    call)."""
    return result.ok


def codebase_state(results: Sequence[ToolCalled]) -> CodebaseState:
    state = CodebaseState()
    for r in results:
        path = r.args.get("path")
        state.last_tool = r.tool
        if not r.ok:
            state.errors_encountered.append(f"{r.tool}: {r.error or r.output}"[:MAX_ERROR_CHARS])
        if r.tool in EXPLORING:
            state.explorations += 1
            if isinstance(path, str) and r.ok:
                state.viewed_files.add(path)
            if r.tool in SEARCHING and r.ok:
                state.search_cache[format_call(r.tool, r.args)] = r.output.splitlines()
        elif r.tool in MODIFYING and r.ok:
            state.edited_since_test = True
            if isinstance(path, str):
                state.modified_files.add(path)
        elif r.tool in TESTING:
            state.test_runs += 1
            state.last_test_passed = command_passed(r)
            state.tests_failed += 0 if state.last_test_passed else 1
            state.edited_since_test = False
            command = str(r.args.get("command") or r.tool)
            state.test_results[command] = {
                "passed": state.last_test_passed,
                "output": r.output[-MAX_TEST_OUTPUT_CHARS:],
            }
    return state


def phase_of(state: CodebaseState, exploration_before_planning: int) -> SWEPhase:
    if state.last_tool in TESTING:
        return SWEPhase.TESTING if state.last_test_passed else SWEPhase.REFINEMENT
    if state.modified_files:
        if state.tests_failed and state.edited_since_test:
            return SWEPhase.REFINEMENT
        return SWEPhase.IMPLEMENTATION
    if state.explorations >= exploration_before_planning:
        return SWEPhase.PLANNING
    if state.explorations:
        return SWEPhase.EXPLORATION
    return SWEPhase.UNDERSTANDING


@register_kind("coding")
class CodingKind(ReactKind):
    config_type: ClassVar[type[KindConfig]] = CodingConfig
    config: CodingConfig
    instructions = "kind_coding.txt"

    def status_lines(self, turn: Turn, call: LLMCalled) -> list[str]:
        # The state as it was after this reply's tools ran: earlier replies' lines never
        # change when later tools run.
        upto = turn.llm_calls.index(call) + 1
        results = [r for c in turn.llm_calls[:upto] for r in turn.results_of(c)]
        if not results:
            return []
        state = codebase_state(results)
        phase = phase_of(state, self.config.exploration_before_planning)
        lines = [
            f"[phase: {phase}] viewed: {', '.join(sorted(state.viewed_files)) or '-'}; "
            f"modified: {', '.join(sorted(state.modified_files)) or '-'}; "
            f"test runs: {state.test_runs} ({state.tests_failed} failed)"
        ]
        lines += [f"recent error: {e}" for e in state.errors_encountered[-MAX_ERRORS_SHOWN:]]
        return lines

    def finish(self, turn: Turn, answer: str) -> Step:
        name = self.config.answer_file
        if name is None:
            return super().finish(turn, answer)
        content = turn.files.get(name)
        if content is None:
            return Finish(answer, whole_answer=True)  # the parser says what is missing
        return Finish(f"```python\n{content.rstrip()}\n```\n")
