"""Which calls of a candidate module call a function of one of its ``load_inline``
extensions, followed through the names that hold them.

What ``load_inline`` returns is an extension; an extension bound to another name is the
same extension (``self.ext = ext`` in ``__init__``, ``ext = self.ext`` in forward); one of
its functions, read off it, is that function (``self.fn = ext.fn``, ``fn = ext.fn`` at
module level). A name counts only where it is bound exactly once (in its scope: the
module, a function, or ``obj.attr`` across the module), so nothing else can be put
behind it. A call of an extension's function through such a name, ``H.fn(...)`` or
``F(...)``, is a kernel launch: the runtime counts it as one (:mod:`.cpp`).

Imported inside sandboxes: stdlib only.
"""

from __future__ import annotations

import ast
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from kernelflow.verification.backends.extension import ExtensionSpec

__all__ = ["ExtensionUses", "extension_uses"]

_Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
# A variable: ("scope", id of the function binding it or 0 for the module, name), or
# ("attr", holder, attribute) for ``holder.attr`` anywhere in the module.
Key = tuple[str, int, str] | tuple[str, str, str]


class _Scopes(ast.NodeVisitor):
    """Every binding and every call of the module, with the variable each names."""

    def __init__(self) -> None:
        self.stack: list[tuple[int, set[str]]] = [(0, set())]  # (function id, its locals)
        self.bound: Counter[Key] = Counter()
        self.assigned: list[tuple[Key, ast.expr, list[tuple[int, set[str]]]]] = []
        self.calls: list[tuple[ast.Call, list[tuple[int, set[str]]]]] = []
        self.named: list[tuple[int, Key]] = []  # every name and obj.attr, by node id

    def key(self, node: ast.AST, stack: list[tuple[int, set[str]]]) -> Key | None:
        if isinstance(node, ast.Name):
            for function, names in reversed(stack):
                if node.id in names:
                    return ("scope", function, node.id)
            return ("scope", 0, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return ("attr", node.value.id, node.attr)
        return None

    def visit_Module(self, node: ast.Module) -> None:
        self.stack[0][1].update(_local_names(node.body, []))
        self.generic_visit(node)

    def visit_function(self, node: _Function) -> None:
        body = [node.body] if isinstance(node, ast.Lambda) else node.body
        args = node.args
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        self.stack.append((id(node), _local_names(body, [p for p in params if p])))
        for child in body:
            self.visit(child)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_function

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            for part, value in _pairs(target, node.value):
                key = self.key(part, self.stack)
                if key is not None:
                    self.assigned.append((key, value, list(self.stack)))
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        key = self.key(node.target, self.stack)
        if node.value is not None and key is not None:
            self.assigned.append((key, node.value, list(self.stack)))
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            key = self.key(node, self.stack)
        else:
            key = ("scope", self._binding_scope(node.id), node.id)
            self.bound[key] += 1
        if key is not None:
            self.named.append((id(node), key))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        key = self.key(node, self.stack)
        if key is not None:
            self.named.append((id(node), key))
            if not isinstance(node.ctx, ast.Load):
                self.bound[key] += 1
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.calls.append((node, list(self.stack)))
        self.generic_visit(node)

    def _binding_scope(self, name: str) -> int:
        for function, names in reversed(self.stack):
            if name in names:
                return function
        return 0


def _local_names(body: list[ast.stmt] | list[ast.expr], params: list[ast.arg]) -> set[str]:
    """The names a scope binds itself (its nested scopes' own left out), but those it
    declares global or nonlocal."""
    names = {p.arg for p in params}
    declared: set[str] = set()
    for node in _own_nodes(body):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            declared.update(node.names)
    return names - declared


def _own_nodes(body: list[ast.stmt] | list[ast.expr]) -> Iterator[ast.AST]:
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _Function | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _pairs(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """Target and value, element by element where a tuple is unpacked from a tuple."""
    both = isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List)
    if both and len(target.elts) == len(value.elts):  # type: ignore[attr-defined]
        return list(zip(target.elts, value.elts, strict=True))  # type: ignore[attr-defined]
    return [(target, value)]


@dataclass(frozen=True)
class ExtensionUses:
    """Where a module uses its extensions: the calls of their functions, and the names
    and attributes (by node id) that hold an extension or one of its functions."""

    calls: dict[int, ast.Call]
    holders: frozenset[int]


def extension_uses(tree: ast.Module, built: list[tuple[ast.Call, ExtensionSpec]]) -> ExtensionUses:
    """How ``tree`` uses the extensions ``built`` (the load_inline calls and their specs)."""
    scopes = _Scopes()
    scopes.visit(tree)
    made = {id(call): frozenset(spec.exposed()) for call, spec in built}
    extensions: dict[Key, frozenset[str]] = {}  # variable -> the functions it exposes
    functions: set[Key] = set()  # variables holding one function of an extension

    def holds(node: ast.AST, stack: list[tuple[int, set[str]]]) -> frozenset[str] | None:
        key = scopes.key(node, stack)
        return extensions.get(key) if key is not None else None

    def is_function(node: ast.AST, stack: list[tuple[int, set[str]]]) -> bool:
        if isinstance(node, ast.Attribute) and node.attr in (holds(node.value, stack) or ()):
            return True
        key = scopes.key(node, stack)
        return key is not None and key in functions

    changed = True
    while changed:
        changed = False
        for key, value, stack in scopes.assigned:
            if scopes.bound[key] != 1 or key in extensions or key in functions:
                continue
            exposed = made.get(id(value)) if isinstance(value, ast.Call) else None
            exposed = exposed or holds(value, stack)
            if exposed is not None:
                extensions[key] = exposed
                changed = True
            elif is_function(value, stack):
                functions.add(key)
                changed = True
    return ExtensionUses(
        calls={id(call): call for call, stack in scopes.calls if is_function(call.func, stack)},
        holders=frozenset(
            node for node, key in scopes.named if key in extensions or key in functions
        ),
    )
