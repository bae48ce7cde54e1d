"""What a candidate hands ``load_inline``, read from its source without running it: the
values the source spells out, as Python would compute them.

A value is readable when it is a literal (a string, a number, ``True``/``False``/``None``)
or built from readable values by what only formats text: ``+`` of strings or lists,
f-strings, ``sep.join([...])``, ``"...".format(...)`` and ``"..." % (...)`` (with plain
fields: no attribute or item access), lists and tuples; and a name is readable when it
is bound exactly once, to a readable value, at module level or in the function that
makes the call (KernelBench's models build sources in ``__init__`` and as f-strings of
module constants). Anything else, a call of the candidate's own or a name bound twice,
is unreadable: the verifier compiles exactly what it reads, so what it cannot read is
refused. In the candidate's process the same expressions give the same values, and
``load_inline`` loads only what was built from them.

Imported inside sandboxes: stdlib only.
"""

from __future__ import annotations

import ast
import re
import string
from collections import Counter
from collections.abc import Iterable

__all__ = ["UNREADABLE", "Values", "call_scopes"]

_Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
# str.format / % fields that only place a value: {}, {0}, {name}, {name:>8}, %s, %d, %.3f
_PLAIN_FIELD = re.compile(r"^(\d+|[A-Za-z_]\w*)?$")


class _Unreadable:
    def __repr__(self) -> str:
        return "UNREADABLE"


UNREADABLE = _Unreadable()


def _stored_names(nodes: Iterable[ast.AST]) -> Counter[str]:
    """How often each name is bound in ``nodes`` (nested functions and classes left out:
    their names are their own)."""
    counts: Counter[str] = Counter()
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            counts[node.id] += 1
        elif isinstance(node, ast.arg):
            counts[node.arg] += 1
        elif isinstance(node, ast.alias):
            counts[(node.asname or node.name).split(".")[0]] += 1
        if isinstance(node, _Function | ast.ClassDef):
            if not isinstance(node, ast.Lambda):
                counts[node.name] += 1
            continue
        stack.extend(ast.iter_child_nodes(node))
    return counts


class Values:
    """The readable values of one scope: the module's names, or a function's own names
    with the module's behind them."""

    def __init__(
        self,
        body: list[ast.stmt],
        outer: Values | None = None,
        *,
        parameters: Iterable[ast.arg] = (),
        rebound: frozenset[str] = frozenset(),
    ) -> None:
        self.outer = outer
        self.known: dict[str, object] = {}
        bound = _stored_names(body)
        bound.update({name: 2 for name in rebound})  # `global` names: bound elsewhere too
        self.local = set(bound) | {a.arg for a in parameters}
        for statement in body:  # in order: a value may use the names bound before it
            for node in _assignments(statement):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name) and bound[target.id] == 1 and node.value:
                    value = self.read(node.value)
                    if value is not UNREADABLE:
                        self.known[target.id] = value

    def name(self, identifier: str) -> object:
        if identifier in self.known:
            return self.known[identifier]
        if identifier in self.local or self.outer is None:
            return UNREADABLE
        return self.outer.name(identifier)

    def read(self, node: ast.AST) -> object:
        """The value ``node`` spells out, or UNREADABLE."""
        if isinstance(node, ast.Constant):
            ok = isinstance(node.value, str | int | float | bool | type(None))
            return node.value if ok else UNREADABLE
        if isinstance(node, ast.Name):
            return self.name(node.id)
        if isinstance(node, ast.List | ast.Tuple):
            items = [self.read(item) for item in node.elts]
            return UNREADABLE if UNREADABLE in items else items
        if isinstance(node, ast.JoinedStr):
            return self._fstring(node)
        if isinstance(node, ast.BinOp):
            return self._binop(node)
        if isinstance(node, ast.Call):
            return self._method(node)
        return UNREADABLE

    def _binop(self, node: ast.BinOp) -> object:
        left, right = self.read(node.left), self.read(node.right)
        if UNREADABLE in (left, right):
            return UNREADABLE
        if isinstance(node.op, ast.Add) and type(left) is type(right) and type(left) in (str, list):
            return left + right  # type: ignore[operator]
        if isinstance(node.op, ast.Mod) and isinstance(left, str):
            fields = re.findall(r"%(?:\((\w+)\))?[-#0 +]*\d*(?:\.\d+)?[sdifgGeExXr%]", left)
            if any(fields) or not _scalars(right if isinstance(right, list) else [right]):
                return UNREADABLE
            try:
                return left % (tuple(right) if isinstance(right, list) else right)
            except (TypeError, ValueError):
                return UNREADABLE
        return UNREADABLE

    def _fstring(self, node: ast.JoinedStr) -> object:
        parts: list[str] = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
                continue
            assert isinstance(value, ast.FormattedValue)
            inner = self.read(value.value)
            spec = self.read(value.format_spec) if value.format_spec else ""
            if not _scalars([inner]) or not isinstance(spec, str):
                return UNREADABLE
            converted = {-1: inner, 115: str(inner), 114: repr(inner), 97: ascii(inner)}
            try:
                parts.append(format(converted[value.conversion], spec))
            except (KeyError, TypeError, ValueError):
                return UNREADABLE
        return "".join(parts)

    def _method(self, node: ast.Call) -> object:
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr not in ("join", "format"):
            return UNREADABLE
        receiver = self.read(func.value)
        args = [self.read(a) for a in node.args]
        if not isinstance(receiver, str) or any(k.arg is None for k in node.keywords):
            return UNREADABLE
        kwargs = {str(k.arg): self.read(k.value) for k in node.keywords}
        if func.attr == "join":
            items = args[0] if len(args) == 1 and not kwargs else None
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                return UNREADABLE
            return receiver.join(items)
        fields = [f for _, f, _, _ in string.Formatter().parse(receiver) if f is not None]
        values = [*args, *kwargs.values()]
        if not all(_PLAIN_FIELD.match(f) for f in fields) or not _scalars(values):
            return UNREADABLE
        try:
            return receiver.format(*args, **kwargs)
        except (IndexError, KeyError, TypeError, ValueError):
            return UNREADABLE


def _scalars(values: list[object]) -> bool:
    return all(isinstance(v, str | int | float | bool) for v in values)


def _assignments(statement: ast.stmt) -> list[ast.Assign | ast.AnnAssign]:
    """The single-target assignments of ``statement`` that run in its scope, in order (a
    statement's nested blocks included, nested functions and classes left out)."""
    found: list[ast.Assign | ast.AnnAssign] = []
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.AnnAssign) or (
            isinstance(node, ast.Assign) and len(node.targets) == 1
        ):
            found.append(node)
        elif isinstance(node, _Function | ast.ClassDef):
            continue
        stack[:0] = [n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)]
    return found


def call_scopes(tree: ast.Module) -> dict[int, Values]:
    """For each call in ``tree`` (by id), the readable values where it is made."""
    declared = frozenset(
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Global | ast.Nonlocal)
        for name in node.names
    )
    module = Values(tree.body, rebound=declared)
    scopes: dict[int, Values] = {}

    def visit(node: ast.AST, values: Values) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, _Function):
                a = child.args
                every = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                parameters = [arg for arg in every if arg is not None]
                body = [] if isinstance(child, ast.Lambda) else child.body
                visit(child, Values(body, values, parameters=parameters, rebound=declared))
            elif isinstance(child, ast.ClassDef):
                visit(child, module)  # a class body's names are not its methods'
            else:
                if isinstance(child, ast.Call):
                    scopes[id(child)] = values
                visit(child, values)

    visit(tree, module)
    return scopes
