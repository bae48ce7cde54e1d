"""Static checks of task files and candidate modules, and a task's size constants.

Pure ``ast`` inspection: nothing here imports or executes the code it looks at, so it is
safe to call in the daemon process on untrusted input. The checks only catch what makes a
verification pointless (not Python, missing entry points); the sandbox finds the rest.
The task's module-level constants are followed by a small evaluator of constant
expressions (:func:`task_constants`), so the verifier knows the sizes a shape set can
override and what follows from them (:mod:`kernelflow.verification.shapes`).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field

from kernelflow.common.syntax import parse_module
from kernelflow.verification.child.taskload import bound_names, split_key

__all__ = [
    "CandidateError",
    "NotStatic",
    "TaskConstants",
    "TaskFileError",
    "Value",
    "check_candidate_source",
    "check_task_source",
    "evaluate",
    "parse_task",
    "size_constants",
    "task_constants",
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
    except (ValueError, RecursionError) as exc:  # null bytes; nesting too deep to parse
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


# Values a task's module-level constants can take that the static evaluator follows.
Value = int | float | bool | str | None | tuple["Value", ...]

_BIGGEST = 1 << 62  # larger ints are not sizes (and ``10 ** 10 ** 10`` must not be computed)


class NotStatic(Exception):
    """An expression whose value is not known without running the task."""


def _arithmetic(op: ast.operator, left: Value, right: Value) -> Value:
    if isinstance(left, tuple) or isinstance(right, tuple):
        if isinstance(op, ast.Add) and isinstance(left, tuple) and isinstance(right, tuple):
            return left + right
        raise NotStatic
    if not isinstance(left, int | float) or not isinstance(right, int | float):
        raise NotStatic
    try:
        if isinstance(op, ast.Pow | ast.LShift):
            if not isinstance(right, int) or not 0 <= right <= 64:
                raise NotStatic
            result = left**right if isinstance(op, ast.Pow) else int(left) << right
        else:
            result = _OPERATORS[type(op)](left, right)
    except (ArithmeticError, KeyError, TypeError, ValueError):  # ValueError: int(nan)
        raise NotStatic from None
    if isinstance(result, int) and abs(result) > _BIGGEST:
        raise NotStatic
    return result


_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def evaluate(node: ast.expr, names: dict[str, Value]) -> Value:
    """The value of a constant expression over ``names``: literals, names, tuples and lists
    (``*starred`` included) and arithmetic on numbers. Raises :class:`NotStatic` for anything
    else (calls, attributes, unknown names, nesting too deep to follow): nothing is
    executed."""
    try:
        return _evaluate(node, names)
    except RecursionError:
        raise NotStatic from None


def _evaluate(node: ast.expr, names: dict[str, Value]) -> Value:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float | str | None):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in names:
            raise NotStatic
        return names[node.id]
    if isinstance(node, ast.Tuple | ast.List):
        items: list[Value] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                inner = _evaluate(element.value, names)
                if not isinstance(inner, tuple):
                    raise NotStatic
                items.extend(inner)
            else:
                items.append(_evaluate(element, names))
        return tuple(items)
    if isinstance(node, ast.BinOp):
        return _arithmetic(node.op, _evaluate(node.left, names), _evaluate(node.right, names))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluate(node.operand, names)
        if not isinstance(operand, int | float):
            raise NotStatic
        return -operand if isinstance(node.op, ast.USub) else operand
    raise NotStatic


@dataclass
class TaskConstants:
    """A task's module-level constants as the module leaves them.

    ``values``: every name whose value the static evaluator can follow (derived ones like
    ``bias_shape = (out_channels, 1, 1)`` included). ``literals``: the size knobs, names
    whose last binding is an int written as a constant expression (``N = 2048 * 2``), and
    ``NAME[i]`` for the int elements of a tuple written as one (``input_shape = (32768,)``).
    """

    values: dict[str, Value] = field(default_factory=dict)
    literals: dict[str, int] = field(default_factory=dict)

    def bind(self, name: str, node: ast.expr | None, value: Value) -> None:
        """``name = node`` (``node`` None: a value from an unpacked non-literal)."""
        self.forget(name)
        self.values[name] = value
        if name.startswith("_") or node is None:
            return
        if _mentions_names(node):
            return  # derived from other names: it follows them, it is no knob
        if type(value) is int:
            self.literals[name] = value
        elif isinstance(value, tuple):
            for i, item in enumerate(value):
                if type(item) is int:
                    self.literals[f"{name}[{i}]"] = item

    def forget(self, name: str) -> None:
        self.values.pop(name, None)
        for key in [k for k in self.literals if split_key(k)[0] == name]:
            del self.literals[key]

    def override(self, key: str, value: int) -> None:
        """Apply a size override as :func:`~.child.taskload.override_source` does."""
        name, index = split_key(key)
        if index is None:
            self.values[name] = value
            return
        current = self.values.get(name)
        if isinstance(current, tuple) and index < len(current):
            self.values[name] = (*current[:index], value, *current[index + 1 :])


def _assign(constants: TaskConstants, target: ast.expr, node: ast.expr) -> None:
    if isinstance(target, ast.Name):
        try:
            constants.bind(target.id, node, evaluate(node, constants.values))
        except NotStatic:
            constants.forget(target.id)
        return
    if not isinstance(target, ast.Tuple | ast.List):
        return
    names = [e.id if isinstance(e, ast.Name) else None for e in target.elts]
    if (
        isinstance(node, ast.Tuple | ast.List)
        and len(node.elts) == len(names)
        and not any(isinstance(e, ast.Starred) for e in node.elts)
    ):
        for element, value_node in zip(target.elts, node.elts, strict=True):
            _assign(constants, element, value_node)
        return
    try:
        value = evaluate(node, constants.values)
    except NotStatic:
        value = None
    for i, name in enumerate(names):
        if name is None:
            continue
        if isinstance(value, tuple) and len(value) == len(names):
            constants.bind(name, None, value[i])
        else:
            constants.forget(name)


def task_constants(tree: ast.Module, overrides: Mapping[str, int] | None = None) -> TaskConstants:
    """Follow the task's top-level assignments in order, with ``overrides`` applied after
    each statement binding their names (what the child executes, see
    :func:`~.child.taskload.override_source`). Nothing is executed."""
    constants = TaskConstants()
    for node in tree.body:
        names = bound_names(node)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                _assign(constants, target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            _assign(constants, node.target, node.value)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            was_knob = name in constants.literals
            _assign(constants, node.target, ast.BinOp(node.target, node.op, node.value))
            value = constants.values.get(name)
            if was_knob and type(value) is int and not _mentions_names(node.value):
                constants.literals[name] = value  # ``N = 1024; N *= 2`` is still a knob
        for key, value in (overrides or {}).items():
            if split_key(key)[0] in names:
                constants.override(key, value)
    return constants


def _mentions_names(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) for n in ast.walk(node))


def parse_task(source: str) -> ast.Module | None:
    """The task's tree, or None if it is not Python (:func:`check_task_source` says why)."""
    tree = _parse(source, "<task>")
    return None if isinstance(tree, str) else tree


def size_constants(source: str) -> dict[str, int]:
    """The task's size knobs (:attr:`TaskConstants.literals`): what a shape set may
    override. Names starting with an underscore are private and left alone."""
    tree = parse_task(source)
    return {} if tree is None else task_constants(tree).literals
