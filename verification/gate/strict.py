"""The allow-lists for code that runs where the sandbox's runtime guards cannot look: a
``@triton.jit`` body (the CPU interpreter runs it as Python, inside the launch) and the
callbacks Triton runs during a launch (grid functions, heuristics: every lambda, and every
candidate function passed around as a value).

Kernel bodies get the Triton language only (rule ``kernel_body``); callbacks get launch
arithmetic only (rule ``callback``). Each check returns the problem in words, or None; the
attribute chains of imported modules are judged by :mod:`.chains`.
"""

from __future__ import annotations

import ast

from kernelflow.verification.gate.chains import shown
from kernelflow.verification.gate.host import HostValues
from kernelflow.verification.gate.rules import (
    JIT_BUILTINS,
    KERNEL_ARGUMENT_ATTRS,
    KERNEL_DTYPE_ATTRS,
    LAUNCH_ATTRS,
    LAUNCH_BUILTINS,
    TL_FUNCTION_ARGS,
    TL_VALUE_API,
)
from kernelflow.verification.gate.scopes import Scope

__all__ = [
    "STRICT_RULES",
    "attribute_problem",
    "call_problem",
    "name_problem",
    "node_problem",
]

STRICT_RULES = {"jit": "kernel_body", "launch": "callback"}
# Why a kernel may not look into its arguments.
_ARGUMENTS = (
    "a kernel's arguments are pointers, scalars and constexprs (read only their .dtype); "
    "anything else handed in is Python the interpreter would run"
)

_EXPRESSIONS = (
    ast.Constant,
    ast.Name,
    ast.Attribute,
    ast.Call,
    ast.keyword,
    ast.BinOp,
    ast.UnaryOp,
    ast.BoolOp,
    ast.Compare,
    ast.IfExp,
    ast.Subscript,
    ast.Slice,
    ast.Tuple,
    ast.List,
    ast.Starred,
    ast.expr_context,
    ast.operator,
    ast.unaryop,
    ast.boolop,
    ast.cmpop,
)
_STATEMENTS = (
    ast.Assign,
    ast.AugAssign,
    ast.AnnAssign,
    ast.Expr,
    ast.If,
    ast.For,
    ast.While,
    ast.Return,
    ast.Pass,
    ast.Break,
    ast.Continue,
)
# What the Triton language has (assert becomes a device assert; f-strings for static_print).
_KERNEL_NODES = (*_EXPRESSIONS, *_STATEMENTS, ast.Assert, ast.JoinedStr, ast.FormattedValue)
# A callback computes launch sizes: expressions, comprehensions over sizes, a few statements.
_LAUNCH_NODES = (
    *_EXPRESSIONS,
    *_STATEMENTS,
    ast.Lambda,
    ast.GeneratorExp,
    ast.ListComp,
    ast.comprehension,
)


def node_problem(node: ast.AST, scope: Scope, passing: frozenset[str]) -> str | None:
    """Whether ``node``'s kind may appear in a kernel body or a callback at all
    (``passing``: the module's kernels that may return a host value they are given)."""
    allowed = _KERNEL_NODES if scope.where == "jit" else _LAUNCH_NODES
    if not isinstance(node, allowed):
        return f"`{type(node).__name__}` {_place(scope)}"
    if isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
        return f"writing an attribute or item {_place(scope)}: only local names may be bound"
    if scope.where == "jit" and isinstance(node, ast.Subscript):
        values = HostValues(scope.host, scope.makers, passing)
        # An element of a tuple argument (`strides[0]`: tuples of numbers and pointers,
        # Triton 3); any other index into what the host handed in is refused.
        element = isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)
        if values.holds(node.value) and not element:
            what = shown(ast.unparse(node.value))
            return f"indexing `{what}` {_place(scope)}: {_ARGUMENTS}"
    return None


