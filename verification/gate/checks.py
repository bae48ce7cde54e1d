"""The gate's checks of single nodes (:mod:`.walker` walks the module and calls them): an
imported module's attribute chain, a decorator, a function's name, a call, a write, a
precision downgrade. :class:`Checks` is the walker's base: it holds what the walk
collected about the module (the attributes declared below) and records violations
through ``add``.
"""

from __future__ import annotations

import ast
import re

from kernelflow.verification.backends.base import Backend, dotted_name
from kernelflow.verification.backends.language import Finding, KernelLanguage, Problem, Refusal
from kernelflow.verification.gate.calls import lookup_findings, precision_findings
from kernelflow.verification.gate.chains import judge_chain, refused_dunder, shown
from kernelflow.verification.gate.feedback import RULE_ADVICE, Violation, replacement_text
from kernelflow.verification.gate.installed import closest, exists, version
from kernelflow.verification.gate.rules import (
    BANNED_ATTRS,
    BUILTIN_TYPES,
    CACHE_DECORATORS,
    CALLBACK_METHODS,
    FILE_ATTRS,
    FILE_CALLS,
    LOW_PRECISION,
    LOW_PRECISION_STRINGS,
    MUTATING_METHODS,
    NN_ANYWHERE,
    STREAM_ATTRS,
    STREAM_MODULES,
    TENSOR_COMPUTE,
    TENSOR_SUBCLASS_MAKERS,
)
from kernelflow.verification.gate.scopes import Scope, kept_state, root_name, write_root
from kernelflow.verification.gate.state import StateReads, state_write_problem
from kernelflow.verification.gate.strict import (
    STRICT_RULES,
    attribute_problem,
    call_problem,
)

__all__ = ["Checks", "Violation"]

_AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef
# Packages whose refused names are looked up in the installed package (installed); a
# kernel language looks up its own (triton: backends.triton_names).
_LOOKED_UP = ("torch", "math")
# The one literal substitution a finding's advice may say (gate.feedback).
_DIRECTIVE = re.compile(r"replace `([^`]+)` with `[^`]+`")


