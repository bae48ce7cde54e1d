"""Triton for the static gate: the :class:`KernelLanguage` the gate's walker asks about
``@triton.jit`` kernels, their bodies, the chains of ``triton`` and ``triton.language`` a
candidate may use, the hooks Triton runs around launches and its precision traps
(docs/verifier.md, "The static gate"). Its tables are :mod:`.triton_rules`; which values in
a kernel are the host's, :mod:`.triton_host`.

Daemon side only (the ``triton`` backend, :mod:`.triton`, imports it when the gate asks).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from kernelflow.verification.backends.language import (
    AnyFunction,
    Finding,
    KernelLanguage,
    KernelScope,
    Refusal,
)
from kernelflow.verification.backends.triton_host import HostValues, host_names
from kernelflow.verification.backends.triton_rules import (
    CALLBACK_KEYWORDS,
    JIT_BUILTINS,
    KERNEL_ARGUMENT_ATTRS,
    KERNEL_DTYPE_ATTRS,
    TL_FUNCTION_ARGS,
    TL_LIBDEVICE,
    TL_MATH,
    TL_NAMES,
    TL_NAMESPACES,
    TL_VALUE_API,
    TRITON_ARITHMETIC,
    TRITON_DECORATORS,
    TRITON_TOP,
)
from kernelflow.verification.gate.chains import escape, is_public, refused, shown
from kernelflow.verification.gate.rules import FULL_PRECISION_DOT
from kernelflow.verification.gate.strict import EXPRESSIONS, STATEMENTS

__all__ = ["TRITON_LANGUAGE", "TritonLanguage"]

_TL = "triton.language"
# What the Triton language has (assert becomes a device assert; f-strings for static_print).
_KERNEL_NODES = (*EXPRESSIONS, *STATEMENTS, ast.Assert, ast.JoinedStr, ast.FormattedValue)
# Why a kernel may not look into its arguments.
_ARGUMENTS = (
    "a kernel's arguments are pointers, scalars and constexprs (read only their .dtype); "
    "anything else handed in is Python the interpreter would run"
)


class TritonLanguage(KernelLanguage):
    roots = ("triton",)
    namespaces = frozenset({"triton", _TL, *(".".join((_TL, *parts)) for parts in TL_NAMESPACES)})
    kernel_title = "@triton.jit kernel"
    kernel_place = "in a @triton.jit kernel (only the Triton language: tl.*, arithmetic, loops)"
    language_words = "the Triton language (tl.*)"
    dtype_constructors = frozenset({"triton.language.dtype"})

    def is_kernel_decorator(self, path: str) -> bool:
        """``@triton.jit``, ``@triton.autotune(...)``, ``@triton.heuristics(...)``, under
        any alias."""
        return path.endswith(("jit", "autotune", "heuristics"))

    def decorator_only(self, path: str) -> bool:
        return path.startswith("triton.") and path[7:] in TRITON_DECORATORS

    def is_constant_wrapper(self, name: str) -> bool:
        return name.endswith("constexpr")

    def judge_chain(self, path: str, where: str) -> Refusal | None:
        parts = path.split(".")
        if len(parts) == 1:
            return None
        if parts[1] == "language":
            return _judge_tl(path, parts[2:], where)
        if len(parts) == 2 and parts[1] in TRITON_TOP:
            arithmetic = parts[1] in TRITON_ARITHMETIC
            if where == "jit" and not arithmetic:
                return (
                    "kernel_body",
                    f"`{shown(path)}` in a @triton.jit kernel: use the language (tl.cdiv ...)",
                )
            if where == "launch" and not arithmetic:
                return refused(path, where)
            return None
        return escape(path)

    def call_findings(
        self, node: ast.Call, path: str | None, full_precision: bool
    ) -> list[Finding]:
        """Hooks Triton runs around launches (``pre_hook=`` ...); ``tl.dot`` in tf32."""
        found: list[Finding] = []
        if path is not None and path.startswith("triton."):
            for keyword in node.keywords:
                if keyword.arg in CALLBACK_KEYWORDS:
                    found.append(
                        (
                            "callback",
                            keyword.value,
                            f"`{keyword.arg}=`: a hook Triton runs around launches, out of "
                            "the runtime guard's sight",
                        )
                    )
        given_precision = {k.arg for k in node.keywords} & set(FULL_PRECISION_DOT)
        if path == "triton.language.dot" and full_precision and not given_precision:
            found.append(
                (
                    "precision_downgrade",
                    node,
                    "`tl.dot` without input_precision multiplies fp32 in tf32 on NVIDIA GPUs "
                    '(Triton\'s default): pass input_precision="ieee"',
                )
            )
        return found

    def function_argument(
        self, node: ast.Call, name: str, receiver: int, kernels: set[str]
    ) -> str | None:
        """tl.reduce / associative_scan / map_elementwise run the function they are given:
        it must be one of the module's @triton.jit functions."""
        if name not in TL_FUNCTION_ARGS:
            return None
        position, keyword = TL_FUNCTION_ARGS[name]
        given = [k.value for k in node.keywords if k.arg == keyword]
        if 0 <= position - receiver < len(node.args):
            given.append(node.args[position - receiver])
        for value in given:
            if not (isinstance(value, ast.Name) and value.id in kernels):
                return f"`{name}` must be given a @triton.jit function of the module"
        return None

    def host_names(
        self,
        kernels: Mapping[str, list[AnyFunction]],
        launched: set[str],
        language: frozenset[str],
    ) -> tuple[dict[int, frozenset[str]], frozenset[str]]:
        return host_names(kernels, launched, language)

    # ------------------------------------------------------------ kernel bodies

    def node_problem(
        self, node: ast.AST, scope: KernelScope, passing: frozenset[str]
    ) -> str | None:
        if not isinstance(node, _KERNEL_NODES):
            return f"`{type(node).__name__}` {self.kernel_place}"
        if isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
            return (
                f"writing an attribute or item {self.kernel_place}: only local names may be bound"
            )
        if isinstance(node, ast.Subscript):
            values = HostValues(scope.host, scope.makers, passing)
            # An element of a tuple argument (`strides[0]`: tuples of numbers and pointers,
            # Triton 3); any other index into what the host handed in is refused.
            element = isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)
            if values.holds(node.value) and not element:
                what = shown(ast.unparse(node.value))
                return f"indexing `{what}` {self.kernel_place}: {_ARGUMENTS}"
        return None

    def name_problem(self, name: str, scope: KernelScope, kernel_globals: set[str]) -> str | None:
        if name in scope.bound or name in kernel_globals or name in JIT_BUILTINS:
            return None
        return (
            f"`{shown(name)}` {self.kernel_place}: a kernel reads its arguments, its locals, "
            "Triton-language names, other @triton.jit functions and module constants"
        )

    def attribute_problem(self, node: ast.Attribute, scope: KernelScope) -> str | None:
        argument = _argument_path(node)
        if argument is not None and argument[0] in scope.host:
            name, (first, *rest) = argument
            dtype = all(a in KERNEL_DTYPE_ATTRS or a.startswith("is_") for a in rest)
            if first not in KERNEL_ARGUMENT_ATTRS or not dtype:
                read = shown(".".join([name, first, *rest]))
                return f"`{read}` {self.kernel_place}: {_ARGUMENTS}"
        if node.attr in TL_VALUE_API or node.attr.startswith("is_"):
            return None
        return f"`.{shown(node.attr)}` {self.kernel_place}"

    def builtin_call(self, name: str) -> bool:
        return name in JIT_BUILTINS


def _judge_tl(path: str, rest: list[str], where: str) -> Refusal | None:
    if not rest or tuple(rest) in TL_NAMESPACES:
        return None
    language = (
        (len(rest) == 1 and rest[0] in TL_NAMES)
        or (rest[0] == "math" and len(rest) == 2 and rest[1] in TL_MATH)
        or (tuple(rest[:-1]) in TL_LIBDEVICE and is_public(rest[-1]) and rest[-1] != "core")
    )
    if not language:
        return (
            "module_escape",
            f"`{shown(path)}` is not part of the Triton language a candidate may use (tl.*, "
            "tl.math.*, libdevice functions); its modules reach Python internals",
        )
    return refused(path, where) if where == "launch" else None


def _argument_path(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """(name, attributes) of ``name.a.b``; None when the chain does not start at a name."""
    attrs: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        attrs.insert(0, value.attr)
        value = value.value
    return (value.id, attrs) if isinstance(value, ast.Name) else None


TRITON_LANGUAGE = TritonLanguage()
