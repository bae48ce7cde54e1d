"""The static reward-hack gate: pure ``ast`` rules a candidate must satisfy before it runs.

Nothing here imports or executes the candidate. Each broken rule is a :class:`Violation`
with a stable rule id (used in ``VerificationReport.reasons``), the line, and a message
written for the coder. The rule tables are in :mod:`kernelflow.actors.verifier.gate_rules`;
what a backend adds (its imports, its library's glue, what counts as its kernel) comes from
its :class:`~kernelflow.actors.backends.Backend`. The runtime guards in the sandbox
(:mod:`kernelflow.actors.verifier.child.guards`) back these rules up (dispatch-level check
of PyTorch ops, launch counting, thread and process checks).

Rules (DESIGN §7):

- ``no_kernel``: the backend's kernel must be defined and launched: for Triton, a
  ``@triton.jit`` kernel that stores (``tl.store``/``tl.atomic_*``), launched as
  ``kernel[grid](...)``; for CUDA, a ``__global__`` kernel in source compiled with CuPy
  ``RawModule``/``RawKernel`` and launched from a function
  (``kernel((grid,), (block,), (args...))``).
- ``reference_use``: no inheriting from, naming or calling the reference ``Model``.
- ``exception_fallback``: no ``try``/``except`` in functions (a fallback to PyTorch).
- ``torch_compute``: no PyTorch compute ops outside ``__init__`` (allocation, views,
  reshapes and dtype/device moves are allowed glue); no ``@``; no calling torch submodules;
  no library compute of the backend either (for CUDA, only ``from_dlpack``/``asarray``
  views, dtypes and the raw-kernel classes of CuPy).
- ``introspection``: no frame/``inspect``/``gc``/``sys`` access, ``eval``/``exec``, dunder
  reflection, ``getattr`` with computed names.
- ``forbidden_import``: only torch, triton, math, typing (and the backend's extra imports,
  cupy for CUDA) may be imported: no threads, processes, sockets, files, timers, ctypes.
- ``stream_trick``: no CUDA streams, events, graphs (``torch.cuda`` or ``cupy.cuda``).
- ``file_io``: no saving, loading or mapping files (``torch.save``/``load``/``from_file``,
  ``.tofile()``, ``torch.hub``/``onnx``/``jit``/``profiler`` ...), in ``__init__`` too; the
  sandbox's read-only file system stops what this misses.
- ``monkey_patch``: no assigning attributes of imported modules or of classes.
- ``caching``: no caching decorators, ``global`` state, module-level mutable containers
  written by functions, or ``self.x = ...`` outside ``__init__``.
- ``precision_downgrade``: no fp16/bf16 when the task itself never uses them.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kernelflow.actors.backends import DEFAULT_BACKEND, Backend, dotted_name
from kernelflow.actors.backends import backend as find_backend
from kernelflow.actors.syntax import parse_module
from kernelflow.actors.verifier.gate_rules import (
    ALLOWED_IMPORTS,
    BANNED_ATTRS,
    BANNED_NAMES,
    CACHE_DECORATORS,
    FILE_ATTRS,
    FILE_CALLS,
    FORBIDDEN_IMPORT_PREFIXES,
    HALF_NAMES,
    NN_ANYWHERE,
    NOT_TENSOR_CALLS,
    STREAM_ATTRS,
    STREAM_MODULES,
    TENSOR_COMPUTE,
    TORCH_CUDA_GLUE,
    TORCH_GLUE,
)

__all__ = ["Violation", "check_candidate"]


@dataclass(frozen=True)
class Violation:
    rule: str
    line: int
    message: str

    def text(self) -> str:
        return f"{self.rule}: line {self.line}: {self.message}"


def _is_jit_decorator(dec: ast.expr) -> bool:
    target = dec.func if isinstance(dec, ast.Call) else dec
    name = dotted_name(target) or ""
    return name.endswith("jit") or name.endswith("autotune") or name.endswith("heuristics")


class _Gate:
    """One candidate module under the gate's rules (a ``CandidateModule`` to its backend)."""

    def __init__(self, tree: ast.Module, backend: Backend, task_uses_half: bool) -> None:
        self.tree = tree
        self.backend = backend
        self.task_uses_half = task_uses_half
        self.out: list[Violation] = []
        self.aliases: dict[str, str] = {}  # local name -> imported module path
        self.jit_kernels: dict[str, ast.FunctionDef] = {}
        self.module_mutables: set[str] = set()

    def add(self, rule: str, node: ast.AST, message: str) -> None:
        self.out.append(Violation(rule, getattr(node, "lineno", 0), message))

    def resolve(self, node: ast.AST) -> str | None:
        """Dotted name with the first part resolved through import aliases."""
        name = dotted_name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return name
        return f"{base}.{rest}" if rest else base

    # ------------------------------------------------------------------ passes

    def run(self) -> list[Violation]:
        self.collect_module()
        for node in ast.walk(self.tree):
            self.check_everywhere(node)
        for func, in_init in self.functions():
            self.check_function(func, in_init)
        self.backend.check_kernels(self)
        self.check_module_level()
        seen: set[tuple[str, int, str]] = set()
        unique = []
        for v in sorted(self.out, key=lambda v: (v.line, v.rule)):
            key = (v.rule, v.line, v.message)
            if key not in seen:
                seen.add(key)
                unique.append(v)
        return unique

    def collect_module(self) -> None:
        allowed = {*ALLOWED_IMPORTS, *self.backend.extra_imports}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.check_import(node, alias.name, allowed)
                    local = alias.asname or alias.name.split(".")[0]
                    self.aliases[local] = alias.name if alias.asname else local
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    self.add("forbidden_import", node, "relative imports are not allowed")
                    continue
                for alias in node.names:
                    self.check_import(node, f"{module}.{alias.name}", allowed)
                    self.aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                _is_jit_decorator(d) for d in node.decorator_list
            ):
                self.jit_kernels[node.name] = node
            if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
                node.value, ast.Dict | ast.List | ast.Set | ast.Call | ast.DictComp | ast.ListComp
            ):
                is_container = not isinstance(node.value, ast.Call) or (
                    (dotted_name(node.value.func) or "")
                    in {"dict", "list", "set", "collections.OrderedDict", "OrderedDict"}
                )
                if is_container:
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        if isinstance(t, ast.Name):
                            self.module_mutables.add(t.id)

    def check_import(self, node: ast.AST, name: str, allowed: set[str]) -> None:
        top = name.split(".")[0]
        ok = top in {a.split(".")[0] for a in allowed}
        if name.startswith("collections.") and not name.startswith("collections.abc"):
            ok = False
        if name.startswith(FORBIDDEN_IMPORT_PREFIXES):
            ok = False
        if not ok:
            self.add(
                "forbidden_import",
                node,
                f"import of {name!r} is not allowed (allowed: "
                + ", ".join(["torch", "triton", "math", "typing", *self.backend.extra_imports])
                + "): no threads, processes, files, sockets, timers or introspection",
            )

    def functions(self) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
        """Every non-kernel function, with whether it is an ``__init__`` (where torch
        modules and parameter initialisation are allowed)."""
        found: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, bool]] = []
        kernels = set(map(id, self.jit_kernels.values()))
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and id(node) not in kernels:
                found.append((node, node.name == "__init__"))
        return found

    def check_everywhere(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            self.add("introspection", node, f"`{node.id}` is not allowed in a candidate")
        if isinstance(node, ast.Name) and node.id == "Model":
            self.add(
                "reference_use",
                node,
                "the reference `Model` must not be used, inherited or called: ModelNew "
                "must compute the result with its own kernel",
            )
        if isinstance(node, ast.Attribute):
            if node.attr in BANNED_ATTRS:
                self.add("introspection", node, f"attribute `.{node.attr}` is not allowed")
            full = self.resolve(node) or ""
            if full.startswith(STREAM_MODULES) and node.attr in STREAM_ATTRS:
                self.add(
                    "stream_trick",
                    node,
                    f"`{full}`: no streams, events or graphs; launch on the current stream",
                )
        if isinstance(node, ast.Call):
            called = self.resolve(node.func) or ""
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if called.startswith(FILE_CALLS) or method in FILE_ATTRS:
                self.add(
                    "file_io",
                    node,
                    f"`{called or '.' + method}(...)` reads or writes files: candidates must not "
                    "touch the file system (no saved or precomputed results)",
                )
        if isinstance(node, ast.Call) and dotted_name(node.func) == "getattr":
            attr = node.args[1] if len(node.args) > 1 else None
            if not (isinstance(attr, ast.Constant) and isinstance(attr.value, str)):
                self.add("introspection", node, "getattr() with a computed name is not allowed")
            elif attr.value in BANNED_ATTRS or attr.value.startswith("__"):
                self.add("introspection", node, f"getattr(..., {attr.value!r}) is not allowed")
            elif node.args and self.resolve(node.args[0]) in set(self.aliases.values()):
                self.add("introspection", node, "getattr() on a module is not allowed")
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if (dotted_name(base) or "").split(".")[-1] == "Model":
                    self.add("reference_use", base, "ModelNew must not inherit from Model")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = (dotted_name(target) or "").split(".")[-1]
                if name in CACHE_DECORATORS:
                    self.add("caching", dec, f"@{name}: results must not be cached across calls")
        if isinstance(node, ast.Global | ast.Nonlocal):
            self.add("caching", node, "`global`/`nonlocal` state is not allowed (result caching)")
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in targets:
                self.check_patch_target(t)
        if isinstance(node, ast.Attribute) and node.attr in HALF_NAMES | {"half", "bfloat16"}:
            self.check_half(node, node.attr)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value in ("float16", "bfloat16", "half", "fp16", "bf16")
        ):
            self.check_half(node, node.value)

    def check_half(self, node: ast.AST, name: str) -> None:
        if not self.task_uses_half:
            self.add(
                "precision_downgrade",
                node,
                f"`{name}`: the task computes in full precision; do not downgrade to fp16/bf16",
            )

    def check_patch_target(self, target: ast.AST) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self.check_patch_target(elt)
            return
        if isinstance(target, ast.Attribute):
            root: ast.expr = target
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and (
                root.id in self.aliases or root.id in {"ModelNew", "nn", "torch", "triton"}
            ):
                self.add(
                    "monkey_patch",
                    target,
                    f"assigning `{dotted_name(target)}` patches a module or class; not allowed",
                )
        if isinstance(target, ast.Subscript):
            base: ast.expr = target.value
            while isinstance(base, ast.Attribute | ast.Subscript):
                base = base.value
            if isinstance(base, ast.Name) and base.id in self.aliases:
                self.add("monkey_patch", target, "writing into an imported module is not allowed")

    def check_function(self, func: ast.FunctionDef | ast.AsyncFunctionDef, in_init: bool) -> None:
        for node in ast.walk(func):
            if isinstance(node, ast.Try | getattr(ast, "TryStar", ast.Try)) and node.handlers:
                reraises = all(h.body and isinstance(h.body[-1], ast.Raise) for h in node.handlers)
                if not reraises:
                    self.add(
                        "exception_fallback",
                        node,
                        "try/except in candidate code (a fallback to PyTorch?): let errors "
                        "surface; the kernel must handle every input",
                    )
            if in_init:
                continue
            if isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.MatMult):
                self.add(
                    "torch_compute", node, "`@` is a PyTorch matmul standing in for the kernel"
                )
            if isinstance(node, ast.Call):
                self.check_call(node)
            if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    base = t
                    while isinstance(base, ast.Subscript | ast.Attribute):
                        if (
                            isinstance(base, ast.Attribute)
                            and isinstance(base.value, ast.Name)
                            and base.value.id == "self"
                        ):
                            self.add(
                                "caching",
                                t,
                                f"`self.{base.attr} = ...` outside __init__ keeps state across "
                                "forward calls (result caching); allocate per call",
                            )
                            break
                        base = base.value
                    if (
                        isinstance(base, ast.Name)
                        and base.id in self.module_mutables
                        and base is not t
                    ):
                        self.add(
                            "caching",
                            t,
                            f"writing into module-level `{base.id}` from a function "
                            "(a result cache)",
                        )
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in self.module_mutables
                and node.func.attr in {"append", "update", "setdefault", "add", "insert", "extend"}
            ):
                self.add(
                    "caching",
                    node,
                    f"mutating module-level `{node.func.value.id}` (a result cache)",
                )

    def check_call(self, node: ast.Call) -> None:
        func = node.func
        full = self.resolve(func)
        if full is not None and self.backend.check_library_call(self, node, full):
            return
        if full is not None and full.startswith("torch."):
            parts = full.split(".")
            if parts[1] == "nn" and len(parts) > 2:
                if parts[2] == "functional":
                    self.add(
                        "torch_compute",
                        node,
                        f"`{full}` is PyTorch compute standing in for the kernel",
                    )
                elif parts[2] not in NN_ANYWHERE:
                    self.add(
                        "torch_compute",
                        node,
                        f"`{full}(...)` outside __init__: PyTorch modules must not do the work",
                    )
            elif parts[1] == "cuda" and len(parts) > 2:
                if parts[2] not in TORCH_CUDA_GLUE | {"synchronize"}:
                    self.add("stream_trick", node, f"`{full}` is not allowed")
            elif parts[1] not in TORCH_GLUE:
                self.add(
                    "torch_compute",
                    node,
                    f"`{full}` is PyTorch compute standing in for the kernel (allowed in "
                    "forward: allocation, views, reshapes, .contiguous(), .to())",
                )
            return
        if isinstance(func, ast.Attribute):
            if func.attr in TENSOR_COMPUTE and not (full or "").startswith(NOT_TENSOR_CALLS):
                self.add(
                    "torch_compute",
                    node,
                    f"`.{func.attr}()` computes with PyTorch instead of the kernel",
                )
            if (
                isinstance(func.value, ast.Name)
                and func.value.id == "self"
                and func.attr in self.torch_submodules()
            ):
                self.add(
                    "torch_compute",
                    node,
                    f"`self.{func.attr}(...)` runs a PyTorch module; use its parameters in "
                    "your kernel instead",
                )

    def torch_submodules(self) -> set[str]:
        if not hasattr(self, "_submodules"):
            subs: set[str] = set()
            for node in ast.walk(self.tree):
                if (
                    isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)
                    and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute)
                    and isinstance(node.targets[0].value, ast.Name)
                    and node.targets[0].value.id == "self"
                ):
                    full = self.resolve(node.value.func) or ""
                    if full.startswith("torch.nn.") and full.split(".")[2] not in NN_ANYWHERE:
                        subs.add(node.targets[0].attr)
            self._submodules = subs
        return self._submodules

    def check_module_level(self) -> None:
        """Code that runs at import or class creation: no compute, no bare calls."""
        bodies: list[ast.stmt] = list(self.tree.body)
        for node in self.tree.body:
            if isinstance(node, ast.ClassDef):
                bodies.extend(node.body)
        for node in bodies:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                self.add(
                    "module_code",
                    node,
                    "module-level calls run once at import (precomputed results?); only "
                    "definitions and constants belong at module level",
                )
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call):
                    self.check_call(sub)


def check_candidate(
    source: str, *, backend: str = DEFAULT_BACKEND, task_source: str = ""
) -> list[Violation]:
    """The rules ``source`` breaks (empty: it may run) as a candidate of ``backend`` (a
    registered name: raises UnknownBackend otherwise). ``source`` must parse."""
    tree = parse_module(source, filename="candidate.py")
    task_uses_half = any(word in task_source for word in ("float16", "bfloat16", "half"))
    return _Gate(tree, find_backend(backend), task_uses_half).run()