class Checks:
    """The checks; the walker that subclasses it fills these in before it walks."""

    tree: ast.Module
    lines: list[str]  # the candidate's source, line by line
    backend: Backend
    extra_roots: tuple[str, ...]
    # The kernel languages a candidate may write (the backend's and those it borrows), by
    # the name of the backend owning each.
    languages: dict[str, KernelLanguage]
    task_uses_half: bool
    aliases: dict[str, str]  # local name -> imported path
    refused_imports: set[str]  # aliases whose import is reported already
    kernel_names: set[str]  # every kernel function (of any of the languages)
    candidate: set[str]  # the module's own functions, methods and classes
    decorators: set[int]  # ids of decorator expressions and their callees
    called: set[int]  # ids of expressions called directly
    assigned: dict[int, ast.expr]  # assignment targets' ids -> the value
    state: dict[int, StateReads]  # methods' ids -> their class's state use
    running: set[int]  # ids of the updates of running buffers forward may make (buffers)
    no_conversion: set[int]  # ids of nodes where a low-precision dtype converts nothing
    _submodules: set[str] | None
    out: list[Violation]
    # What a backend's hooks read (kernelflow.verification.backends.CandidateModule).
    jit_kernels: dict[str, ast.FunctionDef]  # every kernel, by name
    jit_ids: set[int]  # ids of every kernel function's node
    launched: set[str]  # kernels launched: kernel[grid](...), self.kernel[...]
    launch_sites: set[int]  # ids of the subscripts that launch a kernel (kernels)
    calls_of: dict[int, ast.Call]  # ids of called expressions -> their call
    backward: set[int]  # ids of the backward methods of custom autograd functions

    def language_of(self, scope: Scope) -> KernelLanguage | None:
        """The language of the kernel body ``scope`` is (None outside kernels)."""
        return self.languages.get(scope.dsl) if scope.where == "jit" else None

    def functions(self) -> list[tuple[_AnyFunction, bool]]:
        """Every non-kernel function, with whether it is an ``__init__``."""
        return [
            (node, node.name == "__init__")
            for node in ast.walk(self.tree)
            if isinstance(node, _AnyFunction) and id(node) not in self.jit_ids
        ]

    # ------------------------------------------------------------------ passes

    def add(
        self,
        rule: str,
        node: ast.AST,
        message: str | Problem,
        instead: str = "",
        *,
        found: str | None = None,
        missing: bool = False,
        place: str = "",
    ) -> None:
        """Record a broken rule at ``node``'s line: why (``message``, or a check's
        Problem), what to write instead ("": the rule's advice) and what was found (the
        code on that line unless given)."""
        why = message
        if isinstance(message, Problem):
            why, instead = message.message, message.instead or instead
        line = getattr(node, "lineno", 0)
        if found is None:
            found = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        instead = _DIRECTIVE.sub(lambda m: self.as_written(m, node), instead)
        self.out.append(Violation(rule, line, str(why), shown(found), instead, (), missing, place))

    def as_written(self, directive: re.Match[str], node: ast.AST) -> str:
        """A ``replace `X` with `Y``` directive whose X is code as ``ast.unparse`` writes
        it, with X as the candidate wrote it (its quotes, its spacing) where a node of
        ``node``'s lines unparses to it."""
        written = directive.group(1)
        if written in "\n".join(self.lines):
            return directive.group(0)
        try:
            wanted = ast.unparse(ast.parse(written, mode="eval").body)
        except SyntaxError:
            return directive.group(0)
        first = getattr(node, "lineno", 0)
        last = getattr(node, "end_lineno", first) or first
        source = "\n".join(self.lines)
        for candidate in ast.walk(node if first else self.tree):
            if not isinstance(candidate, ast.expr) or not first <= candidate.lineno <= last:
                continue
            if ast.unparse(candidate) == wanted:
                segment = ast.get_source_segment(source, candidate)
                if segment and "\n" not in segment:
                    return directive.group(0).replace(f"`{written}`", f"`{segment}`", 1)
        return directive.group(0)

    def add_refusal(self, verdict: Refusal, node: ast.AST, path: str) -> None:
        """Record the refusal of the chain ``path`` (resolved) at ``node``, the chain
        named as the candidate wrote it, its replacement spelled as the module imports it
        (an idiom with ``{x}``: the call's argument put in)."""
        message = verdict.message
        if dotted_name(node):
            message = message.replace(f"`{shown(path)}`", f"`{shown(dotted_name(node) or '')}`")
        instead = verdict.instead
        if (
            verdict.replacement
            and isinstance(node, ast.Import)
            and "{x}" not in verdict.replacement
        ):
            direct = replacement_text(path, verdict.replacement)  # import a.b as c
            instead = f"{direct} ({instead})" if instead else direct
        elif verdict.replacement and isinstance(node, ast.Import | ast.ImportFrom):
            what = verdict.replacement.format(x="x")
            use = f"write `{what}`" if "{x}" in verdict.replacement else f"use `{what}`"
            instead = f"drop the import and {use}" + (f" ({instead})" if instead else "")
        elif verdict.replacement:
            written = dotted_name(node) or ""
            spelled = self.spelled(verdict.replacement)
            call = self.calls_of.get(id(node))
            if "{x}" in spelled:
                if call is not None and len(call.args) == 1 and not call.keywords:
                    argument = ast.unparse(call.args[0])
                    simple = isinstance(call.args[0], ast.Name | ast.Constant | ast.Attribute)
                    spelled = spelled.format(x=argument if simple else f"({argument})")
                    written = ast.unparse(call)
                else:
                    spelled = spelled.format(x="x")
            direct = replacement_text(shown(written), shown(spelled))
            instead = f"{direct} ({instead})" if instead else direct
        self.add(verdict.rule, node, message, instead, missing=verdict.missing)

    def spelled(self, text: str) -> str:
        """``text`` (resolved paths, or an idiom written with ``tl.``) with the longest
        imported path each starts with written as the module's alias for it."""
        by_path = sorted(
            ((path, local) for local, path in self.aliases.items() if "." not in local),
            key=lambda item: -len(item[0]),
        )
        language = next((local for path, local in by_path if path == "triton.language"), "")
        if language and "{x}" in text:
            return text.replace("tl.", f"{language}.")
        for path, local in by_path:
            if text == path or text.startswith(path + "."):
                return local + text[len(path) :]
        return text

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

    def judge(self, node: ast.AST, path: str, scope: Scope) -> None:
        """An attribute chain of an imported module (``path`` resolved), read here."""
        if (dotted_name(node) or "").partition(".")[0] in self.refused_imports:
            return
        if path in self.backend.glue_paths:
            if scope.where not in ("module", "class", "init"):
                self.add(
                    "file_io",
                    node,
                    f"`{shown(path)}` builds files each time it runs",
                    "build once, at module level or in __init__, and keep the module",
                )
            return
        kernel = self.language_of(scope)
        languages = list(self.languages.values())
        verdict = judge_chain(path, scope.context, self.extra_roots, languages, kernel)
        if verdict is not None and scope.function in self.backward:
            verdict = verdict._replace(
                message=f"`{shown(path)}` in the backward of a custom autograd function: the "
                "verifier never runs it (forward runs under torch.no_grad), so, like "
                "__init__, it may use only what prepares parameters",
                instead="leave backward out (the verifier checks forward only), or compute "
                "the gradient with a kernel",
            )
        if verdict is not None and not verdict.missing and path.split(".")[0] in _LOOKED_UP:
            verdict = _if_missing(verdict, path)
        if verdict is not None:
            self.add_refusal(verdict, node, path)
        decorator = any(language.decorator_only(path) for language in languages)
        if decorator and id(node) not in self.decorators:
            self.add(
                "kernel_body",
                node,
                f"`{path}` is used only as the decorator of a module-level kernel",
                f"decorate a module-level function with @{shown(dotted_name(node) or path)}"
                " and launch it as kernel[grid](...)",
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
            if not reraises:
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
        if attr in BANNED_ATTRS and not self.backend.holds_kernel(self, node):
            self.add(
                "introspection",
                node,
                f"attribute `.{attr}` reaches frames, tracing, the module table, hooks, "
                "PyTorch's internals or numpy (compute no runtime guard sees)",
                "compute with torch tensors and your kernel; read only public tensor "
                "attributes (shape, dtype, device, stride())",
            )
        elif refused_dunder(attr):
            self.add(
                "introspection",
                node,
                f"attribute `.{shown(attr)}`: dunder attributes reach Python's and PyTorch's "
                "internals (__class__, __globals__, __array__, __torch_function__ ...)",
                "use the public API: x.dtype, isinstance(x, torch.Tensor), super().__init__()",
            )
        if attr in LOW_PRECISION:
            self.check_half(node, attr)
        path = self.resolve(node) or ""
        if attr in TENSOR_SUBCLASS_MAKERS or (attr == "__new__" and path.startswith("torch.")):
            self.add(
                "callback",
                node,
                f"`.{shown(attr)}` makes a tensor subclass (a lazy tensor): PyTorch calls its "
                "class's code on every operation, out of every check's sight (KernelBench's "
                "lazy_eval)",
                "return plain tensors made with torch.empty and the like, filled by your kernel",
            )
        if path.startswith(STREAM_MODULES) and attr in STREAM_ATTRS:
            self.add(
                "stream_trick",
                node,
                f"`{shown(path)}`: no streams, events or graphs; launch on the current stream",
            )

    def check_value_attribute(self, node: ast.Attribute, scope: Scope) -> None:
        """An attribute read of a value (not of a module)."""
        if scope.where in STRICT_RULES:
            kernel = self.language_of(scope)
            problem = attribute_problem(node, scope, kernel, called=id(node) in self.called)
            if problem:
                self.add(STRICT_RULES[scope.where], node, problem)
        owner = node.value
        if (
            isinstance(owner, ast.Name)
            and owner.id in BUILTIN_TYPES
            and not scope.shadows(owner.id)
        ):
            self.add(
                "introspection",
                node,
                f"`{owner.id}.{shown(node.attr)}`: unbound builtin methods act on objects out "
                "of the gate's sight (dict.setdefault(d, ...))",
                f"call the method on the object itself: `d.{shown(node.attr)}(...)`",
            )

    def check_decorator(self, dec: ast.expr) -> None:
        dotted = dotted_name(dec.func if isinstance(dec, ast.Call) else dec) or ""
        name = dotted.split(".")[-1]
        if name in CACHE_DECORATORS:
            self.add(
                "caching",
                dec,
                f"@{name}: results must not be cached across calls",
                f"remove @{name}: compute the result from the inputs in every call",
            )
        elif dotted == "property":
            self.add(
                "callback",
                dec,
                "@property runs candidate code whenever the attribute is read (in launch "
                "callbacks too)",
                "set a plain attribute in __init__ (self.name = value), or call a method",
            )
        elif dotted.split(".")[0] in self.candidate:
            self.add(
                "caching",
                dec,
                f"@{shown(dotted)}: a decorator of the candidate's own wraps calls out of the "
                "gate's sight (a result cache?)",
                f"remove @{shown(dotted)} and call what it adds from the function itself; "
                "decorate only with triton's, torch.no_grad(), staticmethod and the like",
            )

    def check_function_name(self, node: _AnyFunction, *, method: bool) -> None:
        if refused_dunder(node.name) or (method and node.name in CALLBACK_METHODS):
            self.add(
                "callback",
                node,
                f"defining `{shown(node.name)}` makes PyTorch or Triton call candidate code on "
                "their own (protocol methods, dunders)",
                f"give `{shown(node.name)}` a name of your own and call it from forward; a "
                "class defines __init__, forward and helpers",
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
        builtin = func.id if isinstance(func, ast.Name) and not scope.shadows(func.id) else ""
        full_precision = not self.task_uses_half
        languages = list(self.languages.values())
        constructors = frozenset(c for lang in languages for c in lang.dtype_constructors)
        findings: list[Finding] = lookup_findings(node, builtin)
        findings += precision_findings(node, path, constructors)
        for language in languages:
            findings += language.call_findings(node, path, full_precision)
        for rule, where, message, instead in findings:
            self.add(rule, where, message, instead)
        launch = id(func) in self.launch_sites
        if scope.where in STRICT_RULES and not launch:  # a launch is judged as a subscript
            kernel = self.language_of(scope)
            problem = call_problem(node, scope, self.kernel_names, path, kernel, languages)
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
                "build the module in __init__ for its parameters, and compute with them in "
                "your kernel",
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
                f"`self.{func.attr}(...)` runs a PyTorch module",
                f"pass its parameters (self.{func.attr}.weight, .bias) to your kernel and "
                "compute with them there",
            )

    def check_mutation(self, node: ast.Call, scope: Scope) -> None:
        """A method call in a forward path that changes its receiver."""
        func = node.func
        if not isinstance(func, ast.Attribute):
            return
        in_place = func.attr.endswith("_") and not func.attr.startswith("__")
        if (func.attr not in MUTATING_METHODS and not in_place) or id(node) in self.running:
            return
        root = write_root(func.value)
        if (root in self.aliases and root not in scope.bound) or scope.made_here(
            root_name(func.value)
        ):
            return  # module functions are judged as chains
        own_container = isinstance(func.value, ast.Name) and scope.container_here(func.value)
        if own_container and func.attr in MUTATING_METHODS:
            return  # a container made in the call, changed itself (perm.pop(d))
        self.add(
            "caching",
            node,
            kept_state(root, scope, f"`.{func.attr}(...)` changes"),
            "change only what the call made (a local list, a tensor from torch.empty); keep "
            "the module's state as __init__ set it",
        )

    def check_write(self, target: ast.Attribute | ast.Subscript, scope: Scope) -> None:
        """An assignment, augmented assignment or del of an attribute or item. In forward
        paths it must land in a value made in the call; elsewhere attributes are set on
        ``self`` in ``__init__`` only (anything else patches a module, class or function,
        under whatever name it is reached)."""
        root = write_root(target)
        module = root in self.aliases and root not in scope.bound
        attribute = isinstance(target, ast.Attribute)
        if scope.where == "function" and not module:
            if id(target) in self.running:
                return  # a running statistic, never read back (buffers)
            # An item or attribute of a container or object made in the call (shape[d] = 1,
            # ctx.saved = x) is the call's too, whatever it holds.
            own = target.value if isinstance(target.value, ast.Name) else None
            if scope.made_here(root_name(target)) or scope.container_here(own):
                return
            why = kept_state(root, scope, "writing into")
            if root == scope.receiver and isinstance(target, ast.Attribute):
                state = self.state.get(scope.function)
                problem = (
                    state_write_problem(
                        target, self.assigned.get(id(target)), root, scope.tainted, state
                    )
                    if state is not None
                    else "a method outside a class"
                )
                if problem is None:
                    return  # a value no call's data went into (state)
                why = f"writing into `{root}` in forward: {problem} (result caching)"
            self.add("caching", target, why)
        elif module or (attribute and not (scope.where == "init" and root == scope.receiver)):
            self.add(
                "monkey_patch",
                target,
                f"writing `{shown(dotted_name(target) or str(root))}` patches a module, class or "
                "function (outside forward, attributes are set on self in __init__ only)",
            )

    def check_half(self, node: ast.AST, name: str) -> None:
        if not self.task_uses_half and id(node) not in self.no_conversion:
            self.add(
                "precision_downgrade",
                node,
                f"`{shown(name)}`: the task computes in full precision (fp16/bf16/fp8 round "
                "its inputs and results)",
                _full_precision(node, self.calls_of.get(id(node))),
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


def _full_precision(node: ast.AST, call: ast.Call | None) -> str:
    """What to write instead of a low-precision dtype at ``node`` (``call``: the call it
    is the callee of): the fp32 conversion for a method (``x.half()``), the fp32 dtype
    of the same module for a name (``torch.float16``, ``tl.bfloat16``)."""
    if not isinstance(node, ast.Attribute):
        return ""
    written = ast.unparse(node)
    if call is not None and not call.args and not call.keywords:
        return replacement_text(
            shown(ast.unparse(call)), f"{shown(ast.unparse(node.value))}.float()"
        )
    if call is None and isinstance(node.value, ast.Name | ast.Attribute):
        return replacement_text(shown(written), f"{shown(ast.unparse(node.value))}.float32")
    return ""


def _if_missing(verdict: Refusal, path: str) -> Refusal:
    """``verdict`` said of a name the installed package does not have: that it does not
    exist (with the package's version), and the closest name it has."""
    if exists(path) is not False:
        return verdict
    root = path.split(".")[0]
    near = closest(path)
    advice = verdict.instead or RULE_ADVICE[verdict.rule]
    return verdict._replace(
        message=f"`{shown(path)}` does not exist in the installed {root} {version(root)}".rstrip(),
        instead=(f"the installed {root} has `{near}`; " if near else "") + advice,
        missing=True,
    )
