"""Which attribute chains of the allowed modules a candidate may use, and where.

A chain is judged by its resolved dotted path (``torch.nn.functional.relu``, whatever the
import aliases) and by where the code runs: ``forward`` (forward, helpers, module level,
class bodies), ``init`` (``__init__``), ``launch`` (callbacks Triton runs during a launch:
grid functions, heuristics) or ``jit`` (``@triton.jit`` bodies). Allow-lists: a chain that
is not on them is refused, so a module reached through an allowed one (``torch.os``,
``torch.importlib``, ``triton.runtime``, ``tl.core``) is refused without being named.
"""

from __future__ import annotations

import sys
from typing import Literal

from kernelflow.verification.gate.rules import (
    ALLOWED_DUNDERS,
    ALLOWED_IMPORTS,
    AUTOGRAD_FUNCTION,
    BANNED_ATTRS,
    FILE_CALLS,
    NN_ANYWHERE,
    NN_INIT_HELPERS,
    NN_NAMESPACES,
    NN_TUPLE_HELPERS,
    TENSOR_SUBCLASS_MAKERS,
    TL_LIBDEVICE,
    TL_MATH,
    TL_NAMES,
    TL_NAMESPACES,
    TORCH_COMPUTE_NAMESPACES,
    TORCH_CUDA_GLUE,
    TORCH_DTYPES,
    TORCH_GLUE,
    TORCH_INIT,
    TRITON_ARITHMETIC,
    TRITON_TOP,
    TYPING_LOWERCASE,
)

__all__ = [
    "Context",
    "Verdict",
    "is_namespace",
    "judge_chain",
    "judge_import",
    "refused_dunder",
    "reported_by_attribute_rules",
    "shown",
]

Context = Literal["forward", "init", "launch", "jit"]
Verdict = tuple[str, str]  # (rule, message)

# Modules that are plain libraries: any public name directly under them (typing: see
# _typing_name).
_PLAIN_MODULES = ("math", "typing", "__future__", "collections.abc")
_TL = "triton.language"
_NAMESPACES = {
    "torch",
    "torch.nn",
    "torch.cuda",
    "triton",
    _TL,
    "collections",
    *_PLAIN_MODULES,
    *(f"torch.nn.{name}" for name in NN_NAMESPACES),
    *(".".join((_TL, *parts)) for parts in TL_NAMESPACES),
}
_MAX_SHOWN = 80


def shown(text: str) -> str:
    """``text`` cut to a length fit for a message."""
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def is_namespace(path: str, extra_roots: tuple[str, ...] = ()) -> bool:
    """Whether ``path`` names a module (one a candidate may use through its attributes
    only: as a value it reaches everything the module holds)."""
    return path in _NAMESPACES or path in extra_roots


def judge_import(
    path: str, extra_roots: tuple[str, ...], glue: tuple[str, ...] = ()
) -> Verdict | None:
    """Why importing ``path`` (``torch.nn``, ``torch.empty`` from ``from torch import
    empty``) is refused; None when it may be imported (``glue``: the backend's paths the
    gate otherwise refuses, and the modules holding them)."""
    if path in glue or any(g.startswith(path + ".") for g in glue) or path in NN_TUPLE_HELPERS:
        return None
    roots = (*ALLOWED_IMPORTS, *extra_roots)
    if not any(path == root or path.startswith(root + ".") for root in roots):
        return (
            "forbidden_import",
            f"import of {shown(path)!r} is not allowed (allowed: "
            + ", ".join(["torch", "triton", "math", "typing", *extra_roots])
            + "): no threads, processes, files, sockets, timers or introspection",
        )
    hidden = [part for part in path.split(".")[1:] if reported_by_attribute_rules(part)]
    if hidden and path != AUTOGRAD_FUNCTION:
        return ("introspection", f"importing `{shown(hidden[0])}` is not allowed")
    if is_namespace(path, extra_roots) or judge_chain(path, "init", extra_roots) is None:
        return None
    return judge_chain(path, "forward", extra_roots)


def judge_chain(path: str, where: Context, extra_roots: tuple[str, ...] = ()) -> Verdict | None:
    """Why the chain ``path`` may not be used ``where``; None when it may."""
    parts = path.split(".")
    if path in NN_TUPLE_HELPERS:
        return None if where in ("forward", "init") else _refused(path, where)
    if any(reported_by_attribute_rules(part) for part in parts[1:]):
        return None
    if path.startswith(FILE_CALLS):
        return (
            "file_io",
            f"`{shown(path)}` reads or writes files: candidates must not touch the file "
            "system (no saved or precomputed results)",
        )
    if parts[0] == "torch":
        return _judge_torch(path, parts, where)
    if parts[0] == "triton":
        return _judge_triton(path, parts, where)
    for module in _PLAIN_MODULES:
        depth = module.count(".") + 1
        if parts[:depth] == module.split("."):
            leaf = parts[-1] if len(parts) == depth + 1 else ""
            if len(parts) <= depth or (_public(leaf) and (module != "typing" or _typing(leaf))):
                return None
            return _escape(path)
    if parts[0] in extra_roots:
        # A backend's library: its hook judges the calls; modules reached through it are
        # refused here.
        if any(not _public(part) or part in sys.stdlib_module_names for part in parts[1:]):
            return _escape(path)
        return None
    return _escape(path)


