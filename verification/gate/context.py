"""When each of a candidate module's functions can run, found from who refers to it: the
gate judges a function's body by that (:class:`~.scopes.Scope`'s ``where``).

- A function used as a value (a grid lambda's ``grid`` function, a hook) may run during a
  launch: a *callback*.
- One that runs only while the module is built (``__init__``, the helpers only
  ``__init__``-time code calls, ``reset_parameters``) is *init* code, as is one nothing
  refers to at all (a ``get_inputs`` copied from the task: the verifier never calls a
  candidate's, so it never runs).
- Every other function may run in a call of ``forward``: a *forward path*.

References are matched by name alone (``self.helper()``, ``helper()``, ``obj.helper``), so
a name used anywhere else counts against it: the judgement errs towards forward. Methods
that PyTorch itself calls on a module (``forward``, ``to``, ``eval``, ``_apply`` ...:
``NN_MODULE_API``) or on an autograd function (``setup_context`` ...) always count as
forward paths, whoever else calls them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from kernelflow.verification.gate.rules import AUTOGRAD_API, NN_MODULE_API

__all__ = ["callbacks", "dead_functions", "init_functions"]

AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef
IMPLICIT = NN_MODULE_API | AUTOGRAD_API  # methods PyTorch calls itself


def callbacks(tree: ast.Module, called: set[int], functions: set[str]) -> set[str]:
    """The names of ``functions`` the module uses as values (not called where they are
    named): ``called`` holds the ids of the expressions the module calls."""
    used: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in called or not isinstance(getattr(node, "ctx", None), ast.Load):
            continue
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    return used & functions


def init_functions(tree: ast.Module, skip: set[int]) -> set[int]:
    """The ids of the module-level functions and methods that run only while the module is
    built, or never (see the module's docstring); ``skip``: functions judged otherwise
    (kernels, callbacks)."""
    candidates = [(fn, method) for fn, method in _top_functions(tree) if id(fn) not in skip]
    references: dict[str, list[int | None]] = {}
    for name, where in _references(tree):
        references.setdefault(name, []).append(where)
    init = {id(fn) for fn, method in candidates if method and fn.name == "__init__"}
    changed = True
    while changed:
        changed = False
        for fn, method in candidates:
            if id(fn) in init or (method and fn.name in IMPLICIT):
                continue
            if all(where in init for where in references.get(fn.name, [])):
                init.add(id(fn))
                changed = True
    return init


def dead_functions(tree: ast.Module, skip: set[int]) -> set[int]:
    """The ids of the module-level functions and methods nothing refers to (and PyTorch
    does not call): they never run (``skip``: as for :func:`init_functions`)."""
    referred = {name for name, _ in _references(tree)}
    return {
        id(fn)
        for fn, method in _top_functions(tree)
        if id(fn) not in skip
        and fn.name not in referred
        and not (method and (fn.name in IMPLICIT or fn.name == "__init__"))
    }


def _top_functions(tree: ast.Module) -> Iterator[tuple[AnyFunction, bool]]:
    """Module-level functions (False) and the methods of module-level classes (True)."""
    for node in tree.body:
        if isinstance(node, AnyFunction):
            yield node, False
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, AnyFunction):
                    yield item, True


def _references(tree: ast.Module) -> Iterator[tuple[str, int | None]]:
    """(name read, the id of the innermost function reading it; None at module or class
    level) for every name and attribute read in the module, decorators and defaults
    included (they run where the function is defined)."""
    stack: list[tuple[ast.AST, int | None]] = [(tree, None)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            yield node.id, where
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            yield node.attr, where
        if isinstance(node, AnyFunction | ast.Lambda):
            outside = [*node.args.defaults, *node.args.kw_defaults]
            if not isinstance(node, ast.Lambda):
                outside += [*node.decorator_list, *([node.returns] if node.returns else [])]
            stack.extend((child, where) for child in outside if child is not None)
            body = [node.body] if isinstance(node, ast.Lambda) else node.body
            stack.extend((child, id(node)) for child in body)
            continue
        stack.extend((child, where) for child in ast.iter_child_nodes(node))
