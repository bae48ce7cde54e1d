"""A task module executed with its size constants overridden.

A KernelBench task sizes its problem with module-level constants (``batch_size = 16``,
``N = 2048 * 2``, ``height = width = 128``, ``depth, height, width = (16, 32, 32)``) and
often derives more from them at import (``bias_shape = (out_channels, 1, 1)``). Setting
attributes on the imported module would leave the derived values stale, so the override
is written into the source instead: right after every top-level statement that binds an
overridden name, on the same line, so that everything computed later follows and line
numbers stay those of the task file::

    out_channels = 128; out_channels = 24
    bias_shape = (out_channels, 1, 1)          # (24, 1, 1) when executed

An override names a constant (``"batch_size"``) or one element of a constant tuple
(``"input_shape[0]"``, for ``input_shape = (32768,)``). The parent chooses the overrides
(:mod:`kernelflow.verification.shapes`) from the same rule: what a top-level statement
binds is :func:`bound_names`.

Child side (imported inside the sandbox): stdlib only.
"""

from __future__ import annotations

import ast
import importlib.util
import linecache
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

__all__ = ["bound_names", "load_task", "override_source", "split_key"]

_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?:\[(\d+)\])?")
# Line breaks as Python's tokenizer counts them (str.splitlines also splits on \f, \x1c...).
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def split_key(key: str) -> tuple[str, int | None]:
    """``"input_shape[0]"`` -> ``("input_shape", 0)``; ``"batch_size"`` -> ``("batch_size",
    None)``. Anything else (the key ends up in source text) raises ``ValueError``."""
    match = _KEY.fullmatch(key)
    if match is None:
        raise ValueError(f"size override {key!r} is not NAME or NAME[INDEX]")
    index = match.group(2)
    return match.group(1), None if index is None else int(index)


def bound_names(node: ast.stmt) -> list[str]:
    """The names a top-level simple statement binds: the targets of an assignment
    (chained ``a = b = 1`` and unpacked ``a, b = 1, 2`` included), an annotated or an
    augmented one. Other statements (imports, definitions, blocks) bind no size constant."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    else:
        return []
    names: list[str] = []
    for target in targets:
        elements = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
        names.extend(e.id for e in elements if isinstance(e, ast.Name))
    return names


def _override_statement(key: str, value: int) -> str:
    name, index = split_key(key)
    if index is None:
        return f"{name} = {value!r}"
    return f"{name} = (*{name}[:{index}], {value!r}, *{name}[{index + 1}:])"


def override_source(
    source: str, overrides: Mapping[str, int], tree: ast.Module | None = None
) -> str:
    """``source`` with each override (``{"batch_size": 4, "input_shape[0]": 97}``) assigned
    right after every top-level statement that binds its name, on that statement's last
    line: line numbers do not move and whatever the module derives later follows.

    ``tree`` is ``source`` parsed, if the caller has it. Raises ``ValueError`` for a key
    whose name no top-level assignment binds (a misspelt override would otherwise check
    the task's own sizes silently) and ``TypeError`` for a value that is not an int.
    """
    for key, value in overrides.items():
        split_key(key)
        if type(value) is not int:
            raise TypeError(f"size override {key}={value!r} is not an int")
    if not overrides:
        return source
    if tree is None:
        tree = ast.parse(source)
    lines = [line.encode() for line in _LINE.findall(source)]
    unbound = set(overrides)
    # Insert from the end so that earlier positions stay valid.
    for node in reversed(tree.body):
        names = bound_names(node)
        keys = [key for key in overrides if split_key(key)[0] in names]
        if not keys or node.end_lineno is None or node.end_col_offset is None:
            continue
        unbound.difference_update(keys)
        text = "".join(f"; {_override_statement(key, overrides[key])}" for key in keys)
        row, col = node.end_lineno - 1, node.end_col_offset  # col: a UTF-8 byte offset
        lines[row] = lines[row][:col] + text.encode() + lines[row][col:]
    if unbound:
        raise ValueError(
            "the task binds no top-level constant for size override(s) "
            + ", ".join(sorted(unbound))
        )
    return b"".join(lines).decode()


def load_task(task: Path | str, overrides: Mapping[str, int], name: str) -> ModuleType:
    """Execute the task (a file, or its source text) as a new module ``name`` with the
    size ``overrides`` applied as :func:`override_source` writes them, and return it.

    Contract for the judge: every call executes the task afresh and returns a new module
    object (its ``Model``, ``get_inputs`` and ``get_init_inputs`` see the overridden
    sizes and everything derived from them), so call it once per shape set; ``{}`` gives
    the task's own sizes. The module is registered in ``sys.modules`` under ``name``
    before it runs, replacing any earlier module of that name (dataclasses, pickling and
    ``inspect`` expect a real module), and removed again if running it raises. Its
    ``__file__`` is the task file (or ``<name>`` for source text) and ``linecache`` holds
    the executed text, so tracebacks show the lines that ran. Raises ``ValueError`` /
    ``TypeError`` for overrides the task cannot take (see :func:`override_source`),
    ``SyntaxError`` for a task that is not Python, and whatever the task raises as it runs.
    """
    if isinstance(task, Path):
        source = importlib.util.decode_source(task.read_bytes())  # coding cookie, or UTF-8
        filename = str(task)
    else:
        source, filename = task, f"<{name}>"
    text = override_source(source, overrides)
    code = compile(text, filename, "exec", dont_inherit=True)
    spec = importlib.util.spec_from_loader(name, loader=None, origin=filename)
    assert spec is not None  # spec_from_loader only returns None for a loader without one
    module = importlib.util.module_from_spec(spec)
    module.__file__ = filename
    linecache.cache[filename] = (len(text), None, _LINE.findall(text), filename)
    sys.modules[name] = module
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