def _judge_torch(path: str, parts: list[str], where: Context) -> Verdict | None:
    name = parts[1] if len(parts) > 1 else ""
    if not name:
        return None
    if name == "nn":
        return _judge_nn(path, parts[2:], where)
    if name == "cuda":
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in TORCH_CUDA_GLUE):
            return _refused(path, where) if where in ("launch", "jit") else None
        return (
            "stream_trick",
            f"`{shown(path)}`: no streams, events or graphs; launch on the current stream "
            "(of torch.cuda only " + ", ".join(sorted(TORCH_CUDA_GLUE)) + ")",
        )
    if len(parts) == 2 and name in TORCH_GLUE:
        if where == "jit" or (where == "launch" and name not in TORCH_DTYPES):
            return _refused(path, where)
        return None
    if len(parts) == 2 and name in TORCH_INIT and where == "init":
        return None
    compute = len(parts) == 2 or name in TORCH_COMPUTE_NAMESPACES
    return _refused(path, where, compute=compute and _function_like(name))


def _judge_nn(path: str, rest: list[str], where: Context) -> Verdict | None:
    if not rest:
        return None
    head = rest[0]
    if head in NN_NAMESPACES and len(rest) <= 2:
        initialiser = head == "init" and (rest[-1].endswith("_") or rest[-1] in NN_INIT_HELPERS)
        # Code that runs only while the module is built (or never: an autograd function's
        # backward under the verifier's no_grad) sees no input: computing there prepares.
        preparing = head != "init" and _function_like(rest[-1])
        if len(rest) == 1 or (where == "init" and (initialiser or preparing)):
            return None
        functional = head == "functional" and _function_like(rest[-1])
        if where == "forward" and (functional or initialiser):
            return (
                "torch_compute",
                f"`{shown(path)}` is PyTorch compute standing in for the kernel"
                if head == "functional"
                else f"`{shown(path)}` outside __init__: initialise parameters in __init__",
            )
        return _refused(path, where)
    if head[:1].isupper() and rest[1:] in ([], ["__init__"]):
        if where in ("forward", "init"):
            return None
        return _refused(path, where, compute=head not in NN_ANYWHERE)
    return _refused(path, where)


def _judge_triton(path: str, parts: list[str], where: Context) -> Verdict | None:
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
            return _refused(path, where)
        return None
    return _escape(path)


def _judge_tl(path: str, rest: list[str], where: Context) -> Verdict | None:
    if not rest or tuple(rest) in TL_NAMESPACES:
        return None
    language = (
        (len(rest) == 1 and rest[0] in TL_NAMES)
        or (rest[0] == "math" and len(rest) == 2 and rest[1] in TL_MATH)
        or (tuple(rest[:-1]) in TL_LIBDEVICE and _public(rest[-1]) and rest[-1] != "core")
    )
    if not language:
        return (
            "module_escape",
            f"`{shown(path)}` is not part of the Triton language a candidate may use (tl.*, "
            "tl.math.*, libdevice functions); its modules reach Python internals",
        )
    return _refused(path, where) if where == "launch" else None


def _refused(path: str, where: Context, *, compute: bool = False) -> Verdict:
    shown_path = shown(path)
    if where == "jit":
        return (
            "kernel_body",
            f"`{shown_path}` in a @triton.jit kernel: a kernel may use only the Triton "
            "language (tl.*), its arguments and arithmetic",
        )
    if where == "launch":
        return (
            "callback",
            f"`{shown_path}` in code Triton runs during a launch (a grid function, heuristic "
            "or hook): such code may only compute launch sizes (arithmetic, triton.cdiv, "
            "tensor sizes and strides)",
        )
    if where == "forward" and compute:
        return (
            "torch_compute",
            f"`{shown_path}` is PyTorch compute standing in for the kernel (allowed in "
            "forward: allocation, views, reshapes, .contiguous(), .to())",
        )
    if where == "init":
        return (
            "module_escape",
            f"`{shown_path}` is not among the torch names __init__ may use: tensor creation "
            "and random initialisation, torch.nn modules, nn.init and tensor functions to "
            "prepare parameters (no modules reached through torch: torch.os, torch._C ...)",
        )
    return _escape(path)


def _escape(path: str) -> Verdict:
    return (
        "module_escape",
        f"`{shown(path)}` is not among the names a candidate may use from its imports "
        "(modules reached through an allowed one, like torch.os, torch.importlib, "
        "torch._C or triton.runtime, are refused)",
    )


def _public(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_")


def _function_like(name: str) -> bool:
    """Whether a refused torch name reads as a PyTorch function (for the rule that names the
    refusal: torch_compute), not as a module it holds (module_escape)."""
    return _public(name) and name not in sys.stdlib_module_names | {"torch", "np", "numpy"}


def _typing(name: str) -> bool:
    return name[:1].isupper() or name in TYPING_LOWERCASE


def refused_dunder(name: str) -> bool:
    """A dunder name a candidate may not use (all but ALLOWED_DUNDERS)."""
    return name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS


def reported_by_attribute_rules(name: str) -> bool:
    """Parts the gate's attribute rules refuse whatever they belong to (introspection, or
    a tensor subclass made: checks.check_attribute_name)."""
    return name in BANNED_ATTRS or refused_dunder(name) or name in TENSOR_SUBCLASS_MAKERS