def name_problem(
    name: str, scope: Scope, kernel_globals: set[str], candidate: set[str]
) -> str | None:
    """A name (not an import) read in a kernel body (``kernel_globals``: the module's
    kernels and constants) or in a callback (``candidate``: the module's own functions and
    classes)."""
    if scope.where == "jit":
        if name in scope.bound or name in kernel_globals or name in JIT_BUILTINS:
            return None
        return (
            f"`{shown(name)}` {_place(scope)}: a kernel reads its arguments, its locals, "
            "Triton-language names, other @triton.jit functions and module constants"
        )
    if name in candidate and name not in scope.bound:
        return f"`{shown(name)}` (candidate code) {_place(scope)}"
    return None


def attribute_problem(node: ast.Attribute, scope: Scope, *, called: bool) -> str | None:
    """An attribute of a value (not of a module) read in a kernel body or a callback;
    ``called``: it is called there (a method). A callback may read any attribute (the
    meta's block sizes, ``self.out_channels``: no code of the candidate runs on a read, as
    it may define no properties or dunders) but call only the size methods of
    LAUNCH_ATTRS."""
    if scope.where == "jit":
        argument = _argument_path(node)
        if argument is not None and argument[0] in scope.host:
            name, (first, *rest) = argument
            dtype = all(a in KERNEL_DTYPE_ATTRS or a.startswith("is_") for a in rest)
            if first not in KERNEL_ARGUMENT_ATTRS or not dtype:
                read = shown(".".join([name, first, *rest]))
                return f"`{read}` {_place(scope)}: {_ARGUMENTS}"
        if node.attr in TL_VALUE_API or node.attr.startswith("is_"):
            return None
    elif node.attr in LAUNCH_ATTRS or not called:
        return None
    return f"`.{shown(node.attr)}` {_place(scope)}"


def call_problem(
    node: ast.Call, scope: Scope, kernels: set[str], module_path: str | None
) -> str | None:
    """A call in a kernel body or a callback; ``module_path`` is the callee's resolved path
    when it is an attribute of an imported module (judged by chains)."""
    func = node.func
    if module_path is not None:
        name = module_path.rsplit(".", 1)[-1]
        return _function_argument_problem(node, name, 0, scope, kernels)
    if isinstance(func, ast.Name):
        if scope.where == "jit" and (func.id in JIT_BUILTINS or func.id in kernels):
            return None
        if scope.where == "launch" and func.id in LAUNCH_BUILTINS and func.id not in scope.bound:
            return None
        return f"calling `{shown(func.id)}` {_place(scope)}"
    if isinstance(func, ast.Attribute):
        if attribute_problem(func, scope, called=True) is not None:
            return None  # reported as an attribute
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id in scope.constexprs & scope.host:
            return (
                f"calling a method of `{shown(owner.id)}`, a tl.constexpr argument, "
                f"{_place(scope)}: its value comes from the host"
            )
        return _function_argument_problem(node, func.attr, 1, scope, kernels)
    return f"calling a computed callee {_place(scope)}"


def _function_argument_problem(
    node: ast.Call, name: str, receiver: int, scope: Scope, kernels: set[str]
) -> str | None:
    """tl.reduce / associative_scan / map_elementwise run the function they are given: it
    must be one of the module's @triton.jit functions (``receiver``: 1 for the method form,
    whose first argument is the receiver)."""
    if name not in TL_FUNCTION_ARGS:
        return None
    position, keyword = TL_FUNCTION_ARGS[name]
    given = [k.value for k in node.keywords if k.arg == keyword]
    if 0 <= position - receiver < len(node.args):
        given.append(node.args[position - receiver])
    for value in given:
        if not (isinstance(value, ast.Name) and value.id in kernels):
            return f"`{name}` must be given a @triton.jit function of the module {_place(scope)}"
    return None


def _argument_path(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """(name, attributes) of ``name.a.b``; None when the chain does not start at a name."""
    attrs: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        attrs.insert(0, value.attr)
        value = value.value
    return (value.id, attrs) if isinstance(value, ast.Name) else None


def _place(scope: Scope) -> str:
    if scope.where == "jit":
        return "in a @triton.jit kernel (only the Triton language: tl.*, arithmetic, loops)"
    return (
        "in code Triton runs during a launch (a lambda, grid function, heuristic or hook): "
        "such code may only compute launch sizes (arithmetic, triton.cdiv, tensor sizes and "
        "strides, the meta dict)"
    )
