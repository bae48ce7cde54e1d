"""Where candidate code runs, for the gate, and which of a function's names hold values the
call itself made.

Every function body is judged by where it runs (:class:`Scope`): ``__init__`` builds
state; a kernel function's body (``@triton.jit``) is the kernel; a lambda, or a function
passed around as a value (a grid, a hook), may run during a launch; every other function
is a forward path.
In a forward path a write (``a.b = ...``, ``a[k] = ...``, ``a.append(...)``,
``a.copy_(...)``) must land in a value made in this call: anything else (``self``,
arguments, globals, closures, and locals that alias them) outlives the call and could
carry results from one call to the next. Whether the name written through holds such a
value is judged where it is written, by the bindings that reach it there
(:mod:`.flow`): ``shape = x.shape; shape = list(shape); shape.pop(d)`` changes the
call's list. A container made in the call (``list(x.shape)``, ``[...]``, ``dict(...)``,
a comprehension) may itself be changed (``perm.pop(d)``, ``shape[d] = 1``) even when what
it holds is not the call's: changing what it holds is judged by where that came from.

A name is judged by what it refers to: a function's own parameter or local named like a
builtin (``input``, ``vars``) is that value, not the builtin.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from kernelflow.verification.backends.base import dotted_name
from kernelflow.verification.gate.chains import Context, shown
from kernelflow.verification.gate.flow import flow_reads, root_name
from kernelflow.verification.gate.state import input_locals

__all__ = [
    "CLASS_BODY",
    "MODULE",
    "Scope",
    "bindings_of",
    "function_scope",
    "kept_state",
    "root_name",
    "write_root",
]

Where = Literal["module", "class", "init", "function", "launch", "jit"]
AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


@dataclass(frozen=True)
class Scope:
    where: Where
    params: frozenset[str] = frozenset()
    bound: frozenset[str] = frozenset()  # every local name, the parameters included
    # Ids of the names read (and written through) where only bindings of values made in
    # the call reach them (flow).
    fresh: frozenset[int] = frozenset()
    constexprs: frozenset[str] = frozenset()  # parameters annotated tl.constexpr
    receiver: str = ""  # a method's first parameter (self)
    makers: frozenset[str] = frozenset()  # names whose calls make new values (held_loads)
    # Ids of the names read where only bindings of containers made in the call (or of
    # values made in it) reach them: the container may be changed, what it holds may not.
    containers: frozenset[int] = frozenset()
    enclosing: frozenset[str] = frozenset()  # names bound in enclosing function scopes
    # In a kernel body: the names that may hold objects of the host (a launched kernel's
    # arguments, and what is made of them without the kernel language).
    host: frozenset[str] = frozenset()
    # The call's inputs (every parameter but the receiver) and the locals made from their
    # data (state).
    tainted: frozenset[str] = frozenset()
    function: int = 0  # the id of the function (or lambda) whose body this is
    # In a kernel body: the name of the backend whose kernel language it is written in.
    dsl: str = ""

    def made_here(self, name: ast.Name | None) -> bool:
        """Whether ``name`` (a read of it) holds a value made in this call."""
        return name is not None and id(name) in self.fresh

    def container_here(self, name: ast.Name | None) -> bool:
        """Whether ``name`` (a read of it) holds a container made in this call."""
        return name is not None and id(name) in self.containers

    def shadows(self, name: str) -> bool:
        """Whether ``name`` here refers to a local of this or an enclosing function (so
        not to a builtin of that name)."""
        return name in self.bound or name in self.enclosing

    @property
    def context(self) -> Context:
        """How the module chains used here are judged (chains)."""
        if self.where == "init" or self.where == "launch" or self.where == "jit":
            return self.where
        return "forward"


MODULE = Scope("module")
CLASS_BODY = Scope("class")

# A binding whose value always outlives the call (a `global` name).
_OUTSIDE = ast.Name(id="<outside>")


def function_scope(
    func: AnyFunction,
    where: Where,
    *,
    makers: frozenset[str],
    method: bool,
    enclosing: frozenset[str] = frozenset(),
    host: frozenset[str] = frozenset(),
    fresh_params: frozenset[str] = frozenset(),
    dsl: str = "",
) -> Scope:
    """``makers``: names whose calls make new values (flow.held_loads); ``method``: whether
    ``func`` is defined in a class body; ``enclosing``: the names enclosing functions
    bind; ``host`` (a kernel's): its names that may hold host objects; ``fresh_params``:
    parameters whose value is made for each call (an autograd function's ctx); ``dsl``
    (a kernel's): the backend whose kernel language it is written in."""
    args = func.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    params = frozenset(a.arg for a in every)
    constexprs = frozenset(
        a.arg
        for a in every
        if a.annotation is not None and (dotted_name(a.annotation) or "").endswith("constexpr")
    )
    body = [func.body] if isinstance(func, ast.Lambda) else func.body
    bindings = bindings_of(body)
    bound = params | {name for name, _ in bindings}
    reads = flow_reads(func, makers=makers, fresh_params=fresh_params, shadowed=bound | enclosing)
    positional = [*args.posonlyargs, *args.args]
    receiver = positional[0].arg if method and positional else ""
    tainted = input_locals(bindings, params - {receiver})
    return Scope(
        where,
        params,
        frozenset(bound),
        reads.fresh,
        constexprs,
        receiver,
        makers,
        reads.containers,
        enclosing,
        host,
        tainted,
        id(func),
        dsl,
    )


def write_root(target: ast.AST) -> str | None:
    """The name a write into ``target`` (an attribute, item, or a method's receiver) lands
    in: ``self`` for ``self.d[k]``, ``type`` for ``type(self).d``; None when it is not a
    name at all."""
    node = target
    while True:
        if isinstance(node, ast.Attribute | ast.Subscript | ast.Starred):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def kept_state(root: str | None, scope: Scope, what: str) -> str:
    """The caching message for ``what`` (a write) landing in ``root``, outside the call."""
    if root is None:
        holder = "an object that outlives the call"
    elif root == scope.receiver:
        holder = (
            f"`{root}`, whose state outlives the call (a registered buffer may be updated "
            "in place only where forward never reads it back, or under `if "
            f"{root}.training:` with only eval-mode code reading it)"
        )
    elif root in vars(builtins):
        holder = f"an object reached through `{root}(...)`"
    elif root in scope.params:
        holder = f"`{shown(root)}`, an argument (the inputs belong to the caller)"
    elif root in scope.bound:
        holder = f"`{shown(root)}`, which refers to state kept outside the call"
    else:
        holder = f"`{shown(root)}`, defined outside this function"
    return (
        f"{what} {holder}: forward must not keep results across calls (result caching); "
        "write only into tensors allocated in the call, keep state in __init__"
    )


def bindings_of(body: list[ast.stmt] | list[ast.expr]) -> list[tuple[str, ast.AST | None]]:
    """(name, the value it is bound to; None for a new object) for every name the body
    binds, nested functions and classes excluded (but their names)."""
    return list(_bindings(body))


def _bindings(body: list[ast.stmt] | list[ast.expr]) -> Iterator[tuple[str, ast.AST | None]]:
    """(name, the value it is bound to; None for a new object) for every name the body binds,
    nested functions and classes excluded (but their names)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node.name, None
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Assign):
            for target in node.targets:
                yield from _targets(target, node.value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            yield from _targets(node.target, node.value)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            yield from _targets(node.target, node.iter)
        elif isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                if item.optional_vars is not None:
                    yield from _targets(item.optional_vars, item.context_expr)
        elif isinstance(node, ast.NamedExpr):
            yield from _targets(node.target, node.value)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name, None
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                yield (alias.asname or alias.name).split(".")[0], None
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                yield name, _OUTSIDE
        stack.extend(ast.iter_child_nodes(node))


def _targets(target: ast.AST, value: ast.AST) -> Iterator[tuple[str, ast.AST]]:
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _targets(element, value)
    elif isinstance(target, ast.Starred):
        yield from _targets(target.value, value)
