"""The allow-lists for code that runs where the sandbox's runtime guards cannot look: a
kernel body of a language written as Python functions (Triton's CPU interpreter runs a
``@triton.jit`` body as Python, inside the launch) and the callbacks run during a launch
(grid functions, heuristics: every lambda, and every candidate function passed around as a
value).

Callbacks get launch arithmetic only (rule ``callback``), judged here; kernel bodies get
their language only (rule ``kernel_body``), judged by the language
(:class:`~kernelflow.verification.backends.language.KernelLanguage`). Each check returns
the problem in words, or None; the attribute chains of imported modules are judged by
:mod:`.chains`.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from kernelflow.verification.backends.language import KernelLanguage, Problem
from kernelflow.verification.gate.chains import shown
from kernelflow.verification.gate.rules import LAUNCH_ATTRS, LAUNCH_BUILTINS
from kernelflow.verification.gate.scopes import Scope

__all__ = [
    "EXPRESSIONS",
    "STATEMENTS",
    "STRICT_RULES",
    "attribute_problem",
    "call_problem",
    "name_problem",
    "node_problem",
]

STRICT_RULES = {"jit": "kernel_body", "launch": "callback"}

EXPRESSIONS = (
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
STATEMENTS = (
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
# A callback computes launch sizes: expressions, comprehensions over sizes, a few statements.
_LAUNCH_NODES = (
    *EXPRESSIONS,
    *STATEMENTS,
    ast.Lambda,
    ast.GeneratorExp,
    ast.ListComp,
    ast.comprehension,
)


def node_problem(
    node: ast.AST, scope: Scope, passing: frozenset[str], kernel: KernelLanguage | None
) -> str | Problem | None:
    """Whether ``node``'s kind may appear in a kernel body of ``kernel`` (the language of
    the body: None in a callback) or a callback at all (``passing``: the module's kernels
    that may return a host value they are given)."""
    if kernel is not None and scope.where == "jit":
        return kernel.node_problem(node, scope, passing)
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return Problem(
            f"`{type(node).__name__}` {_place(scope, kernel)}",
            f"define `{node.name}` at module level or as a method; a launch callback "
            "computes sizes only",
        )
    if not isinstance(node, _LAUNCH_NODES):
        return f"`{type(node).__name__}` {_place(scope, kernel)}"
    if isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
        return (
            f"writing an attribute or item {_place(scope, kernel)}: only local names may be bound"
        )
    return None


def name_problem(
    name: str,
    scope: Scope,
    kernel_globals: set[str],
    candidate: set[str],
    kernel: KernelLanguage | None,
) -> str | Problem | None:
    """A name (not an import) read in a kernel body (``kernel_globals``: the module's
    kernels and constants) or in a callback (``candidate``: the module's own functions and
    classes)."""
    if kernel is not None and scope.where == "jit":
        return kernel.name_problem(name, scope, kernel_globals)
    if name in candidate and name not in scope.bound:
        return f"`{shown(name)}` (candidate code) {_place(scope, kernel)}"
    return None


def attribute_problem(
    node: ast.Attribute, scope: Scope, kernel: KernelLanguage | None, *, called: bool
) -> str | Problem | None:
    """An attribute of a value (not of a module) read in a kernel body or a callback;
    ``called``: it is called there (a method). A callback may read any attribute (the
    meta's block sizes, ``self.out_channels``: no code of the candidate runs on a read, as
    it may define no properties or dunders) but call only the size methods of
    LAUNCH_ATTRS."""
    if kernel is not None and scope.where == "jit":
        return kernel.attribute_problem(node, scope)
    if node.attr in LAUNCH_ATTRS or not called:
        return None
    return f"`.{shown(node.attr)}` {_place(scope, kernel)}"


def call_problem(
    node: ast.Call,
    scope: Scope,
    kernels: set[str],
    module_path: str | None,
    kernel: KernelLanguage | None,
    languages: Sequence[KernelLanguage],
) -> str | Problem | None:
    """A call in a kernel body (of ``kernel``) or a callback; ``module_path`` is the
    callee's resolved path when it is an attribute of an imported module (judged by
    chains); ``languages``: the module's kernel languages, whose functions that run a
    function they are given are judged wherever they are called."""
    func = node.func
    if module_path is not None:
        name = module_path.rsplit(".", 1)[-1]
        return _function_argument_problem(node, name, 0, scope, kernels, kernel, languages)
    if isinstance(func, ast.Name):
        in_kernel = kernel is not None and scope.where == "jit"
        if (
            in_kernel
            and kernel is not None
            and (kernel.builtin_call(func.id) or func.id in kernels)
        ):
            return None
        if scope.where == "launch" and func.id in LAUNCH_BUILTINS and func.id not in scope.bound:
            return None
        return f"calling `{shown(func.id)}` {_place(scope, kernel)}"
    if isinstance(func, ast.Attribute):
        if attribute_problem(func, scope, kernel, called=True) is not None:
            return None  # reported as an attribute
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id in scope.constexprs & scope.host:
            return (
                f"calling a method of `{shown(owner.id)}`, a tl.constexpr argument, "
                f"{_place(scope, kernel)}: its value comes from the host"
            )
        return _function_argument_problem(node, func.attr, 1, scope, kernels, kernel, languages)
    return f"calling a computed callee {_place(scope, kernel)}"


def _function_argument_problem(
    node: ast.Call,
    name: str,
    receiver: int,
    scope: Scope,
    kernels: set[str],
    kernel: KernelLanguage | None,
    languages: Sequence[KernelLanguage],
) -> str | None:
    """A call that runs the function it is given (tl.reduce ...): each language judges
    its own (``receiver``: 1 for the method form, whose first argument is the receiver)."""
    for language in languages:
        problem = language.function_argument(node, name, receiver, kernels)
        if problem is not None:
            return f"{problem} {_place(scope, kernel)}"
    return None


def _place(scope: Scope, kernel: KernelLanguage | None) -> str:
    if kernel is not None and scope.where == "jit":
        return kernel.kernel_place
    return (
        "in code Triton runs during a launch (a lambda, grid function, heuristic or hook): "
        "such code may only compute launch sizes (arithmetic, triton.cdiv, tensor sizes and "
        "strides, the meta dict)"
    )
