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

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from kernelflow.actors.kinds.base import Finish, KindConfig, Step, Turn
from kernelflow.actors.kinds.react import ReactConfig, ReactKind
from kernelflow.actors.kinds.registry import register_kind
from kernelflow.events.model import LLMCalled, ToolCalled

Phase = Literal[
    "understanding", "exploration", "planning", "implementation", "testing", "refinement"
]
EXPLORING = frozenset({"view_file", "search_code", "search_files"})
MODIFYING = frozenset({"edit_file", "create_file"})
TESTING = frozenset({"run_tests", "execute_bash"})
MAX_ERRORS_SHOWN = 3


class CodingConfig(ReactConfig, frozen=True, forbid_unknown_fields=True):
    max_steps: int = 30
    answer_file: str | None = None
    # Explorations after which the agent is considered to be planning its change.
    exploration_before_planning: int = 3


@dataclass
class CodebaseState:
    viewed_files: list[str] = field(default_factory=list)
    modified_files: list[str] = field(default_factory=list)
    test_runs: int = 0
    tests_failed: int = 0
    last_test_passed: bool | None = None
    errors: list[str] = field(default_factory=list)
    explorations: int = 0
    edited_since_test: bool = False
    last_tool: str | None = None


def command_passed(result: ToolCalled) -> bool:
    """Whether a test or shell run succeeded (the tool reports a non-zero exit as a failed
    call)."""
    return result.ok


def codebase_state(results: list[ToolCalled]) -> CodebaseState:
    state = CodebaseState()
    for r in results:
        path = r.args.get("path")
        state.last_tool = r.tool
        if not r.ok:
            state.errors.append(f"{r.tool}: {r.error or r.output}"[:300])
        if r.tool in EXPLORING:
            state.explorations += 1
            if isinstance(path, str) and r.ok and path not in state.viewed_files:
                state.viewed_files.append(path)
        elif r.tool in MODIFYING and r.ok:
            state.edited_since_test = True
            if isinstance(path, str) and path not in state.modified_files:
                state.modified_files.append(path)
        elif r.tool in TESTING:
            state.test_runs += 1
            state.last_test_passed = command_passed(r)
            state.tests_failed += 0 if state.last_test_passed else 1
            state.edited_since_test = False
    return state


def phase_of(state: CodebaseState, exploration_before_planning: int) -> Phase:
    if state.last_tool in TESTING:
        return "testing" if state.last_test_passed else "refinement"
    if state.modified_files:
        return "refinement" if state.tests_failed and state.edited_since_test else "implementation"
    if state.explorations >= exploration_before_planning:
        return "planning"
    if state.explorations:
        return "exploration"
    return "understanding"


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
            f"[phase: {phase}] viewed: {', '.join(state.viewed_files) or '-'}; "
            f"modified: {', '.join(state.modified_files) or '-'}; "
            f"test runs: {state.test_runs} ({state.tests_failed} failed)"
        ]
        lines += [f"recent error: {e}" for e in state.errors[-MAX_ERRORS_SHOWN:]]
        return lines

    def finish(self, turn: Turn, answer: str) -> Step:
        name = self.config.answer_file
        if name is None:
            return super().finish(turn, answer)
        content = turn.files.get(name)
        if content is None:
            return Finish(answer, whole_answer=True)  # the parser says what is missing
        return Finish(f"```python\n{content.rstrip()}\n```\n")
