"""What a backend (a kernel DSL: Triton, CUDA C, ...) is to kernelflow, as one object.

A :class:`Backend` says what the prompt tells the coder about the DSL, what the static
gate requires of a candidate (the extra modules it may import, the library calls that are
glue, what counts as a launched kernel, the rules of its kernel language) and how the
verifier's sandbox preloads, probes and readies the DSL's runtime, counts its launches and
reports its versions. Its module is imported inside sandboxes, so it imports
only the stdlib at module level: torch, triton or cupy are imported inside the hooks that
run in the sandbox.
"""

from __future__ import annotations

import ast
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, Protocol

if TYPE_CHECKING:
    from kernelflow.verification.backends.language import KernelLanguage

__all__ = ["NAME_PATTERN", "Backend", "CandidateModule", "LaunchCounter", "dotted_name"]

# The names a backend may have: those ``SubmitTask.backend`` accepts when decoded
# (``kernelflow.events.model.BACKEND_NAME_PATTERN``, not imported: a sandbox imports this
# module and must not load msgspec; a test keeps the two equal).
NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"


class CandidateModule(Protocol):
    """What the static gate knows of a candidate module, for a backend's rules."""

    tree: ast.Module
    # Every kernel function of the backend's kernel languages (``@triton.jit``), by name.
    jit_kernels: dict[str, ast.FunctionDef]
    launched: set[str]  # the kernels the module launches: kernel[grid](...)
    task_uses_half: bool  # the task computes in fp16/bf16 itself

    def resolve(self, node: ast.AST) -> str | None:
        """``node``'s dotted name, its first part resolved through the module's imports."""
        ...

    def functions(self) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
        """Every function but the jit kernels, with whether it is an ``__init__``."""
        ...

    def add(self, rule: str, node: ast.AST, message: str) -> None:
        """Record a broken rule at ``node``'s line."""
        ...


class LaunchCounter(Protocol):
    """The sandbox's count of kernel launches: a backend wraps each launch in
    ``launching()``, so the runtime guards know forward() launched a kernel and look away
    from the tensor ops the launch itself runs; ``refuse`` ends a launch the backend's own
    rules refuse (as a broken rule, not as the candidate's crash)."""

    def launching(self) -> AbstractContextManager[None]: ...

    def refuse(self, rule: str, message: str) -> NoReturn: ...


