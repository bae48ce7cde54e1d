"""Which attribute chains of the allowed modules a candidate may use, and where.

A chain is judged by its resolved dotted path (``torch.nn.functional.relu``, whatever the
import aliases) and by where the code runs: ``forward`` (forward, helpers, module level,
class bodies), ``init`` (``__init__``), ``launch`` (callbacks run during a launch: grid
functions, heuristics) or ``jit`` (kernel bodies). Allow-lists: a chain that is not on them
is refused, so a module reached through an allowed one (``torch.os``, ``torch.importlib``,
``triton.runtime``, ``tl.core``) is refused without being named. The chains of a kernel
language's modules (``triton``) are judged by the language
(:class:`~kernelflow.verification.backends.language.KernelLanguage`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Literal

from kernelflow.verification.backends.language import KernelLanguage, Refusal
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
    TORCH_COMPUTE_NAMESPACES,
    TORCH_CUDA_GLUE,
    TORCH_DTYPES,
    TORCH_GLUE,
    TORCH_INIT,
    TYPING_LOWERCASE,
)

__all__ = [
    "Context",
    "escape",
    "is_namespace",
    "is_public",
    "judge_chain",
    "judge_import",
    "refused",
    "refused_dunder",
    "reported_by_attribute_rules",
    "shown",
]

Context = Literal["forward", "init", "launch", "jit"]

# Modules that are plain libraries: any public name directly under them (typing: see
# _typing_name).
_PLAIN_MODULES = ("math", "typing", "__future__", "collections.abc")
_NAMESPACES = {
    "torch",
    "torch.nn",
    "torch.cuda",
    "collections",
    *_PLAIN_MODULES,
    *(f"torch.nn.{name}" for name in NN_NAMESPACES),
}
_MAX_SHOWN = 80
# What to write instead of PyTorch compute in forward.
_COMPUTE_INSTEAD = (
    "compute it in your kernel (fuse it into the kernel you launch, or launch another); "
    "forward keeps only allocation (torch.empty), views and the launches"
)


def shown(text: str) -> str:
    """``text`` cut to a length fit for a message."""
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def is_namespace(
    path: str, extra_roots: tuple[str, ...] = (), languages: Sequence[KernelLanguage] = ()
) -> bool:
    """Whether ``path`` names a module (one a candidate may use through its attributes
    only: as a value it reaches everything the module holds)."""
    return (
        path in _NAMESPACES
        or path in extra_roots
        or any(path in language.namespaces for language in languages)
    )


def judge_import(
    path: str,
    extra_roots: tuple[str, ...],
    glue: tuple[str, ...] = (),
    languages: Sequence[KernelLanguage] = (),
) -> Refusal | None:
    """Why importing ``path`` (``torch.nn``, ``torch.empty`` from ``from torch import
    empty``) is refused; None when it may be imported (``glue``: the backend's paths the
    gate otherwise refuses, and the modules holding them; ``languages``: the backend's
    kernel languages, whose roots may be imported)."""
    if path in glue or any(g.startswith(path + ".") for g in glue) or path in NN_TUPLE_HELPERS:
        return None
    dsl_roots = [root for language in languages for root in language.roots]
    roots = (*ALLOWED_IMPORTS, *dsl_roots, *extra_roots)
    if not any(path == root or path.startswith(root + ".") for root in roots):
        allowed = ", ".join(["torch", *dsl_roots, "math", "typing", *extra_roots])
        return Refusal(
            "forbidden_import",
            f"import of {shown(path)!r} is not allowed: threads, processes, files, sockets, "
            "timers and introspection are out of a kernel's business",
            f"import only {allowed}; write what {shown(path)!r} did in the kernel or with "
            "torch glue (numpy's work: torch tensors; timing: the verifier times)",
        )
    hidden = [part for part in path.split(".")[1:] if reported_by_attribute_rules(part)]
    if hidden and path != AUTOGRAD_FUNCTION:
        return Refusal(
            "introspection",
            f"importing `{shown(hidden[0])}` is not allowed: it reaches interpreter or "
            "PyTorch internals",
            "import the public module and use its public names (import torch; torch.empty)",
        )
    if is_namespace(path, extra_roots, languages):
        return None
    if judge_chain(path, "init", extra_roots, languages) is None:
        return None
    return judge_chain(path, "forward", extra_roots, languages)


def judge_chain(
    path: str,
    where: Context,
    extra_roots: tuple[str, ...] = (),
    languages: Sequence[KernelLanguage] = (),
    kernel: KernelLanguage | None = None,
) -> Refusal | None:
    """Why the chain ``path`` may not be used ``where``; None when it may (``languages``:
    the backend's kernel languages, which judge the chains of their modules; ``kernel``:
    the language of the kernel body ``where`` is "jit")."""
    parts = path.split(".")
    if path in NN_TUPLE_HELPERS:
        return None if where in ("forward", "init") else refused(path, where, kernel=kernel)
    if any(reported_by_attribute_rules(part) for part in parts[1:]):
        return None
    if path.startswith(FILE_CALLS):
        return Refusal(
            "file_io",
            f"`{shown(path)}` reads or writes files: candidates must not touch the file "
            "system (no saved or precomputed results)",
            "compute everything from the inputs in every call; build weights in __init__ "
            "with torch.empty and nn.init",
        )
    if parts[0] == "torch":
        return _judge_torch(path, parts, where, kernel)
    for language in languages:
        if parts[0] in language.roots:
            return language.judge_chain(path, where)
    for module in _PLAIN_MODULES:
        depth = module.count(".") + 1
        if parts[:depth] == module.split("."):
            leaf = parts[-1] if len(parts) == depth + 1 else ""
            if len(parts) <= depth or (is_public(leaf) and (module != "typing" or _typing(leaf))):
                return None
            return escape(path)
    if parts[0] in extra_roots:
        # A backend's library: its hook judges the calls; modules reached through it are
        # refused here.
        if any(not is_public(part) or part in sys.stdlib_module_names for part in parts[1:]):
            return escape(path)
        return None
    return escape(path)


def _judge_torch(
    path: str, parts: list[str], where: Context, kernel: KernelLanguage | None
) -> Refusal | None:
    name = parts[1] if len(parts) > 1 else ""
    if not name:
        return None
    if name == "nn":
        return _judge_nn(path, parts[2:], where, kernel)
    if name == "cuda":
        if len(parts) == 2 or (len(parts) == 3 and parts[2] in TORCH_CUDA_GLUE):
            return refused(path, where, kernel=kernel) if where in ("launch", "jit") else None
        return Refusal(
            "stream_trick",
            f"`{shown(path)}`: streams, events and graphs move work out of the timed stream",
            "launch on the current stream, as kernel[grid](...) does; of torch.cuda use "
            "only " + ", ".join(sorted(TORCH_CUDA_GLUE)),
        )
    if len(parts) == 2 and name in TORCH_GLUE:
        if where == "jit" or (where == "launch" and name not in TORCH_DTYPES):
            return refused(path, where, kernel=kernel)
        return None
    if len(parts) == 2 and name in TORCH_INIT and where == "init":
        return None
    compute = len(parts) == 2 or name in TORCH_COMPUTE_NAMESPACES
    return refused(path, where, compute=compute and _function_like(name), kernel=kernel)


def _judge_nn(
    path: str, rest: list[str], where: Context, kernel: KernelLanguage | None
) -> Refusal | None:
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
            if head == "functional":
                return Refusal(
                    "torch_compute",
                    f"`{shown(path)}` is PyTorch compute standing in for the kernel",
                    _COMPUTE_INSTEAD,
                )
            return Refusal(
                "torch_compute",
                f"`{shown(path)}` outside __init__: initialising parameters is not forward's work",
                "initialise parameters in __init__ (nn.init runs there once)",
            )
        return refused(path, where, kernel=kernel)
    if head[:1].isupper() and rest[1:] in ([], ["__init__"]):
        if where in ("forward", "init"):
            return None
        return refused(path, where, compute=head not in NN_ANYWHERE, kernel=kernel)
    return refused(path, where, kernel=kernel)


def refused(
    path: str, where: str, *, compute: bool = False, kernel: KernelLanguage | None = None
) -> Refusal:
    """The refusal of the chain ``path`` where it is not allowed (``kernel``: the language
    of the kernel body ``where`` is "jit")."""
    shown_path = shown(path)
    if where == "jit":
        counterpart = kernel.counterpart(path) if kernel is not None else None
        return Refusal(
            "kernel_body",
            f"`{shown_path}` in a {kernel.kernel_title if kernel else 'kernel'}: a kernel may "
            f"use only {kernel.language_words if kernel else 'its language'}, its arguments "
            "and arithmetic",
            ""
            if counterpart
            else "compute it on the host and pass the result in as an "
            "argument, or write it with the language's functions",
            counterpart or "",
        )
    if where == "launch":
        return Refusal(
            "callback",
            f"`{shown_path}` in code Triton runs during a launch (a grid function, heuristic "
            "or hook): such code may only compute launch sizes",
            "compute the grid from sizes only: `lambda meta: (triton.cdiv(n, "
            'meta["BLOCK"]),)` with n = x.numel() read in forward',
        )
    if where == "forward" and compute:
        return Refusal(
            "torch_compute",
            f"`{shown_path}` is PyTorch compute standing in for the kernel (allowed in "
            "forward: allocation, views, reshapes, .contiguous(), .to())",
            _COMPUTE_INSTEAD,
        )
    if where == "init":
        return Refusal(
            "module_escape",
            f"`{shown_path}` is not among the torch names __init__ may use: tensor creation "
            "and random initialisation, torch.nn modules, nn.init and tensor functions to "
            "prepare parameters (no modules reached through torch: torch.os, torch._C ...)",
            "build parameters with torch.empty/torch.randn and nn.init, or keep the "
            "nn module whose parameters the kernel reads",
        )
    return escape(path)


def escape(path: str) -> Refusal:
    """The refusal of a chain that is on no allow-list (a module reached through another)."""
    return Refusal(
        "module_escape",
        f"`{shown(path)}` is not among the names a candidate may use from its imports "
        "(modules reached through an allowed one, like torch.os, torch.importlib, "
        "torch._C or triton.runtime, are refused)",
        "use the public functions of the allowed modules directly (torch.empty, tl.load, "
        "math.sqrt)",
    )


def is_public(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_")


def _function_like(name: str) -> bool:
    """Whether a refused torch name reads as a PyTorch function (for the rule that names the
    refusal: torch_compute), not as a module it holds (module_escape)."""
    return is_public(name) and name not in sys.stdlib_module_names | {"torch", "np", "numpy"}


def _typing(name: str) -> bool:
    return name[:1].isupper() or name in TYPING_LOWERCASE


def refused_dunder(name: str) -> bool:
    """A dunder name a candidate may not use (all but ALLOWED_DUNDERS)."""
    return name.startswith("__") and name.endswith("__") and name not in ALLOWED_DUNDERS


def reported_by_attribute_rules(name: str) -> bool:
    """Parts the gate's attribute rules refuse whatever they belong to (introspection, or
    a tensor subclass made: checks.check_attribute_name)."""
    return name in BANNED_ATTRS or refused_dunder(name) or name in TENSOR_SUBCLASS_MAKERS
