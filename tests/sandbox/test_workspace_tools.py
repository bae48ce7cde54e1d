"""The workspace (a projection of the log) and the tools that act on it: file tools,
commands in the sandbox, and the kernel tools against the real verifier."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kernelflow.events.model import (
    AgentDispatched,
    Event,
    OutputParsed,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.projections.task_state import fold
from kernelflow.tools import (
    ToolContext,
    ToolError,
    ToolLimits,
    ToolOutcome,
    check_path,
    make_tool,
    materialise,
    run_tool,
    workspace_files,
)

ROOT = Path(__file__).resolve().parents[2]
RELU_TASK = (ROOT / "examples" / "tasks" / "relu.py").read_text()
RELU_SOLUTION = (ROOT / "examples" / "candidates" / "solutions" / "relu.py").read_text()
TORCH_COMPUTE = (ROOT / "examples" / "candidates" / "cheats" / "torch_compute.py").read_text()

FILES = {
    "README.md": "# demo\n",
    "src/app.py": (
        "def greet(name):\n    return 'hello ' + name\n\n\ndef twice(x):\n    return x + x\n"
    ),
    "src/util.py": "ANSWER = 42\nNAME = 'util'\n",
}


def call(
    name: str, args: Any, files: Mapping[str, str] = FILES, **ctx: Any
) -> tuple[ToolOutcome, dict[str, str] | None]:
    """Run a tool on ``files`` as an agent does; its outcome and the workspace after it
    (None: the tool changes no files)."""
    tool = make_tool(name, ctx.pop("limits", None))
    context = ToolContext(task_id="t1", agent="coder", files=files, **ctx)
    outcome = asyncio.run(run_tool(tool, args, context))
    return outcome, tool.effect(files, args) if outcome.ok else None


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    ("path", "normalised"),
    [("a.py", "a.py"), ("./src//app.py", "src/app.py"), ("src/x/../app.py", "src/app.py")],
)
def test_paths_are_normalised(path: str, normalised: str) -> None:
    assert check_path(path) == normalised


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../x", "outside the workspace"),
        ("src/../../x", "outside the workspace"),
        ("..", "outside the workspace"),
        ("/etc/passwd", "absolute path"),
        ("", "empty path"),
        (".", "names the workspace itself"),
        ("src/..", "names the workspace itself"),
        ("a\0b", "NUL"),
        ("a\nb", "control character"),
        ("src\\app.py", "backslash"),
        ("x" * 300, "limit is 255"),
    ],
)
def test_paths_outside_the_rules_are_refused(path: str, problem: str) -> None:
    with pytest.raises(ToolError, match=problem):
        check_path(path)


@pytest.mark.parametrize("name", ["view_file", "create_file"])
@pytest.mark.parametrize("path", ["../secret.txt", "/etc/passwd"])
def test_file_tools_stay_in_the_workspace(name: str, path: str) -> None:
    outcome, changed = call(
        name, {"path": path, "content": "x"} if name == "create_file" else {"path": path}
    )
    assert not outcome.ok and changed is None
    assert "outside the workspace" in outcome.error or "absolute path" in outcome.error
    assert "root:" not in outcome.output


def test_materialise_writes_only_inside(tmp_path: Path) -> None:
    materialise(FILES, tmp_path)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == sorted(FILES)
    assert not any(p.is_symlink() for p in tmp_path.rglob("*"))
    assert (tmp_path / "src" / "util.py").read_text() == FILES["src/util.py"]
    with pytest.raises(ToolError, match="outside the workspace"):
        materialise({"../escape.txt": "x"}, tmp_path / "src")
    assert not (tmp_path / "escape.txt").exists()


# --------------------------------------------------------------------------- file tools


def test_view_file_numbers_lines_and_takes_a_range() -> None:
    outcome, changed = call("view_file", {"path": "src/app.py", "start_line": 5, "end_line": 9})
    assert outcome.ok and changed is None
    assert outcome.output == (
        "src/app.py (lines 5-6 of 6)\n     5\tdef twice(x):\n     6\t    return x + x"
    )
    outcome, _ = call("view_file", {"path": "src/util.py"})
    assert outcome.output.splitlines()[1:] == ["     1\tANSWER = 42", "     2\tNAME = 'util'"]


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        ({"path": "nope.py"}, "no file 'nope.py' in the workspace; files: README.md, src/app.py"),
        ({"path": "src"}, "src is a directory; its files: src/app.py, src/util.py"),
        ({"path": "src/app.py", "start_line": 7}, "past the end of src/app.py (6 lines)"),
        ({"path": "src/app.py", "start_line": 4, "end_line": 2}, "after end_line 2"),
        ({"path": "src/app.py", "start_line": 0}, "0 is less than the minimum of 1"),
    ],
)
def test_view_file_errors_say_what_to_do(args: dict[str, Any], problem: str) -> None:
    outcome, _ = call("view_file", args)
    assert not outcome.ok
    assert problem in outcome.error


def test_create_file_adds_a_file_and_refuses_existing_ones() -> None:
    outcome, changed = call("create_file", {"path": "./tests/test_app.py", "content": "a\nb\n"})
    assert outcome.ok and outcome.output == "created tests/test_app.py (2 lines)"
    assert changed == {**FILES, "tests/test_app.py": "a\nb\n"}
    for path, problem in [
        ("src/app.py", "src/app.py already exists; change it with edit_file"),
        ("src", "src is a directory"),
        ("README.md/x.py", "README.md is a file"),
    ]:
        outcome, changed = call("create_file", {"path": path, "content": ""})
        assert not outcome.ok and changed is None
        assert problem in outcome.error


def test_edit_file_replaces_a_unique_match() -> None:
    args = {"path": "src/app.py", "old_str": "return x + x", "new_str": "return 2 * x"}
    outcome, changed = call("edit_file", args)
    assert outcome.ok, outcome.error
    assert changed is not None
    assert changed["src/app.py"].endswith("def twice(x):\n    return 2 * x\n")
    assert {k: v for k, v in changed.items() if k != "src/app.py"} == {
        k: v for k, v in FILES.items() if k != "src/app.py"
    }
    assert "     6\t    return 2 * x" in outcome.output


@pytest.mark.parametrize(
    ("old", "problem"),
    [
        ("return x * x", "old_str was not found in src/app.py"),
        ("    return", "old_str occurs 2 times in src/app.py (at lines 2, 6)"),
        ("", "should be non-empty"),
    ],
)
def test_edit_file_needs_exactly_one_match(old: str, problem: str) -> None:
    outcome, changed = call("edit_file", {"path": "src/app.py", "old_str": old, "new_str": "x"})
    assert not outcome.ok and changed is None
    assert problem in outcome.error


def test_search_files_matches_globs() -> None:
    outcome, _ = call("search_files", {"glob": "*.py"})
    assert outcome.output == "src/app.py (6 lines)\nsrc/util.py (2 lines)"
    outcome, _ = call("search_files", {"glob": "**/*.md"})
    assert outcome.output == "README.md (1 line)"
    outcome, _ = call("search_files", {"glob": "*.rs"})
    assert outcome.output == "no file matches '*.rs' (3 files in the workspace)"


def test_search_code_finds_lines() -> None:
    outcome, _ = call("search_code", {"pattern": r"^\s*return\b", "glob": "src/*.py"})
    assert outcome.ok, outcome.error
    assert outcome.output == (
        "src/app.py:2:     return 'hello ' + name\nsrc/app.py:6:     return x + x"
    )
    outcome, _ = call("search_code", {"pattern": "nowhere"})
    assert outcome.output == "no matches"
    outcome, _ = call("search_code", {"pattern": "(unclosed"})
    assert not outcome.ok
    assert "invalid regular expression '(unclosed'" in outcome.error


def test_search_code_survives_a_backtracking_regex() -> None:
    files = {"a.txt": "a" * 40 + "b\n"}
    limits = ToolLimits(timeout_s=2.0)
    outcome, _ = call("search_code", {"pattern": "^(a+)+$"}, files, limits=limits)
    assert not outcome.ok
    assert "timed out after 2 s" in outcome.error


# --------------------------------------------------------------------------- workspace projection


def _submitted(**fields: Any) -> TaskSubmitted:
    base: dict[str, Any] = {
        "task_id": "t1",
        "task_name": "relu",
        "task_source": RELU_TASK,
        "workflow_name": "coding",
        "workflow_yaml": "",
        "backend": "triton",
        "group_id": "g",
    }
    return TaskSubmitted(**{**base, **fields})


def _dispatch(n: int) -> AgentDispatched:
    return AgentDispatched(task_id="t1", agent="coder", step=n, dispatch_id=f"d{n}")


def _called(n: int, tool: str, args: dict[str, Any], ok: bool = True) -> ToolCalled:
    return ToolCalled(
        task_id="t1",
        agent="coder",
        dispatch_id=f"d{n}",
        call_id=f"c-{tool}",
        tool=tool,
        args=args,
        ok=ok,
        output="",
    )


def _parsed(n: int, **fields: Any) -> OutputParsed:
    return OutputParsed(task_id="t1", agent="coder", dispatch_id=f"d{n}", fields=fields)


def test_workspace_starts_from_the_submission() -> None:
    state = fold("t1", [_submitted(candidate_code="# start\n", files={"notes.txt": "hi"})])
    assert workspace_files(state) == {
        "reference.py": RELU_TASK,
        "candidate.py": "# start\n",
        "notes.txt": "hi",
    }
    explicit = fold("t1", [_submitted(files={"reference.py": "mine", "./a//b.py": "b"})])
    assert workspace_files(explicit) == {"reference.py": "mine", "a/b.py": "b"}
    prompt_task = fold("t1", [_submitted(task_source="", prompt="fix it", files={"x.py": "1"})])
    assert workspace_files(prompt_task) == {"x.py": "1"}
    assert workspace_files(fold("t1", [])) == {}


def test_workspace_replays_file_effects_from_the_log() -> None:
    events: list[Event] = [
        _submitted(files={"src/app.py": FILES["src/app.py"]}),
        _dispatch(1),
        _called(1, "view_file", {"path": "src/app.py"}),
        _called(1, "create_file", {"path": "./tests/test_app.py", "content": "t = 1\n"}),
        _called(1, "edit_file", {"path": "src/app.py", "old_str": "x + x", "new_str": "2 * x"}),
        # A failed call changed nothing, even though replaying it now would succeed.
        _called(1, "create_file", {"path": "late.py", "content": "x"}, ok=False),
        _called(1, "execute_bash", {"command": "echo x > src/app.py"}),
        _called(1, "some_uninstalled_plugin", {"path": "src/app.py"}),
        _parsed(1, code="class ModelNew: pass\n", explanation="first try"),
        _dispatch(2),
        _called(2, "edit_file", {"path": "candidate.py", "old_str": "pass", "new_str": "x = 1"}),
        _called(2, "edit_file", {"path": "tests/test_app.py", "old_str": "1", "new_str": "2"}),
        _parsed(2, answer="no code field"),
    ]
    files = workspace_files(fold("t1", events))
    assert files == {
        "reference.py": RELU_TASK,
        "src/app.py": FILES["src/app.py"].replace("x + x", "2 * x"),
        "tests/test_app.py": "t = 2\n",
        "candidate.py": "class ModelNew: x = 1\n",
    }


def test_workspace_matches_what_the_agent_saw() -> None:
    """The effects an agent applies after each call give the workspace the log rebuilds."""
    files: Mapping[str, str] = dict(FILES)
    events: list[Event] = [_submitted(task_source="", files=FILES), _dispatch(1)]
    for name, args in [
        ("create_file", {"path": "b.py", "content": "B = 1\n"}),
        ("edit_file", {"path": "b.py", "old_str": "1", "new_str": "2"}),
        ("edit_file", {"path": "b.py", "old_str": "nothing", "new_str": "2"}),
    ]:
        outcome, changed = call(name, args, files)
        events.append(_called(1, name, args, ok=outcome.ok))
        files = changed if changed is not None else files
    assert workspace_files(fold("t1", events)) == files == {**FILES, "b.py": "B = 2\n"}


# --------------------------------------------------------------------------- commands


def test_execute_bash_cannot_modify_the_recorded_workspace() -> None:
    files = dict(FILES)
    command = "echo changed > src/util.py && rm README.md && touch new.py && cat src/util.py"
    outcome, changed = call("execute_bash", {"command": command}, files)
    assert outcome.ok, outcome.error
    assert outcome.output == "[exit status 0]\nchanged"
    assert changed is None and files == FILES
    outcome, _ = call("execute_bash", {"command": "ls -R; cat src/util.py"}, files)
    assert "new.py" not in outcome.output and "README.md" in outcome.output
    assert outcome.output.endswith("ANSWER = 42\nNAME = 'util'")


def test_execute_bash_failure_reports_status_and_output() -> None:
    outcome, _ = call("execute_bash", {"command": "echo oops >&2; exit 3"})
    assert not outcome.ok
    assert outcome.error == "[exit status 3]\noops"


FAILING_PROJECT = {
    "calc.py": "def add(a, b):\n    return a - b\n",
    "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}


def test_run_tests_reports_the_failure_then_the_fix() -> None:
    outcome, _ = call("run_tests", {}, FAILING_PROJECT)
    assert not outcome.ok
    assert outcome.error.startswith("[exit status 1]")
    assert "1 failed" in outcome.error and "test_calc.py" in outcome.error
    assert "assert -1 == 5" in outcome.error
    fix = {"path": "calc.py", "old_str": "a - b", "new_str": "a + b"}
    _, fixed = call("edit_file", fix, FAILING_PROJECT)
    assert fixed is not None
    outcome, _ = call("run_tests", {"command": "python -m pytest -q test_calc.py"}, fixed)
    assert outcome.ok, outcome.error
    assert "1 passed" in outcome.output


# --------------------------------------------------------------------------- kernel tools


def test_compile_kernel_runs_the_static_checks() -> None:
    outcome, _ = call("compile_kernel", {"code": RELU_SOLUTION}, task_source=RELU_TASK)
    assert outcome.ok, outcome.error
    outcome, _ = call("compile_kernel", {"code": TORCH_COMPUTE}, task_source=RELU_TASK)
    assert not outcome.ok
    assert "static check: torch_compute" in outcome.error
    outcome, _ = call("compile_kernel", {"code": "def f(:\n"})
    assert not outcome.ok and "not valid Python" in outcome.error
    outcome, _ = call("compile_kernel", {"code": "class ModelNew:\n    pass\nreturn 1\n"})
    assert not outcome.ok and "'return' outside function" in outcome.error


@pytest.mark.timeout(120)
def test_check_kernel_runs_the_verifier_on_small_shapes() -> None:
    outcome, _ = call("check_kernel", {"code": RELU_SOLUTION}, task_source=RELU_TASK)
    assert outcome.ok, outcome.error
    assert outcome.output.startswith("verdict: pass")
    wrong = RELU_SOLUTION.replace("tl.maximum(x, 0.0)", "tl.minimum(x, 0.0)")
    outcome, _ = call("check_kernel", {"code": wrong}, task_source=RELU_TASK)
    assert not outcome.ok
    assert outcome.error.startswith("verdict: mismatch")
    assert "differ from the reference" in outcome.error
    outcome, _ = call("check_kernel", {"code": RELU_SOLUTION})
    assert not outcome.ok and "no reference model" in outcome.error
