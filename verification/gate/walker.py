"""The static reward-hack gate's walker: pure ``ast`` rules a candidate must satisfy before
it runs.

Nothing here imports or executes the candidate. Each broken rule is a :class:`Violation`
with a stable rule id (used in ``VerificationReport.reasons``), the line, and a message
written for the coder; the task's strictness policy
(:mod:`kernelflow.verification.policy`) decides which refuse and which are recorded as
warnings (``gate_findings``). Every part of the module is checked, by where it runs
(:mod:`.scopes`, found from who calls what: :mod:`.context`): module level, class bodies,
decorators and default arguments, ``__init__`` and what only it calls, forward and its
helpers, nested functions, lambdas, kernel bodies. Rules follow data, not names
(docs/verifier.md, "The static gate"): a name is what it refers to, state no call's data
went into may be kept (:mod:`.state`). The rule tables every backend shares are in
:mod:`.rules`; which attributes of the allowed modules may be used is an allow-list
(:mod:`.chains`); launch callbacks get stricter allow-lists still (:mod:`.strict`).

The walker knows no DSL. What a backend adds comes from its
:class:`~kernelflow.verification.backends.Backend` (its imports, its library's glue, what
counts as its kernel) and from the kernel languages it owns or borrows
(:class:`~kernelflow.verification.backends.language.KernelLanguage`: which functions are
kernels, what their bodies may use, which of their values are the host's; Triton's is
:mod:`kernelflow.verification.backends.triton_gate`). The gate is one layer: the runtime
guards in the sandbox (:mod:`kernelflow.verification.child.guards`) back it up.

Rules (docs/verifier.md):

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
  ``range``/``min``/``max``..., ``triton.cdiv``/``next_power_of_2`` (constexpr
  arithmetic); what the host handed in is read only as pointers, scalars, dtypes and tuple
  elements; no kernel defined inside a kernel or a callback.
- ``callback``: code Triton or PyTorch runs during a launch or on its own (every lambda,
  candidate functions passed as values: grids, heuristics, hooks) only computes launch
  sizes (it may read attributes, but call only size methods); no launch hooks, kernel
  attributes, properties or protocol methods (``data_ptr``, ``__torch_function__`` ...);
  no tensor subclasses, defined or made (``as_subclass``, ``Tensor._make_subclass``,
  ``_make_wrapper_subclass``, ``Tensor.__new__``, ``_C.TensorBase``: lazy tensors); a
  kernel, found by scope (:mod:`.kernels`), is used only as launched, chosen into a
  variable that only holds kernels and is only launched, or handed to a function that
  only launches it.
- ``forbidden_import``: only torch, math, typing, the roots of the backend's kernel
  languages (triton, borrowed by every built-in backend) and its extra imports (cupy for
  CuPy) may be imported: no threads, processes, sockets, files, timers, ctypes.
- ``stream_trick``: no CUDA streams, events, graphs (``torch.cuda`` or ``cupy.cuda``).
- ``file_io``: no saving, loading or mapping files (``torch.save``/``load``/``from_file``,
  ``.tofile()``, ``torch.hub``/``onnx``/``jit``/``profiler`` ...), in ``__init__`` too; the
  sandbox's read-only file system stops what this misses.
- ``monkey_patch``: no assigning attributes of imported modules, classes or functions;
  outside forward paths attributes are set on ``self`` in ``__init__`` only (so a class
  reached under another name, ``T = torch.Tensor``, is not patched either).
- ``caching``: in forward paths writes land only in values made in the call (or a
  container made in it), judged by the bindings that reach the name written through
  (:mod:`.flow`): not in arguments, globals, class attributes, closures or their
  aliases and views (``setdefault``, ``append``, ``copy_`` ...), nor in what was put into
  a container (``kept.append(self.buf)``), nor in ``self`` but for values no call's data
  went into (fused weights, a device move) and running buffers never read back where they
  are written (:mod:`.buffers`); no caching decorators or decorators of the
  candidate's own, ``global`` state, generators.
- ``precision_downgrade`` (a choice of the policy's): no conversion to fp16/bf16/fp8
  (names, imported aliases, strings; not a comparison of dtypes, not in code that never
  runs) when the task itself never uses them; no dtypes built at run time; no tf32
  ``tl.dot``, which is Triton's default for fp32 when no ``input_precision`` is given.
- ``module_code``: no bare calls at module level or in class bodies.
"""

from __future__ import annotations

import ast

