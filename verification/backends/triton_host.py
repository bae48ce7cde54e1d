"""Which values in ``@triton.jit`` bodies may be objects of the host, not of the Triton
language.

On the CPU the interpreter runs a kernel body as Python, so whatever the launch hands a
kernel arrives as it is: a pointer's tensor, a scalar, or, where a candidate passes one,
any object (a list of tensors, a dict) whose items and methods are Python the runtime
guards do not watch inside the launch. Everything the language makes (``tl.arange``,
``tl.load``, arithmetic with such values, another kernel's result) is the language's.

So the gate follows the data: a launched kernel's arguments are the host's; a helper
kernel's parameter is the host's only where some call passes it a host value; a local is
the host's where what it is bound to may be. Indexing (``offs[:, None]``) and methods
(``acc.to(...)``, ``tile.sum(1)``) are the language's own on everything else.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from kernelflow.verification.gate.scopes import bindings_of

__all__ = ["HostValues", "host_names"]

AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef
# Builtins of the language that return one of their arguments.
_PASSING = frozenset({"min", "max"})


@dataclass(frozen=True)
class HostValues:
    """What decides, in one kernel body, whether an expression may be a host object:
    ``host``, the names that may hold one; ``language``, the module's imports (calls of
    ``tl.*``, ``math.*`` give the language's values); ``passing``, the module's kernels
    that may return what they are given (a host value in, a host value out)."""

    host: frozenset[str]
    language: frozenset[str]
    passing: frozenset[str]

    def holds(self, node: ast.AST) -> bool:
        """Whether ``node`` may evaluate to (or hold) a host object."""
        if isinstance(node, ast.Name):
            return node.id in self.host
        if isinstance(node, ast.Attribute | ast.Subscript | ast.Starred | ast.NamedExpr):
            return self.holds(node.value)
        if isinstance(node, ast.Call):
            return self._call_holds(node)
        if isinstance(node, ast.BinOp):
            # A value of the language on either side makes the result the language's; two
            # host objects (or one and a literal: `items * 2`) make another host object.
            sides = [
                (self.holds(side), isinstance(side, ast.Constant))
                for side in (node.left, node.right)
            ]
            return any(h for h, _ in sides) and all(h or c for h, c in sides)
        if isinstance(node, ast.UnaryOp):
            return self.holds(node.operand)
        if isinstance(node, ast.IfExp):
            return self.holds(node.body) or self.holds(node.orelse)
        parts: list[ast.AST] = []
        if isinstance(node, ast.BoolOp):
            parts = list(node.values)  # `a or b` is one of them
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            parts = list(node.elts)
        elif isinstance(node, ast.Dict):
            parts = [*node.values, *(k for k in node.keys if k is not None)]
        return any(self.holds(part) for part in parts)

    def _call_holds(self, node: ast.Call) -> bool:
        func = node.func
        given = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(func, ast.Name):
            if func.id in self.passing or func.id in _PASSING:
                return any(self.holds(arg) for arg in given)  # may give an argument back
            # The language's own functions imported by name, or range, len, int, float,
            # isinstance: no object of the host.
            return False
        root = func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in self.language and root.id not in self.host:
            return False  # tl.*, math.*: the language's
        # A method: of a host object, whatever it returns is the host's.
        return self.holds(func) or any(self.holds(arg) for arg in given)


def host_names(
    kernels: Mapping[str, list[AnyFunction]],
    launched: set[str],
    language: frozenset[str],
) -> tuple[dict[int, frozenset[str]], frozenset[str]]:
    """For every ``@triton.jit`` function (``kernels``: by name; a name may be defined
    more than once), keyed by ``id``: its parameters and locals that may hold host
    objects. A function launched from the host (``launched``), or called by no kernel,
    gets host values in every parameter; a helper called from kernels, in the parameters
    some call gives a host value. Also: the kernels that may return a host value they are
    given (``HostValues.passing``)."""
    params = {id(fn): _parameters(fn) for functions in kernels.values() for fn in functions}
    helpers = {
        call.func.id
        for functions in kernels.values()
        for fn in functions
        for call in ast.walk(fn)
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
    }
    tainted = {
        id(fn): set(params[id(fn)]) if name in launched or name not in helpers else set()
        for name, functions in kernels.items()
        for fn in functions
    }
    passing: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, functions in kernels.items():
            for fn in functions:
                local = _host_locals(fn, tainted[id(fn)], language, frozenset(passing))
                if name not in passing and _returns_host(fn, local):
                    passing.add(name)
                    changed = True
                for call in ast.walk(fn):
                    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
                        continue
                    for callee in kernels.get(call.func.id, ()):
                        given = _host_parameters(call, params[id(callee)], local)
                        if not given <= tainted[id(callee)]:
                            tainted[id(callee)] |= given
                            changed = True
    final = frozenset(passing)
    host = {
        id(fn): _host_locals(fn, tainted[id(fn)], language, final).host
        for functions in kernels.values()
        for fn in functions
    }
    return host, final


def _returns_host(fn: AnyFunction, values: HostValues) -> bool:
    """Whether a ``return`` of ``fn`` (its own, not a nested function's) may give a host
    value back."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return) and node.value is not None and values.holds(node.value):
            return True
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _parameters(fn: AnyFunction) -> list[str]:
    args = fn.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    return [a.arg for a in every]


def _host_parameters(call: ast.Call, params: list[str], values: HostValues) -> set[str]:
    """The parameters ``call`` gives a host value (all of them for a ``*``/``**`` one)."""
    given: set[str] = set()
    for index, arg in enumerate(call.args):
        if isinstance(arg, ast.Starred) and values.holds(arg):
            return set(params)
        if index < len(params) and values.holds(arg):
            given.add(params[index])
    for keyword in call.keywords:
        if not values.holds(keyword.value):
            continue
        if keyword.arg is None:
            return set(params)
        if keyword.arg in params:
            given.add(keyword.arg)
    return given


def _host_locals(
    fn: AnyFunction, params: set[str], language: frozenset[str], passing: frozenset[str]
) -> HostValues:
    """``params`` and the locals of ``fn`` some binding of which may be a host object."""
    values = HostValues(frozenset(params), language, passing)
    bound = bindings_of(fn.body)
    changed = True
    while changed:
        changed = False
        for name, value in bound:
            if name not in values.host and value is not None and values.holds(value):
                values = HostValues(values.host | {name}, language, passing)
                changed = True
    return values
