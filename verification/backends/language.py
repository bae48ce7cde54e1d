"""What the static gate asks of a kernel language whose kernels are Python functions
(Triton's ``@triton.jit``): the walker (:mod:`kernelflow.verification.gate`) knows no DSL;
a backend whose candidates write such kernels gives it one of these
(:meth:`~kernelflow.verification.backends.base.Backend.kernel_language`), and so does every
backend it borrows from (``Backend.borrows``).

The walker finds the kernels (functions a decorator of the language marks), judges their
bodies (scope ``jit``) and the callbacks run during their launches (scope ``launch``) by
the stricter rules of docs/verifier.md, "The static gate", and asks the language about
what only it knows: which of its modules' names a candidate may use where, what a kernel
body may contain, which values in a kernel are the host's. Daemon side only: a sandbox
never imports the gate nor a language's rules.
"""

from __future__ import annotations

import ast
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar, NamedTuple, Protocol

__all__ = ["Finding", "KernelLanguage", "KernelScope", "Problem", "Refusal"]

AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef


class Refusal(NamedTuple):
    """Why a chain may not be used (docs/verifier.md, "Feedback that teaches"): the rule,
    why (``message``), what to write instead (``instead``; "": the rule's own advice,
    :data:`kernelflow.verification.gate.feedback.RULE_ADVICE`) and, where one dotted path
    stands in for it, that path resolved (``replacement``: the gate spells it the way the
    candidate imports it)."""

    rule: str
    message: str
    instead: str = ""
    replacement: str = ""
    # Whether the chain names what the installed package does not have: such a finding
    # explains the others it causes and leads the report.
    missing: bool = False


class Finding(NamedTuple):
    """A rule a node breaks, why, and what to write instead ("": the rule's advice)."""

    rule: str
    node: ast.AST
    message: str
    instead: str = ""


class Problem(NamedTuple):
    """Why a node may not be in a kernel body or a callback, and what to write instead
    (a check may return a plain ``str``: the rule's own advice then)."""

    message: str
    instead: str = ""


class KernelScope(Protocol):
    """What a language reads of the scope of a kernel body (the gate's ``Scope``)."""

    @property
    def where(self) -> str: ...  # "jit" in a kernel body, "launch" in a launch callback

    @property
    def bound(self) -> frozenset[str]: ...  # every local name, the parameters included

    @property
    def host(self) -> frozenset[str]: ...  # names that may hold objects of the host

    @property
    def makers(self) -> frozenset[str]: ...  # names whose calls make new values

    @property
    def constexprs(self) -> frozenset[str]: ...  # parameters annotated ...constexpr


class KernelLanguage(ABC):
    """One kernel language written as Python functions, for the gate."""

    # The modules a candidate imports the language from ("triton"): importable wherever
    # the language is the backend's or borrowed, their chains judged by ``judge_chain``.
    roots: ClassVar[tuple[str, ...]]
    # Its module paths a candidate may use only through their attributes (as a value a
    # module reaches everything it holds).
    namespaces: ClassVar[frozenset[str]] = frozenset()
    # How messages name one of its kernels ("@triton.jit kernel").
    kernel_title: ClassVar[str]
    # Where a kernel body's problems are said to be, after the offending code.
    kernel_place: ClassVar[str]
    # What a kernel body may use, in words ("the Triton language (tl.*)").
    language_words: ClassVar[str]
    # Calls that make a dtype from a value (judged with torch.dtype: only with a literal).
    dtype_constructors: ClassVar[frozenset[str]] = frozenset()

    @abstractmethod
    def is_kernel_decorator(self, path: str) -> bool:
        """Whether a function decorated with ``path`` (resolved through the imports) is a
        kernel of the language."""

    def decorator_only(self, path: str) -> bool:
        """Whether ``path`` may be used only as a kernel's decorator."""
        return False

    def is_constant_wrapper(self, name: str) -> bool:
        """Whether a call of ``name`` (as written) around literals is a module constant a
        kernel may read (``tl.constexpr(4)``)."""
        return False

    @abstractmethod
    def judge_chain(self, path: str, where: str) -> Refusal | None:
        """Why the chain ``path`` (rooted at one of ``roots``) may not be used ``where``
        (forward, init, launch, jit); None when it may."""

    def call_findings(
        self, node: ast.Call, path: str | None, full_precision: bool
    ) -> list[Finding]:
        """What a call of ``path`` (None: not of an imported module) breaks of the
        language's rules wherever it is (hooks run around launches, precision)."""
        return []

    def function_argument(
        self, node: ast.Call, name: str, receiver: int, kernels: set[str]
    ) -> str | None:
        """Why a call of ``name`` (a function of the language, or a method of its values:
        ``receiver`` 1) that runs a function it is given may not be given this one
        (``kernels``: the module's kernels), in words; None when it may."""
        return None

    def host_names(
        self,
        kernels: Mapping[str, list[AnyFunction]],
        launched: set[str],
        language: frozenset[str],
    ) -> tuple[dict[int, frozenset[str]], frozenset[str]]:
        """For each kernel (by ``id``), its names that may hold objects of the host; and
        the kernels that may return a host value they are given (``language``: the
        module's imports). None of either by default."""
        return {}, frozenset()

    # ------------------------------------------------------------ kernel bodies

    @abstractmethod
    def node_problem(
        self, node: ast.AST, scope: KernelScope, passing: frozenset[str]
    ) -> str | Problem | None:
        """Whether ``node``'s kind may appear in a kernel body (``passing``: the kernels
        that may return a host value they are given)."""

    @abstractmethod
    def name_problem(
        self, name: str, scope: KernelScope, kernel_globals: set[str]
    ) -> str | Problem | None:
        """A name (not an import) read in a kernel body (``kernel_globals``: the module's
        kernels and constants)."""

    @abstractmethod
    def attribute_problem(self, node: ast.Attribute, scope: KernelScope) -> str | Problem | None:
        """An attribute of a value (not of a module) read in a kernel body."""

    @abstractmethod
    def builtin_call(self, name: str) -> bool:
        """Whether a kernel body may call the builtin ``name``."""

    def counterpart(self, path: str) -> str | None:
        """The language's own dotted path (resolved) doing what the host's ``path``
        (``torch.exp``) does in a kernel body, where the installed package has one."""
        return None
