"""The static reward-hack gate: pure ``ast`` rules a candidate must satisfy before it runs.

Nothing here imports or executes the candidate. Each broken rule is a :class:`Violation`
with a stable rule id (used in ``VerificationReport.reasons``), the line, and a message
written for the coder. Every part of the module is checked, by where it runs
(:mod:`.gate_scopes`): module level, class bodies, decorators and default arguments,
``__init__``, forward and its helpers, nested functions, lambdas, ``@triton.jit`` bodies.
The rule tables are in :mod:`.gate_rules`; which attributes of the allowed modules may be
used is an allow-list (:mod:`.gate_chains`); kernel bodies and launch callbacks get
stricter allow-lists still (:mod:`.gate_strict`). What a backend adds (its imports, its
library's glue, what counts as its kernel) comes from its
:class:`~kernelflow.actors.backends.Backend`. The gate is one layer: the runtime guards in
the sandbox (:mod:`kernelflow.actors.verifier.child.guards`) back it up.

Rules (DESIGN §7):

- ``no_kernel``: the backend's kernel must be defined and launched: for Triton, a
  ``@triton.jit`` kernel that stores (``tl.store``/``tl.atomic_*``), launched as
  ``kernel[grid](...)``; for CUDA, a ``__global__`` kernel in source compiled with CuPy
  ``RawModule``/``RawKernel`` and launched from a function.
- ``reference_use``: no inheriting from, naming or calling the reference ``Model``.
- ``exception_fallback``: no ``try``/``except`` in functions (a fallback to PyTorch).
- ``torch_compute``: no PyTorch compute outside ``__init__`` (allocation, views, reshapes
  and dtype/device moves are glue), whether called or passed around as a value; no ``@``;
  no calling torch submodules; no library compute of the backend either.
- ``module_escape``: only the allow-listed attributes of the allowed modules; a module
  reached through another (``torch.os``, ``torch.importlib``, ``torch.inspect``,
  ``torch._C``, ``triton.runtime``, ``tl.core``) or a module used as a value is refused,
  in ``__init__`` too.
- ``introspection``: no frames, ``eval``/``exec``, dunder names and attributes
  (``__class__``, ``__array__``, ``__torch_function__`` ...; ``__init__`` is fine),
  ``getattr``/``hasattr`` (write ``obj.attr``), ``type()`` building classes, unbound
  builtin methods (``dict.setdefault(d, ...)``), format strings that reach attributes,
  ``.numpy()`` (compute no runtime guard sees).
- ``kernel_body``: a ``@triton.jit`` body (run as Python by the CPU interpreter) uses the
  Triton language only: ``tl.*``, its arguments, locals, module constants, other kernels,
  ``range``/``min``/``max``...; kernels are module-level functions.
- ``callback``: code Triton or PyTorch runs during a launch or on its own (every lambda,
  candidate functions passed as values: grids, heuristics, hooks) only computes launch
  sizes; no launch hooks, kernel attributes, tensor subclasses or protocol methods
  (``data_ptr``, ``__torch_function__`` ...).
- ``forbidden_import``: only torch, triton, math, typing (and the backend's extra imports,
  cupy for CUDA) may be imported: no threads, processes, sockets, files, timers, ctypes.
- ``stream_trick``: no CUDA streams, events, graphs (``torch.cuda`` or ``cupy.cuda``).
- ``file_io``: no saving, loading or mapping files (``torch.save``/``load``/``from_file``,
  ``.tofile()``, ``torch.hub``/``onnx``/``jit``/``profiler`` ...), in ``__init__`` too; the
  sandbox's read-only file system stops what this misses.
- ``monkey_patch``: no assigning attributes of imported modules, classes or functions;
  outside forward paths attributes are set on ``self`` in ``__init__`` only (so a class
  reached under another name, ``T = torch.Tensor``, is not patched either).
- ``caching``: in forward paths writes land only in values made in the call: not in
  ``self``, arguments, globals, class attributes, closures or their aliases and views
  (``setdefault``, ``append``, ``copy_`` ...); no caching decorators or decorators of the
  candidate's own, ``global`` state, generators.
- ``precision_downgrade``: no fp16/bf16/fp8 (names, imported aliases, strings) when the task
  itself never uses them; no dtypes built at run time; no tf32 ``tl.dot``.
- ``module_code``: no bare calls at module level or in class bodies.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from kernelflow.actors.backends import DEFAULT_BACKEND, Backend, dotted_name
from kernelflow.actors.backends import backend as find_backend
from kernelflow.actors.syntax import parse_module
from kernelflow.actors.verifier.gate_calls import lookup_findings, precision_findings
from kernelflow.actors.verifier.gate_chains import (
    is_namespace,
    judge_chain,
    judge_import,
    refused_dunder,
    shown,
)
from kernelflow.actors.verifier.gate_rules import (
    BANNED_ATTRS,
    BANNED_NAMES,
    BUILTIN_TYPES,
    CACHE_DECORATORS,
    CALLBACK_KEYWORDS,
    CALLBACK_METHODS,
    DYNAMIC_BUILTINS,
    FILE_ATTRS,
    FILE_CALLS,
    LOW_PRECISION,
    LOW_PRECISION_STRINGS,
    MUTATING_METHODS,
    NN_ANYWHERE,
    STREAM_ATTRS,
    STREAM_MODULES,
    TENSOR_COMPUTE,
    TRITON_DECORATORS,
)
from kernelflow.actors.verifier.gate_scopes import (
    CLASS_BODY,
    MODULE,
    Scope,
    Where,
    function_scope,
    kept_state,
    write_root,
)
from kernelflow.actors.verifier.gate_strict import (
    STRICT_RULES,
    attribute_problem,
    call_problem,
    name_problem,
    node_problem,
)

__all__ = ["MAX_VIOLATIONS", "Violation", "check_candidate"]

MAX_VIOLATIONS = 20  # reported per candidate (the first ones by line)
_AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Violation:
    rule: str
    line: int
    message: str

    def text(self) -> str:
        return f"{self.rule}: line {self.line}: {self.message}"


def _is_constant(value: ast.AST | None) -> bool:
    """A literal, or tl.constexpr(literal): module constants a kernel may read."""
    if isinstance(value, ast.UnaryOp):
        value = value.operand
    if isinstance(value, ast.Call) and (dotted_name(value.func) or "").endswith("constexpr"):
        return all(map(_is_constant, value.args))
    return isinstance(value, ast.Constant)


class _Gate:
    """One candidate module under the gate's rules (a ``CandidateModule`` to its backend)."""

    def __init__(self, tree: ast.Module, backend: Backend, task_uses_half: bool) -> None:
        self.tree = tree
        self.backend = backend
        self.extra_roots = backend.extra_imports
        self.task_uses_half = task_uses_half
        self.out: list[Violation] = []
        self.aliases: dict[str, str] = {}  # local name -> imported path
        self.jit_kernels: dict[str, ast.FunctionDef] = {}  # module-level kernels
        self.kernel_names: set[str] = set()  # every @triton.jit function
        self.candidate: set[str] = set()  # the module's own functions, methods and classes
        self.callbacks: set[str] = set()  # its functions used as values (grids, hooks ...)
        self.constants: set[str] = set()  # module-level names bound to literals
        self.decorators: set[int] = set()  # ids of decorator expressions and their callees
        self.called: set[int] = set()  # ids of expressions called directly
        self.refused_imports: set[str] = set()  # aliases whose import is reported already
        self._submodules: set[str] | None = None

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

    def alias_path(self, node: ast.AST) -> str | None:
        """The imported path ``node`` names when it is rooted at an import (else None)."""
        name = dotted_name(node)
        if name is None or name.partition(".")[0] not in self.aliases:
            return None
        return self.resolve(node)

    def is_jit(self, node: ast.AST) -> bool:
        """Whether ``node`` is a function decorated as a Triton kernel (under any alias)."""
        if not isinstance(node, _AnyFunction):
            return False
        for dec in node.decorator_list:
            path = self.resolve(dec.func if isinstance(dec, ast.Call) else dec) or ""
            if path.endswith(("jit", "autotune", "heuristics")):
                return True
        return False

    def functions(self) -> list[tuple[_AnyFunction, bool]]:
        """Every non-kernel function, with whether it is an ``__init__``."""
        kernels = set(map(id, self.jit_kernels.values()))
        return [
            (node, node.name == "__init__")
            for node in ast.walk(self.tree)
            if isinstance(node, _AnyFunction) and id(node) not in kernels
        ]

    # ------------------------------------------------------------------ passes

    def run(self) -> list[Violation]:
        self.collect()
        self.visit_block(self.tree.body, MODULE)
        self.backend.check_kernels(self)
        return sorted(set(self.out), key=lambda v: (v.line, v.rule, v.message))[:MAX_VIOLATIONS]

    def collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.collect_import(node)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                self.called.add(id(node.func))
            elif isinstance(node, _AnyFunction | ast.ClassDef):
                for dec in node.decorator_list:
                    self.decorators.update({id(dec), id(getattr(dec, "func", dec))})
                (self.kernel_names if self.is_jit(node) else self.candidate).add(node.name)
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and self.is_jit(node):
                self.jit_kernels[node.name] = node
            if isinstance(node, ast.Assign | ast.AnnAssign) and _is_constant(node.value):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                self.constants.update(t.id for t in targets if isinstance(t, ast.Name))
        functions = {
            node.name
            for node in ast.walk(self.tree)
            if isinstance(node, _AnyFunction) and node.name not in self.kernel_names
        }
        for node in ast.walk(self.tree):
            if id(node) in self.called:
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.callbacks.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                self.callbacks.add(node.attr)
        self.callbacks &= functions

    def collect_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.level:
            self.add("forbidden_import", node, "relative imports are not allowed")
            return
        for alias in node.names:
            if isinstance(node, ast.Import):
                local = alias.asname or alias.name.split(".")[0]
                path = alias.name if alias.asname else local
                imported = alias.name
            else:
                local = alias.asname or alias.name
                path = imported = f"{node.module or ''}.{alias.name}"
            self.aliases[local] = path
            verdict = judge_import(imported, self.extra_roots)
            if verdict is not None:
                self.add(verdict[0], node, verdict[1])
                self.refused_imports.add(local)
            if alias.name in LOW_PRECISION:
                self.check_half(node, alias.name)

    # ------------------------------------------------------------------ walking

    def visit_block(self, body: list[ast.stmt], scope: Scope) -> None:
        for stmt in body:
            bare_call = isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            if bare_call and scope.where in ("module", "class"):
                self.add(
                    "module_code",
                    stmt,
                    "module-level calls run once at import (precomputed results?); only "
                    "definitions and constants belong at module level",
                )
            self.visit(stmt, scope)

    def visit(self, node: ast.AST, scope: Scope) -> None:
        if scope.where in STRICT_RULES:
            problem = node_problem(node, scope)
            if problem:
                self.add(STRICT_RULES[scope.where], node, problem)
        if isinstance(node, _AnyFunction):
            self.visit_function(node, scope)
        elif isinstance(node, ast.Lambda):
            self.visit_defaults(node.args, scope)
            where: Where = "jit" if scope.where == "jit" else "launch"
            self.visit(node.body, self.scope_of(node, where, method=False))
        elif isinstance(node, ast.ClassDef):
            self.visit_class(node, scope)
        elif isinstance(node, ast.Attribute):
            self.visit_attribute(node, scope)
        elif isinstance(node, ast.Name):
            self.visit_name(node, scope)
        elif isinstance(node, ast.Call):
            self.visit_call(node, scope)
        elif isinstance(node, ast.Subscript):
            self.visit_subscript(node, scope)
        else:
            self.check_node(node, scope)
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope)

    def visit_defaults(self, args: ast.arguments, scope: Scope) -> None:
        """Defaults and annotations: evaluated where the function is defined."""
        every = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for expr in [
            *args.defaults,
            *args.kw_defaults,
            *(a.annotation for a in every if a is not None),
        ]:
            if expr is not None:
                self.visit(expr, scope)

    def visit_function(self, node: _AnyFunction, scope: Scope) -> None:
        for dec in node.decorator_list:
            self.check_decorator(dec)
            self.visit(dec, scope)
        self.visit_defaults(node.args, scope)
        if node.returns is not None:
            self.visit(node.returns, scope)
        method = scope.where == "class"
        self.check_function_name(node, method=method)
        body = self.scope_of(node, self.body_where(node, scope), method=method)
        self.visit_block(node.body, body)

    def scope_of(self, node: _AnyFunction | ast.Lambda, where: Where, *, method: bool) -> Scope:
        makers = {*self.aliases, *(self.kernel_names if where == "jit" else ())}
        return function_scope(node, where, makers=frozenset(makers), method=method)

    def body_where(self, node: _AnyFunction, scope: Scope) -> Where:
        if self.is_jit(node):
            if scope.where != "module":
                self.add(
                    "kernel_body",
                    node,
                    f"`{shown(node.name)}`: define @triton.jit kernels at module level",
                )
            return "jit"
        if scope.where in STRICT_RULES:
            return scope.where
        if scope.where == "class" and node.name == "__init__":
            return "init"
        return "launch" if node.name in self.callbacks else "function"

    def visit_class(self, node: ast.ClassDef, scope: Scope) -> None:
        for dec in node.decorator_list:
            self.check_decorator(dec)
            self.visit(dec, scope)
        for base in node.bases:
            if (dotted_name(base) or "").split(".")[-1] == "Model":
                self.add("reference_use", base, "ModelNew must not inherit from Model")
            path = self.alias_path(base) or ""
            nn_class = path.startswith("torch.nn.") and path.count(".") == 2
            if path.startswith("torch.") and not nn_class:
                self.add(
                    "callback",
                    base,
                    f"subclassing `{shown(path)}`: a tensor subclass intercepts PyTorch's "
                    "calls on its values (candidate classes derive from nn.Module)",
                )
            self.visit(base, scope)
        for keyword in node.keywords:
            self.add("callback", keyword, "class keywords (metaclass=...) run candidate code")
            self.visit(keyword.value, scope)
        self.visit_block(node.body, CLASS_BODY)

    def visit_attribute(self, node: ast.Attribute, scope: Scope) -> None:
        self.check_attribute_name(node)
        writes = not isinstance(node.ctx, ast.Load)
        if writes:
            self.check_write(node, scope)
        path = self.alias_path(node)
        if path is not None:
            inner = node.value
            while isinstance(inner, ast.Attribute):
                self.check_attribute_name(inner)
                inner = inner.value
            if not writes:
                self.judge(node, path, scope)
            return
        if not writes:
            self.check_value_attribute(node, scope)
        self.visit(node.value, scope)

    def visit_name(self, node: ast.Name, scope: Scope, *, called: bool = False) -> None:
        name = node.id
        if name in BANNED_NAMES or refused_dunder(name):
            self.add("introspection", node, f"`{shown(name)}` is not allowed in a candidate")
        if name == "Model":
            self.add(
                "reference_use",
                node,
                "the reference `Model` must not be used, inherited or called: ModelNew "
                "must compute the result with its own kernel",
            )
        if not isinstance(node.ctx, ast.Load) or name in scope.bound:
            return
        if name in self.aliases:
            path = self.aliases[name]
            if is_namespace(path, self.extra_roots):
                self.add(
                    "module_escape",
                    node,
                    f"the module `{shown(path)}` used as a value reaches all it holds: use "
                    "the allowed attributes directly (torch.empty(...), tl.load(...))",
                )
            else:
                self.judge(node, path, scope)
            return
        if name in self.kernel_names and scope.where != "jit":
            self.add(
                "callback",
                node,
                f"`{shown(name)}` used other than launched as {shown(name)}[grid](...): a "
                "kernel's attributes and hooks (add_pre_run_hook, fn, run) run Python during "
                "its launches",
            )
        if name in DYNAMIC_BUILTINS and not called:
            self.add("introspection", node, f"`{name}` must be called directly")
        if scope.where in STRICT_RULES and not called:  # a callee is judged with its call
            kernel_globals = self.kernel_names | self.constants
            problem = name_problem(name, scope, kernel_globals, self.candidate)
            if problem:
                self.add(STRICT_RULES[scope.where], node, problem)

    def visit_call(self, node: ast.Call, scope: Scope) -> None:
        if isinstance(node.func, ast.Name):
            self.visit_name(node.func, scope, called=True)
        else:
            self.visit(node.func, scope)
        for child in [*node.args, *node.keywords]:
            self.visit(child, scope)
        self.check_call(node, scope)

    def visit_subscript(self, node: ast.Subscript, scope: Scope) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.check_write(node, scope)
        kernel = node.value.id if isinstance(node.value, ast.Name) else ""
        if kernel in self.kernel_names:  # kernel[grid]: a launch
            if scope.where in STRICT_RULES:
                self.add(
                    STRICT_RULES[scope.where],
                    node,
                    f"launching `{shown(kernel)}` from a kernel or from a lambda, grid function "
                    "or hook: launch kernels from forward or its helpers",
                )
            self.visit(node.slice, scope)
            return
        self.visit(node.value, scope)
        self.visit(node.slice, scope)

    # ------------------------------------------------------------------ checks

    def judge(self, node: ast.AST, path: str, scope: Scope) -> None:
        """An attribute chain of an imported module (``path`` resolved), read here."""
        if (dotted_name(node) or "").partition(".")[0] in self.refused_imports:
            return
        verdict = judge_chain(path, scope.context, self.extra_roots)
        if verdict is not None:
            self.add(verdict[0], node, verdict[1])
        triton_decorator = path.startswith("triton.") and path[7:] in TRITON_DECORATORS
        if triton_decorator and id(node) not in self.decorators:
            self.add(
                "kernel_body",
                node,
                f"`{path}` is used only as the decorator of a module-level kernel",
            )

    def check_node(self, node: ast.AST, scope: Scope) -> None:
        if isinstance(node, ast.Global | ast.Nonlocal):
            self.add("caching", node, "`global`/`nonlocal` state is not allowed (result caching)")
        if isinstance(node, ast.Yield | ast.YieldFrom | ast.Await):
            self.add(
                "caching",
                node,
                "generators and coroutines keep their state between calls (result caching)",
            )
        if isinstance(node, ast.Try | ast.TryStar) and node.handlers:
            reraises = all(h.body and isinstance(h.body[-1], ast.Raise) for h in node.handlers)
            if not reraises and scope.where not in ("module", "class"):
                self.add(
                    "exception_fallback",
                    node,
                    "try/except in candidate code (a fallback to PyTorch?): let errors "
                    "surface; the kernel must handle every input",
                )
        matmul = isinstance(node, ast.BinOp | ast.AugAssign) and isinstance(node.op, ast.MatMult)
        if matmul and scope.context == "forward":
            self.add("torch_compute", node, "`@` is a PyTorch matmul standing in for the kernel")
        if isinstance(node, ast.Constant) and node.value in LOW_PRECISION_STRINGS:
            self.check_half(node, str(node.value))

    def check_attribute_name(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr in BANNED_ATTRS:
            self.add("introspection", node, f"attribute `.{attr}` is not allowed")
        elif refused_dunder(attr):
            self.add(
                "introspection",
                node,
                f"attribute `.{shown(attr)}`: dunder attributes reach Python's and PyTorch's "
                "internals (__class__, __globals__, __array__, __torch_function__ ...)",
            )
        if attr in LOW_PRECISION:
            self.check_half(node, attr)
        path = self.resolve(node) or ""
        if path.startswith(STREAM_MODULES) and attr in STREAM_ATTRS:
            self.add(
                "stream_trick",
                node,
                f"`{shown(path)}`: no streams, events or graphs; launch on the current stream",
            )

    def check_value_attribute(self, node: ast.Attribute, scope: Scope) -> None:
        """An attribute read of a value (not of a module)."""
        if scope.where in STRICT_RULES:
            problem = attribute_problem(node, scope)
            if problem:
                self.add(STRICT_RULES[scope.where], node, problem)
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in BUILTIN_TYPES - scope.bound:
            self.add(
                "introspection",
                node,
                f"`{owner.id}.{shown(node.attr)}`: unbound builtin methods act on objects out "
                "of the gate's sight (dict.setdefault(d, ...)); call methods on the object",
            )

    def check_decorator(self, dec: ast.expr) -> None:
        dotted = dotted_name(dec.func if isinstance(dec, ast.Call) else dec) or ""
        name = dotted.split(".")[-1]
        if name in CACHE_DECORATORS:
            self.add("caching", dec, f"@{name}: results must not be cached across calls")
        elif dotted.split(".")[0] in self.candidate:
            self.add(
                "caching",
                dec,
                f"@{shown(dotted)}: a decorator of the candidate's own wraps calls out of the "
                "gate's sight (a result cache?); decorate only with triton's, torch.no_grad(), "
                "staticmethod and the like",
            )

    def check_function_name(self, node: _AnyFunction, *, method: bool) -> None:
        if refused_dunder(node.name) or (method and node.name in CALLBACK_METHODS):
            self.add(
                "callback",
                node,
                f"defining `{shown(node.name)}` makes PyTorch or Triton call candidate code on "
                "their own (protocol methods, dunders): a class defines __init__, forward and "
                "helpers",
            )

    def check_call(self, node: ast.Call, scope: Scope) -> None:
        func = node.func
        path = self.alias_path(func)
        method = func.attr if isinstance(func, ast.Attribute) else ""
        if method in FILE_ATTRS and not (path or "").startswith(FILE_CALLS):
            self.add(
                "file_io",
                node,
                f"`.{method}(...)` reads or writes files: candidates must not touch the file "
                "system (no saved or precomputed results)",
            )
        builtin = func.id if isinstance(func, ast.Name) and func.id not in scope.bound else ""
        findings = lookup_findings(node, builtin) + precision_findings(node, path)
        for rule, where, message in findings:
            self.add(rule, where, message)
        if path is not None and path.startswith("triton."):
            for keyword in node.keywords:
                if keyword.arg in CALLBACK_KEYWORDS:
                    self.add(
                        "callback",
                        keyword.value,
                        f"`{keyword.arg}=`: a hook Triton runs around launches, out of the "
                        "runtime guard's sight",
                    )
        launch = isinstance(func, ast.Subscript) and dotted_name(func.value) in self.kernel_names
        if scope.where in STRICT_RULES and not launch:  # a launch is judged as a subscript
            problem = call_problem(node, scope, self.kernel_names, path)
            if problem:
                self.add(STRICT_RULES[scope.where], node, problem)
        elif scope.context == "forward":
            self.check_forward_call(node, path)
        if scope.where == "function":
            self.check_mutation(node, scope)

    def check_forward_call(self, node: ast.Call, path: str | None) -> None:
        """A call in forward, a helper, the module or a class body."""
        func = node.func
        full = path or self.resolve(func)
        if full is not None and self.backend.check_library_call(self, node, full):
            return
        parts = (path or "").split(".")
        nn_class = parts[:2] == ["torch", "nn"] and len(parts) == 3 and parts[2][:1].isupper()
        if nn_class and parts[2] not in NN_ANYWHERE:
            self.add(
                "torch_compute",
                node,
                f"`{path}(...)` outside __init__: PyTorch modules must not do the work",
            )
        if not isinstance(func, ast.Attribute) or path is not None:
            return
        if func.attr in TENSOR_COMPUTE:
            self.add(
                "torch_compute",
                node,
                f"`.{func.attr}()` computes with PyTorch instead of the kernel",
            )
        owner = func.value
        if isinstance(owner, ast.Name) and owner.id == "self" and func.attr in self.submodules():
            self.add(
                "torch_compute",
                node,
                f"`self.{func.attr}(...)` runs a PyTorch module; use its parameters in your "
                "kernel instead",
            )

    def check_mutation(self, node: ast.Call, scope: Scope) -> None:
        """A method call in a forward path that changes its receiver."""
        func = node.func
        if not isinstance(func, ast.Attribute):
            return
        in_place = func.attr.endswith("_") and not func.attr.startswith("__")
        if func.attr not in MUTATING_METHODS and not in_place:
            return
        root = write_root(func.value)
        if (root in self.aliases and root not in scope.bound) or root in scope.fresh:
            return  # module functions are judged as chains
        self.add("caching", node, kept_state(root, scope, f"`.{func.attr}(...)` changes"))

    def check_write(self, target: ast.Attribute | ast.Subscript, scope: Scope) -> None:
        """An assignment, augmented assignment or del of an attribute or item. In forward
        paths it must land in a value made in the call; elsewhere attributes are set on
        ``self`` in ``__init__`` only (anything else patches a module, class or function,
        under whatever name it is reached)."""
        root = write_root(target)
        module = root in self.aliases and root not in scope.bound
        attribute = isinstance(target, ast.Attribute)
        if scope.where == "function" and not module:
            if root not in scope.fresh:
                self.add("caching", target, kept_state(root, scope, "writing into"))
        elif module or (attribute and not (scope.where == "init" and root == scope.receiver)):
            self.add(
                "monkey_patch",
                target,
                f"writing `{shown(dotted_name(target) or str(root))}` patches a module, class or "
                "function (outside forward, attributes are set on self in __init__ only)",
            )

    def check_half(self, node: ast.AST, name: str) -> None:
        if not self.task_uses_half:
            self.add(
                "precision_downgrade",
                node,
                f"`{shown(name)}`: the task computes in full precision; do not downgrade to "
                "fp16/bf16/fp8",
            )

    def submodules(self) -> set[str]:
        """``self.<name>`` attributes holding PyTorch modules (built in ``__init__``)."""
        if self._submodules is None:
            self._submodules = set()
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
                        self._submodules.add(node.targets[0].attr)
        return self._submodules


def check_candidate(
    source: str, *, backend: str = DEFAULT_BACKEND, task_source: str = ""
) -> list[Violation]:
    """The rules ``source`` breaks (empty: it may run; at most MAX_VIOLATIONS, the first by
    line) as a candidate of ``backend`` (a registered name: raises UnknownBackend
    otherwise). ``source`` must parse."""
    tree = parse_module(source, filename="candidate.py")
    task_uses_half = any(word in task_source for word in ("float16", "bfloat16", "half"))
    return _Gate(tree, find_backend(backend), task_uses_half).run()