from kernelflow.common.syntax import parse_module
from kernelflow.verification.backends.base import Backend, dotted_name, import_bindings
from kernelflow.verification.backends.language import KernelLanguage
from kernelflow.verification.backends.registry import DEFAULT_BACKEND, backend_names
from kernelflow.verification.backends.registry import backend as find_backend
from kernelflow.verification.gate.buffers import running_updates
from kernelflow.verification.gate.chains import (
    is_namespace,
    judge_import,
    refused_dunder,
    shown,
)
from kernelflow.verification.gate.checks import Checks
from kernelflow.verification.gate.context import (
    callbacks,
    dead_functions,
    init_functions,
)
from kernelflow.verification.gate.feedback import Violation, arranged, bounded
from kernelflow.verification.gate.kernels import kernel_uses
from kernelflow.verification.gate.rules import (
    AUTOGRAD_FUNCTION,
    BANNED_NAMES,
    DYNAMIC_BUILTINS,
    LOW_PRECISION,
)
from kernelflow.verification.gate.scopes import (
    CLASS_BODY,
    MODULE,
    Scope,
    Where,
    function_scope,
)
from kernelflow.verification.gate.state import StateReads
from kernelflow.verification.gate.strict import (
    STRICT_RULES,
    name_problem,
    node_problem,
)
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.verification.policy import policy as find_policy

__all__ = ["MAX_VIOLATIONS", "Violation", "check_candidate", "gate_findings"]

MAX_VIOLATIONS = 20  # reported per candidate (root cause first, repeats folded: feedback)
_AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef


def _is_constant(value: ast.AST | None, languages: list[KernelLanguage]) -> bool:
    """A literal, or one wrapped by a kernel language (tl.constexpr(literal)): module
    constants a kernel may read."""
    if isinstance(value, ast.UnaryOp):
        value = value.operand
    if isinstance(value, ast.Call):
        name = dotted_name(value.func) or ""
        if any(language.is_constant_wrapper(name) for language in languages):
            return all(_is_constant(arg, languages) for arg in value.args)
    return isinstance(value, ast.Constant)


