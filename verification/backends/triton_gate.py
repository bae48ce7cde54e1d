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
    Problem,
    Refusal,
)
from kernelflow.verification.backends.triton_host import HostValues, host_names
from kernelflow.verification.backends.triton_names import exists, suggest, triton_version
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
                return Refusal(
                    "kernel_body",
                    f"`{shown(path)}` in a @triton.jit kernel: a kernel body runs the "
                    "language only (triton.jit, autotune and Config belong to the host)",
                    "decorate the kernel at module level; in its body use tl.* "
                    "(tl.cdiv, tl.arange ...)",
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
                        Finding(
                            "callback",
                            keyword.value,
                            f"`{keyword.arg}=`: a hook Triton runs around launches, out of "
                            "the runtime guard's sight",
                            f"leave `{keyword.arg}=` out: prepare buffers in forward before "
                            "the launch (torch.zeros for an accumulator), and prune configs "
                            "by hand in the list given to @triton.autotune",
                        )
                    )
        given_precision = {k.arg for k in node.keywords} & set(FULL_PRECISION_DOT)
        if path == "triton.language.dot" and full_precision and not given_precision:
            written = ast.unparse(node)
            fixed = ast.Call(
                node.func,
                node.args,
                [*node.keywords, ast.keyword("input_precision", ast.Constant("ieee"))],
            )
            found.append(
                Finding(
                    "precision_downgrade",
                    node,
                    "`tl.dot` without input_precision multiplies fp32 in tf32 on NVIDIA GPUs "
                    "(Triton's default), 10 mantissa bits instead of fp32's 23",
                    f"replace `{shown(written)}` with `{shown(ast.unparse(fixed))}`",
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

    def counterpart(self, path: str) -> str | None:
        """``tl.exp`` for ``torch.exp``, ``math.exp``: the language's function of the same
        name where the gate accepts it and the installed Triton has it; else what
        :func:`.triton_names.suggest` finds (an idiom with ``{x}``, a libdevice function)."""
        leaf = path.rsplit(".", 1)[-1]
        if not leaf.isidentifier():
            return None
        own = f"{_TL}.{leaf}"
        if _accepted(own) and exists(own):
            return own
        if exists(own) is None:
            return None
        found = suggest(own, _accepted)
        return found.replacement or found.idiom or None

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
    ) -> str | Problem | None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            what = "a lambda" if isinstance(node, ast.Lambda) else f"`def {node.name}`"
            return Problem(
                f"{what} {self.kernel_place}: the Triton language has no nested functions",
                "define it at module level as its own @triton.jit function and call it from "
                "the kernel (tl.reduce and tl.associative_scan take such a function too)",
            )
        if not isinstance(node, _KERNEL_NODES):
            return f"`{type(node).__name__}` {self.kernel_place}"
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            where = ast.unparse(node.value)
            offsets = ast.unparse(node.slice)
            return Problem(
                f"writing an item {self.kernel_place}: a kernel writes memory only through "
                "pointers, with tl.store (its tensors are values, not buffers)",
                f"replace `{shown(ast.unparse(node))} = ...` with "
                f"`tl.store({shown(where)} + {shown(offsets)}, ...)` (a pointer plus offsets; "
                "for a block of offsets add `mask=offsets < n`)",
            )
        if isinstance(node, ast.Attribute | ast.Subscript) and not isinstance(node.ctx, ast.Load):
            return Problem(
                f"writing an attribute {self.kernel_place}: only local names may be bound",
                "bind a local name, and store results with tl.store(pointer + offsets, value)",
            )
        if isinstance(node, ast.Subscript):
            values = HostValues(scope.host, scope.makers, passing)
            # An element of a tuple argument (`strides[0]`: tuples of numbers and pointers,
            # Triton 3); any other index into what the host handed in is refused.
            element = isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)
            if values.holds(node.value) and not element:
                what = shown(ast.unparse(node.value))
                offsets = shown(ast.unparse(node.slice))
                return Problem(
                    f"indexing `{what}` {self.kernel_place}: {_ARGUMENTS}",
                    f"replace `{shown(ast.unparse(node))}` with `tl.load({what} + {offsets})` "
                    "(a pointer plus offsets; for a block of offsets add `mask=offsets < n`)",
                )
        return None

    def name_problem(
        self, name: str, scope: KernelScope, kernel_globals: set[str]
    ) -> str | Problem | None:
        if name in scope.bound or name in kernel_globals or name in JIT_BUILTINS:
            return None
        return Problem(
            f"`{shown(name)}` {self.kernel_place}: a kernel reads its arguments, its locals, "
            "Triton-language names, other @triton.jit functions and module constants",
            f"pass `{shown(name)}` to the kernel as an argument (a pointer, a number or a "
            "tl.constexpr), or make it a module-level constant or @triton.jit function",
        )

    def attribute_problem(self, node: ast.Attribute, scope: KernelScope) -> str | Problem | None:
        argument = _argument_path(node)
        if argument is not None and argument[0] in scope.host:
            name, (first, *rest) = argument
            dtype = all(a in KERNEL_DTYPE_ATTRS or a.startswith("is_") for a in rest)
            if first not in KERNEL_ARGUMENT_ATTRS or not dtype:
                read = shown(".".join([name, first, *rest]))
                return Problem(
                    f"`{read}` {self.kernel_place}: {_ARGUMENTS}",
                    f"use `{name}` as a pointer: tl.load({name} + offsets, mask=...) and "
                    f"tl.store({name} + offsets, value, mask=...); pass what else the kernel "
                    "needs as arguments (numbers, tl.constexpr)",
                )
        if node.attr in TL_VALUE_API or node.attr.startswith("is_"):
            return None
        own = f"{_TL}.{node.attr}"
        if _accepted(own) and exists(own):
            return Problem(
                f"`.{shown(node.attr)}` {self.kernel_place}: the language's values have no "
                "such method",
                f"call the function: `tl.{node.attr}(value, ...)`",
            )
        return f"`.{shown(node.attr)}` {self.kernel_place}"

    def builtin_call(self, name: str) -> bool:
        return name in JIT_BUILTINS