class Backend(ABC):
    """One kernel DSL. Subclass it, set the class attributes, implement the hooks, and
    register an instance (:func:`kernelflow.verification.backends.register_backend`, or the
    ``kernelflow.backends`` entry-point group)."""

    name: ClassVar[str]  # what tasks name (``SubmitTask.backend``): NAME_PATTERN
    title: ClassVar[str]  # in the prompt: "... turns PyTorch operators into <title> kernels"
    needs_gpu: ClassVar[bool] = False  # False: also checked on the CPU
    device_note: ClassVar[str] = ""  # for the prompt: where and how kernels are checked
    dsl_notes: ClassVar[str] = ""  # for the prompt: the DSL in brief (``$dsl_guidance``)
    # Modules a candidate may import besides the ones every backend allows.
    extra_imports: ClassVar[tuple[str, ...]] = ()
    # What forward() must launch at least once, in words ("": no such runtime check).
    launch_label: ClassVar[str] = ""
    # Why the verdict is ``unsupported`` when start_runtime fails, in words.
    runtime_unavailable: ClassVar[str] = "its runtime cannot start here"
    # Where its kernels are timed against the baseline ("cuda": on GPUs; Triton's CPU
    # interpreter has no timing meaning).
    timed_on: ClassVar[frozenset[str]] = frozenset({"cuda"})
    # How its kernels run in a check on the CPU, in words, for reports ("Triton in its
    # interpreter"; "": natively, on the threads the check computes with).
    cpu_runs: ClassVar[str] = ""
    # Whether the launches of the kernels of the DSLs it borrows count as its own launches
    # in the sandbox (their arguments checked as their backend checks them): False where
    # forward() must launch the backend's own kernel and the guards watch the others.
    counts_borrowed_launches: ClassVar[bool] = True
    # Dotted paths the gate otherwise refuses that a candidate of this backend may use at
    # module level or in __init__ (``torch.utils.cpp_extension.load_inline``).
    glue_paths: ClassVar[tuple[str, ...]] = ()
    # Other backends whose DSL a candidate of this one may use too (their kernel languages
    # pass the gate, by their rules) and whose modules this backend's may import (a test
    # holds every backend to it: tests/unit/test_architecture.py). ``cuda`` borrows ``cpp``'s
    # extensions; every built-in backend borrows Triton.
    borrows: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        name = cls.__dict__.get("name")
        if name is not None and not re.match(NAME_PATTERN, name):
            raise ValueError(f"backend name {name!r} does not match {NAME_PATTERN}")

    # ------------------------------------------------------------------ static gate

    @abstractmethod
    def check_kernels(self, module: CandidateModule) -> None:
        """Add a ``no_kernel`` violation unless ``module`` defines a kernel of this DSL and
        launches it."""

    def check_library_call(self, module: CandidateModule, node: ast.Call, name: str) -> bool:
        """Judge a call of ``name`` (resolved dotted name) outside ``__init__`` that belongs
        to this DSL's own library, adding violations for what is not glue; return whether
        it was this backend's to judge (False: the gate's PyTorch rules apply)."""
        return False

    def kernel_language(self) -> KernelLanguage | None:
        """The gate's rules for this DSL's kernels when they are Python functions (Triton's
        ``@triton.jit``; :mod:`.language`); None for a DSL written in source strings.
        Daemon side only: import the rules inside this method."""
        return None

    def foreign_kernel(self, tree: ast.Module, judge: Backend) -> tuple[int, str] | None:
        """When the candidate ``tree``, judged as ``judge``'s, is plainly written for this
        backend (it builds a load_inline extension ``judge`` does not take): the line that
        shows it and a hint, refused as ``no_kernel`` without any other rule."""
        return None

    def holds_kernel(self, module: CandidateModule, node: ast.AST) -> bool:
        """Whether ``node`` (a name or attribute of the module) is bound to this DSL's
        compiled code (an extension module or one of its functions): its name is then
        the candidate's choice, not a reach into PyTorch's internals (``self.ops``)."""
        return False

    # ------------------------------------------------------------------ sandbox

    def preload(self) -> None:
        """In the verifier's warm process, before it forks a sandbox for each check: import
        the DSL's runtime (never initialising CUDA), so that every sandbox starts with it.
        Built-in and registered backends are preloaded, not entry-point plugins. Nothing by
        default."""
        return None

    def check_runtime(
        self, device: str, compile_here: bool, load: Callable[[Path, str], Any]
    ) -> None:
        """In the probe that picks the sandbox plan, under the sandbox's limits: import the
        DSL's runtime and, on ``device`` "cuda" with ``compile_here`` (inside the sandbox's
        read-only file system), build and run a kernel the way a check would (``load``
        imports a module from a file as a candidate is imported); raise if it cannot.
        Nothing by default."""
        return None

    def versions(self) -> dict[str, str]:
        """The DSL's software and its versions, for each report ({"triton": "3.4.0"});
        called in the sandbox after the check, so what is missing there is left out."""
        return {}

    def count_launches(self, launches: LaunchCounter) -> None:
        """In the sandbox: make every launch of one of this DSL's kernels go through
        ``launches`` (also when a backend that borrows the DSL is checked). Nothing by
        default."""
        return None

    def use_prebuilt(self, directory: str) -> None:
        """In the sandbox, before ``start_runtime``: ``directory`` holds what the verifier
        built for this candidate beforehand (compiled extensions). Nothing by default."""
        return None

    @abstractmethod
    def start_runtime(self, device: str, launches: LaunchCounter) -> None:
        """In the sandbox, before the candidate is imported: ready the DSL's runtime on
        ``device`` and make every launch of one of its kernels go through ``launches``
        (``count_launches``; the sandbox then counts the borrowed DSLs' launches). Raise if
        it cannot run here: the verdict is then ``unsupported``."""


def import_bindings(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str, str]]:
    """What an import binds: (local name, the dotted path it names, the module or object
    imported) for each alias. ``import a.b`` binds ``a`` to ``a`` (importing ``a.b``);
    ``import a.b as c`` binds ``c`` to ``a.b``; ``from a import b as c`` binds ``c`` to
    ``a.b``."""
    bound = []
    for alias in node.names:
        if isinstance(node, ast.Import):
            local = alias.asname or alias.name.split(".")[0]
            bound.append((local, alias.name if alias.asname else local, alias.name))
        else:
            path = f"{node.module or ''}.{alias.name}"
            bound.append((alias.asname or alias.name, path, path))
    return bound


def dotted_name(node: ast.AST) -> str | None:
    """``torch.nn.functional.relu`` for an Attribute chain rooted at a Name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None