class _Gate(Checks):
    """One candidate module under the gate's rules (a ``CandidateModule`` to its backend)."""

    def __init__(
        self,
        tree: ast.Module,
        lines: list[str],
        backend: Backend,
        languages: dict[str, KernelLanguage],
        task_uses_half: bool,
    ) -> None:
        self.tree = tree
        self.lines = lines
        self.calls_of: dict[int, ast.Call] = {}  # ids of called expressions -> their call
        self.backward: set[int] = set()  # ids of custom autograd functions' backward
        self.backend = backend
        self.extra_roots = backend.extra_imports
        self.languages = languages
        self.task_uses_half = task_uses_half
        self.out: list[Violation] = []
        self.aliases: dict[str, str] = {}  # local name -> imported path
        self.jit_kernels: dict[str, ast.FunctionDef] = {}  # every kernel, by name
        self.kernel_names: set[str] = set()  # every kernel function
        self.jit_ids: set[int] = set()  # ids of every kernel function's node
        self.dsl_of: dict[int, str] = {}  # kernel functions' ids -> their language's backend
        self.launched: set[str] = set()  # kernels launched: kernel[grid](...), self.kernel[...]
        # Where kernels are named, held and launched, by scope (kernels): ids of the
        # launches (kernel[grid], a holder's), of the kernel names a holder takes, and of
        # the attributes that are kernels.
        self.launch_sites: set[int] = set()
        self.kernel_named: set[int] = set()
        self.kernel_attributes: set[int] = set()
        # Per kernel (by id): its names that may hold host objects; and the kernels that
        # may return a host value they are given (host).
        self.host: dict[int, frozenset[str]] = {}
        self.passing: frozenset[str] = frozenset()
        self.candidate: set[str] = set()  # the module's own functions, methods and classes
        self.callbacks: set[str] = set()  # its functions used as values (grids, hooks ...)
        # Ids of the functions that run only while the module is built, or never.
        self.init_code: set[int] = set()
        # Ids of the methods whose first argument is made for each call (an autograd
        # function's ctx).
        self.per_call_receiver: set[int] = set()
        self.no_conversion: set[int] = set()  # ids of nodes where a dtype converts nothing
        self.assigned: dict[int, ast.expr] = {}  # assignment targets' ids -> the value
        self.state: dict[int, StateReads] = {}  # methods' ids -> their class's state use
        self.running: set[int] = set()  # ids of the updates of running buffers (buffers)
        self.constants: set[str] = set()  # module-level names bound to literals
        self.decorators: set[int] = set()  # ids of decorator expressions and their callees
        self.called: set[int] = set()  # ids of expressions called directly
        self.refused_imports: set[str] = set()  # aliases whose import is reported already
        self._submodules: set[str] | None = None

    def kernel_dsl(self, node: ast.AST) -> str | None:
        """The backend whose kernel language ``node`` is a kernel function of (decorated as
        one, under any alias); None when it is none."""
        if not isinstance(node, _AnyFunction):
            return None
        for dec in node.decorator_list:
            path = self.resolve(dec.func if isinstance(dec, ast.Call) else dec) or ""
            for dsl, language in self.languages.items():
                if language.is_kernel_decorator(path):
                    return dsl
        return None

    def run(self) -> list[Violation]:
        self.collect()
        self.visit_block(self.tree.body, MODULE)
        self.backend.check_kernels(self)
        return arranged(self.out)

    def collect(self) -> None:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.collect_import(node)
        kernels: dict[str, dict[str, list[_AnyFunction]]] = {}  # by language, by name
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Call):
                self.called.add(id(node.func))
                self.calls_of[id(node.func)] = node
            elif isinstance(node, _AnyFunction | ast.ClassDef):
                for dec in node.decorator_list:
                    self.decorators.update({id(dec), id(getattr(dec, "func", dec))})
                dsl = self.kernel_dsl(node)
                (self.kernel_names if dsl is not None else self.candidate).add(node.name)
                if dsl is not None:
                    by_name = kernels.setdefault(dsl, {})
                    by_name.setdefault(node.name, []).append(node)  # type: ignore[arg-type]
                    self.jit_ids.add(id(node))
                    self.dsl_of[id(node)] = dsl
                    if isinstance(node, ast.FunctionDef):
                        self.jit_kernels[node.name] = node
        uses = kernel_uses(self.tree, self.jit_ids)
        self.launch_sites, self.kernel_named = uses.launches, uses.named
        self.kernel_attributes = uses.attributes
        self.launched = uses.launched & self.kernel_names
        passing: set[str] = set()
        for dsl, by_name in kernels.items():
            host, passes = self.languages[dsl].host_names(
                by_name, self.launched, frozenset(self.aliases)
            )
            self.host.update(host)
            passing |= passes
        self.passing = frozenset(passing)
        languages = list(self.languages.values())
        for node in self.tree.body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and _is_constant(node.value, languages):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                self.constants.update(t.id for t in targets if isinstance(t, ast.Name))
        functions = {
            node.name
            for node in ast.walk(self.tree)
            if isinstance(node, _AnyFunction) and node.name not in self.kernel_names
        }
        self.callbacks = callbacks(self.tree, self.called, functions)
        called_back = {
            id(node)
            for node in ast.walk(self.tree)
            if isinstance(node, _AnyFunction) and node.name in self.callbacks
        }
        self.init_code = init_functions(self.tree, self.jit_ids | called_back)
        # A low-precision dtype compared with (`x.dtype == torch.float16`) or named in code
        # that never runs (a get_inputs copied from the task) converts nothing.
        dead = dead_functions(self.tree, self.jit_ids | called_back)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Compare):
                self.no_conversion.update(map(id, ast.walk(node)))
            elif id(node) in dead:  # its body (decorators and defaults run where defined)
                for statement in node.body:  # type: ignore[attr-defined]
                    self.no_conversion.update(map(id, ast.walk(statement)))
        self.collect_state()

    def collect_state(self) -> None:
        """What forward paths may write into their module's state (state)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    parts = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
                    self.assigned.update((id(part), node.value) for part in parts)
        for cls in self.tree.body:
            if not isinstance(cls, ast.ClassDef):
                continue
            methods = [m for m in cls.body if isinstance(m, _AnyFunction)]
            forward = {id(m) for m in methods} - self.init_code - self.jit_ids
            state = StateReads(methods, forward)
            self.state.update((id(m), state) for m in methods)
        self.running = running_updates(
            self.tree, init_code=self.init_code, jit_ids=self.jit_ids, resolve=self.resolve
        )

    def collect_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom) and node.level:
            self.add("forbidden_import", node, "relative imports are not allowed")
            return
        for (local, path, imported), alias in zip(import_bindings(node), node.names, strict=True):
            self.aliases[local] = path
            verdict = judge_import(
                imported, self.extra_roots, self.backend.glue_paths, list(self.languages.values())
            )
            if verdict is not None:
                self.add_refusal(verdict, node, imported)
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
                    "module-level calls run once at import, out of every check (precomputed "
                    "results?)",
                )
            self.visit(stmt, scope)

    def visit(self, node: ast.AST, scope: Scope) -> None:
        if scope.where in STRICT_RULES:
            problem = node_problem(node, scope, self.passing, self.language_of(scope))
            if problem:
                self.add(STRICT_RULES[scope.where], node, problem)
        if isinstance(node, _AnyFunction):
            self.visit_function(node, scope)
        elif isinstance(node, ast.Lambda):
            self.visit_defaults(node.args, scope)
            where: Where = "jit" if scope.where == "jit" else "launch"
            self.visit(node.body, self.scope_of(node, where, scope, method=False))
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
        body = self.scope_of(node, self.body_where(node, scope), scope, method=method)
        self.visit_block(node.body, body)

    def scope_of(
        self, node: _AnyFunction | ast.Lambda, where: Where, outer: Scope, *, method: bool
    ) -> Scope:
        """The scope of ``node``'s body, which runs ``where``, defined in ``outer``."""
        makers = {*self.aliases, *(self.kernel_names if where == "jit" else ())}
        closure = outer.where not in ("module", "class")
        args = [*node.args.posonlyargs, *node.args.args]
        per_call = id(node) in self.per_call_receiver and args
        dsl = self.dsl_of.get(id(node), outer.dsl) if where == "jit" else ""
        return function_scope(
            node,
            where,
            makers=frozenset(makers),
            method=method,
            fresh_params=frozenset({args[0].arg} if per_call else ()),
            enclosing=outer.bound | outer.enclosing if closure else frozenset(),
            host=self.host.get(id(node), frozenset()),
            dsl=dsl,
        )

    def body_where(self, node: _AnyFunction, scope: Scope) -> Where:
        dsl = self.kernel_dsl(node)
        if dsl is not None:
            if scope.where in STRICT_RULES:
                self.add(
                    "kernel_body",
                    node,
                    f"`{shown(node.name)}`: a {self.languages[dsl].kernel_title} defined "
                    "inside a kernel or a launch callback",
                    f"define `{shown(node.name)}` at module level and call it from the kernel "
                    "(or launch it from forward)",
                )
            return "jit"
        if scope.where in STRICT_RULES:
            return scope.where
        if node.name in self.callbacks:
            return "launch"
        return "init" if id(node) in self.init_code else "function"

    def visit_class(self, node: ast.ClassDef, scope: Scope) -> None:
        for dec in node.decorator_list:
            self.check_decorator(dec)
            self.visit(dec, scope)
        for base in node.bases:
            if (dotted_name(base) or "").split(".")[-1] == "Model":
                module = self.spelled("torch.nn.Module")
                self.add(
                    "reference_use",
                    base,
                    "ModelNew must not inherit from Model: the reference would compute",
                    f"replace `{node.name}({ast.unparse(base)})` with `{node.name}({module})` "
                    "and compute the result with your own kernel",
                )
            path = self.alias_path(base) or ""
            if path == AUTOGRAD_FUNCTION:
                # A custom autograd function around a kernel: each call gets a new ctx.
                self.per_call_receiver.update(
                    id(item) for item in node.body if isinstance(item, _AnyFunction)
                )
                self.backward.update(
                    id(item)
                    for item in node.body
                    if isinstance(item, _AnyFunction) and item.name == "backward"
                )
                continue  # the one class of torch.autograd a candidate may name
            nn_class = path.startswith("torch.nn.") and path.count(".") == 2
            if path.startswith("torch.") and not nn_class:
                self.add(
                    "callback",
                    base,
                    f"subclassing `{shown(path)}`: a tensor subclass intercepts PyTorch's "
                    "calls on its values",
                    "derive candidate classes from torch.nn.Module (or "
                    "torch.autograd.Function) and return plain tensors",
                )
            self.visit(base, scope)
        for keyword in node.keywords:
            self.add(
                "callback",
                keyword,
                "class keywords (metaclass=...) run candidate code when the class is made",
                "drop the keyword: `class ModelNew(torch.nn.Module):`",
            )
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
            if id(node) in self.kernel_attributes and scope.where != "jit":
                self.kernel_as_value(node, node.attr)
        self.visit(node.value, scope)

    def kernel_as_value(self, node: ast.AST, name: str) -> None:
        self.add(
            "callback",
            node,
            f"`{shown(name)}` used other than launched: a kernel's attributes and hooks "
            "(add_pre_run_hook, fn, run) run Python during its launches",
            f"launch it as `{shown(name)}[grid](...)`, or pass it only to a helper of yours "
            "that launches it",
        )

    def visit_name(self, node: ast.Name, scope: Scope, *, called: bool = False) -> None:
        name = node.id
        if (name in BANNED_NAMES and not scope.shadows(name)) or refused_dunder(name):
            self.add(
                "introspection",
                node,
                f"`{shown(name)}` reaches the interpreter (dynamic code, frames, builtins, files)",
            )
        if name == "Model":
            self.add(
                "reference_use",
                node,
                "the reference `Model` must not be used, inherited or called: ModelNew "
                "must compute the result with its own kernel",
            )
        if not isinstance(node.ctx, ast.Load) or scope.shadows(name):
            return
        if name in self.aliases:
            path = self.aliases[name]
            if is_namespace(path, self.extra_roots, list(self.languages.values())):
                self.add(
                    "module_escape",
                    node,
                    f"the module `{shown(path)}` used as a value reaches all it holds",
                    f"name the attributes you use directly: `{shown(name)}.empty(...)`, "
                    "`tl.load(...)`",
                )
            else:
                self.judge(node, path, scope)
            return
        if name in self.kernel_names and scope.where != "jit" and id(node) not in self.kernel_named:
            self.kernel_as_value(node, name)
        if name in DYNAMIC_BUILTINS and not called:
            self.add(
                "introspection",
                node,
                f"`{name}` used as a value looks attributes or types up out of sight",
                f"call it directly with a literal name, or write obj.attr ({name}(obj, ...))",
            )
        if scope.where in STRICT_RULES and not called:  # a callee is judged with its call
            kernel_globals = self.kernel_names | self.constants
            kernel = self.language_of(scope)
            problem = name_problem(name, scope, kernel_globals, self.candidate, kernel)
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
        if id(node) in self.launch_sites:  # kernel[grid], self.kernel[grid], a holder's
            kernel = launched_name(node.value)
            if scope.where in STRICT_RULES:
                self.add(
                    STRICT_RULES[scope.where],
                    node,
                    f"launching `{shown(kernel)}` from a kernel or from a lambda, grid function "
                    "or hook",
                    "launch kernels from forward or its helpers; inside a kernel call a "
                    "@triton.jit helper as a plain function",
                )
            if isinstance(node.value, ast.Attribute):
                self.visit(node.value.value, scope)  # the class or instance holding it
            self.visit(node.slice, scope)
            return
        self.visit(node.value, scope)
        self.visit(node.slice, scope)


