"""Seed 003 §3.3's CodingAgent running its commands (issue 52, part B): ``run_tests``,
``execute_bash`` and ``search_code`` run in the sandbox on a copy of the run's workspace,
and the phase follows the test runs (the rest: tests/unit/test_seed003_port_b.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from kernelflow.agentic_rollout import CodingAgent, SWEPhase

PROJECT = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}
REPLIES = [
    "Thought: where is add?\nAction: search_code(pattern='def add')",
    "Thought: do the tests pass?\nAction: run_tests()",
    "Thought: fix it.\nAction: edit_file(path='calc.py', old_str='a - b', new_str='a + b')",
    "Thought: again.\nAction: run_tests()",
    "Thought: can a command change it?\nAction: execute_bash(command='echo x > calc.py')",
    "Thought: the tests pass.\nFinal Answer: fixed",
]


def test_the_coding_agent_tests_fixes_and_retests_in_its_sandboxed_workspace() -> None:
    agent = CodingAgent(workspace=PROJECT)
    phases: list[SWEPhase] = []

    async def llm(messages: list[dict[str, Any]], **kwargs: Any) -> str:
        phases.append(agent.current_phase)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return REPLIES[min(turn, len(REPLIES) - 1)]

    trajectory = asyncio.run(agent.run_trajectory({"content": "fix add"}, llm, "fix"))
    assert phases == [
        SWEPhase.UNDERSTANDING,
        SWEPhase.EXPLORATION,
        SWEPhase.REFINEMENT,  # the tests failed
        SWEPhase.REFINEMENT,  # edited after a failure
        SWEPhase.TESTING,  # and they pass
        SWEPhase.TESTING,
    ]
    assert agent.current_phase == SWEPhase.COMPLETE
    state = agent.codebase_state
    assert state.search_cache["search_code(pattern='def add')"] == ["calc.py:1: def add(a, b):"]
    # A command counts as a test run (the coding kind's choice): three runs, one failed.
    assert (state.test_runs, state.tests_failed) == (3, 1)
    assert state.test_results["run_tests"]["passed"] is True
    assert state.test_results["echo x > calc.py"]["passed"] is True
    assert state.errors_encountered[0].startswith("run_tests: [exit status 1]")
    # What a command writes is discarded: the run's calc.py is the edited one.
    assert trajectory.metadata["workspace_changes"] == {
        "calc.py": PROJECT["calc.py"].replace("a - b", "a + b")
    }