def _accepted(path: str) -> bool:
    """Whether the gate accepts ``path`` (under triton.language) as the language."""
    rest = path.split(".")[2:]
    return bool(rest) and (
        (len(rest) == 1 and rest[0] in TL_NAMES)
        or (rest[0] == "math" and len(rest) == 2 and rest[1] in TL_MATH)
        or (tuple(rest[:-1]) in TL_LIBDEVICE and is_public(rest[-1]) and rest[-1] != "core")
    )


def _judge_tl(path: str, rest: list[str], where: str) -> Refusal | None:
    if not rest or tuple(rest) in TL_NAMESPACES:
        return None
    if not _accepted(path):
        if exists(path) is False:
            return _missing(path)
        return Refusal(
            "module_escape",
            f"`{shown(path)}` is not part of the Triton language a candidate may use (tl.*, "
            "tl.math.*, libdevice functions): Triton's modules (core, semantic, runtime ...) "
            "reach Python internals",
            "call the language's functions directly (tl.load, tl.exp, "
            "tl.extra.cuda.libdevice.<function> ...)",
        )
    if where == "launch":
        host = f"triton.{rest[-1]}"
        if len(rest) == 1 and rest[0] in TRITON_ARITHMETIC and exists(host):
            return Refusal(
                "callback",
                f"`{shown(path)}` in code run on the host during a launch (a grid lambda, "
                f"heuristic or hook): tl.{rest[0]} is a device function, for @triton.jit "
                "bodies only",
                replacement=host,
            )
        return refused(path, where)
    return None


def _missing(path: str) -> Refusal:
    """The refusal of a name under triton.language the installed Triton does not have."""
    name = "tl" + path[len(_TL) :]
    found = suggest(path, _accepted)
    words = f"on a GPU {found.words}" if found.idiom and found.words else found.words
    return Refusal(
        "module_escape",
        f"`{shown(name)}` does not exist in the installed Triton {triton_version()}",
        words,
        found.idiom or found.replacement,
        missing=True,
    )


def _argument_path(node: ast.Attribute) -> tuple[str, list[str]] | None:
    """(name, attributes) of ``name.a.b``; None when the chain does not start at a name."""
    attrs: list[str] = []
    value: ast.expr = node
    while isinstance(value, ast.Attribute):
        attrs.insert(0, value.attr)
        value = value.value
    return (value.id, attrs) if isinstance(value, ast.Name) else None


TRITON_LANGUAGE = TritonLanguage()
