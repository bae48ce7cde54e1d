"""Static checks of task files and candidate modules.

Pure ``ast`` inspection: nothing here imports or executes the code it looks at, so it is
safe to call in the daemon process on untrusted input. The checks only catch what makes a
verification pointless (not Python, missing entry points); the sandbox finds the rest.
"""

from __future__ import annotations

import ast

from kernelflow.actors.syntax import parse_module

__all__ = [
    "CandidateError",
    "TaskFileError",
    "check_candidate_source",
    "check_task_source",
    "size_constants",
]

# What a KernelBench-format task must define at module level.
_TASK_NAMES: tuple[tuple[str, str], ...] = (
    ("Model", "class"),
    ("get_inputs", "function"),
    ("get_init_inputs", "function"),
)


class TaskFileError(ValueError):
    """The task file cannot be used as a reference (one message naming file and problem)."""


class CandidateError(ValueError):
    """The candidate module cannot be verified (one message an LLM coder can act on)."""


def _parse(source: str, filename: str) -> ast.Module | str:
    """Parse ``source``; return the tree, or a one-line description of the syntax error."""
    try:
        return parse_module(source, filename=filename)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno is not None else "unknown line"
        if exc.offset:
            where += f", column {exc.offset}"
        text = (exc.text or "").strip()
        snippet = f": {text!r}" if text else ""
        return f"not valid Python ({exc.msg} at {where}{snippet})"
    except ValueError as exc:  # e.g. "source code string cannot contain null bytes"
        return f"not valid Python ({exc})"


def _top_level_names(tree: ast.Module) -> dict[str, str]:
    """Map each name bound at module level to what binds it: class, function or value.

    Statements nested in top-level ``if``/``try`` blocks count too (a task may define its
    inputs under a version check); bodies of functions and classes do not.
    """
    names: dict[str, str] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                names[node.name] = "class"
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names[node.name] = "function"
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.setdefault(target.id, "value")
            elif isinstance(node, ast.ImportFrom | ast.Import):
                for alias in node.names:
                    names.setdefault(alias.asname or alias.name.split(".")[0], "import")
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                if isinstance(node, ast.Try):
                    visit(node.finalbody)
                    for handler in node.handlers:
                        visit(handler.body)

    visit(tree.body)
    return names


def check_task_source(source: str, filename: str = "<task>") -> None:
    """Raise :class:`TaskFileError` unless ``source`` looks like a KernelBench task.

    A task defines ``class Model``, ``get_inputs()`` and ``get_init_inputs()`` at module
    level. All missing names are reported in one message so the user fixes them at once.
    """
    tree = _parse(source, filename)
    if isinstance(tree, str):
        raise TaskFileError(f"task file {filename}: {tree}")
    names = _top_level_names(tree)
    problems: list[str] = []
    for name, kind in _TASK_NAMES:
        bound = names.get(name)
        if bound is None:
            problems.append(f"missing `{name}` ({'class' if kind == 'class' else 'def'})")
        elif kind == "class" and bound != "class":
            problems.append(f"`{name}` must be a class (it is a {bound})")
    if problems:
        raise TaskFileError(
            f"task file {filename}: {'; '.join(problems)} "
            "(KernelBench format: class Model(nn.Module), get_inputs(), get_init_inputs())"
        )


def check_candidate_source(source: str) -> None:
    """Raise :class:`CandidateError` unless ``source`` parses and defines ``class ModelNew``."""
    tree = _parse(source, "candidate.py")
    if isinstance(tree, str):
        raise CandidateError(f"candidate code is {tree}")
    if _top_level_names(tree).get("ModelNew") != "class":
        raise CandidateError(
            "candidate code defines no top-level `class ModelNew(nn.Module)`; it must define "
            "ModelNew with the same __init__ arguments and forward() inputs as Model"
        )


def size_constants(source: str) -> dict[str, int]:
    """Module-level ``NAME = <int>`` assignments of a task (its size knobs), in order.

    Booleans are not sizes; names starting with an underscore are private and left alone.
    """
    tree = _parse(source, "<task>")
    if isinstance(tree, str):
        return {}
    found: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if (
            isinstance(target, ast.Name)
            and not target.id.startswith("_")
            and isinstance(value, ast.Constant)
            and type(value.value) is int
        ):
            found[target.id] = value.value
    return found