def launched_name(node: ast.AST) -> str:
    """How a launch ``node[grid](...)`` names its kernel (or the holder of one): a name
    (``kernel``), or an attribute of the class or instance defining it (``self.kernel``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ast.unparse(node)


def gate_findings(
    source: str,
    *,
    backend: str = DEFAULT_BACKEND,
    task_source: str = "",
    policy: str = DEFAULT_POLICY,
) -> tuple[list[Violation], list[Violation]]:
    """What the gate finds in ``source`` as a candidate of ``backend`` (a registered name:
    raises UnknownBackend otherwise) under ``policy`` (raises UnknownPolicy): the rules
    that refuse it, and the ones the policy records as warnings (at most MAX_VIOLATIONS
    each, root cause first, repeats folded: docs/verifier.md "Feedback that teaches").
    ``source`` must parse."""
    judged_by = find_policy(policy)
    tree = parse_module(source, filename="candidate.py")
    task_uses_half = any(word in task_source for word in ("float16", "bfloat16", "half"))
    judge = find_backend(backend)
    for name in backend_names():  # a candidate plainly written for another backend
        foreign = find_backend(name).foreign_kernel(tree, judge)
        if foreign is not None:  # every rule would be noise beside this
            line = source.splitlines()[foreign[0] - 1].strip() if foreign[0] else ""
            return [Violation("no_kernel", foreign[0], foreign[1], line, foreign[2])], []
    languages = {
        dsl.name: language
        for dsl in [judge, *map(find_backend, judge.borrows)]
        if (language := dsl.kernel_language()) is not None
    }
    found = _Gate(tree, source.splitlines(), judge, languages, task_uses_half).run()
    refusals = [v for v in found if judged_by.refuses(v.rule)]
    warnings = [v for v in found if not judged_by.refuses(v.rule)]
    return bounded(refusals, MAX_VIOLATIONS), bounded(warnings, MAX_VIOLATIONS)


def check_candidate(
    source: str,
    *,
    backend: str = DEFAULT_BACKEND,
    task_source: str = "",
    policy: str = DEFAULT_POLICY,
) -> list[Violation]:
    """The rules ``source`` breaks that refuse it under ``policy`` (empty: it may run);
    see :func:`gate_findings`."""
    return gate_findings(source, backend=backend, task_source=task_source, policy=policy)[0]
