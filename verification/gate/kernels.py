"""Which expressions of a candidate refer to its kernels (the functions a kernel language
marks: ``@triton.jit``), launched as ``kernel[grid](...)``, found by scope and
by where values flow, not by spelling.

A kernel object in host code is Python the gate cannot follow (``fn``, ``run``,
``add_pre_run_hook`` run code during launches), so host code may only launch it,
``kernel[grid](...)``, or hand it to what only launches it. Where a kernel is named:

- A **name** is a kernel where it resolves to one, as Python resolves it: in the innermost
  function binding it (a kernel only if bound there by ``@triton.jit`` definitions alone),
  else at module level. Inside a method named like a module-level kernel
  (``def leaky_relu(self, x): leaky_relu[grid](...)``) the name is the kernel, and
  ``self.leaky_relu`` the method.
- An **attribute** is a kernel where the class it is looked up in defines a kernel of that
  name in its body: the method's own class for its receiver (``self.kernel``), the class
  named (``ModelNew.kernel``), or, for any other object, some class of the module (never a
  module-level kernel: nothing makes one an attribute without naming it as a value, which
  is refused). An attribute the module assigns anywhere is an instance's, not a kernel.
- A **holder** is a name that only ever holds kernels and is only launched: a function's
  local every binding of which is a kernel or another holder (``kernel = relu_fp16 if half
  else relu_fp32``, if/else assignments), or a function's parameter; each of its reads, in
  the function's own scope, launches it (``kernel[grid](...)``), binds another holder, or
  hands it to a holder parameter (``launch(kernel, x)``, ``self._launch(kernel, x)``, or
  as a branch of a conditional expression handed there). A name a nested function or
  lambda reads, or a ``global``/``nonlocal`` one, is no holder.

A kernel bound to or handed to a holder from which a launch is reached counts as launched.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from kernelflow.verification.gate.scopes import bindings_of

__all__ = ["KernelUses", "kernel_uses"]

AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef
Slot = tuple[int, str]  # (id of a function's _Fn, a parameter's name)


@dataclass
class KernelUses:
    """``launches``: ids of the subscripts that launch a kernel (``kernel[grid]``, a
    holder's, ``self.kernel[grid]``); ``named``: ids of the names of kernels a holder takes;
    ``attributes``: ids of the attributes that are kernels; ``launched``: the kernels some
    launch is reached from."""

    launches: set[int] = field(default_factory=set)
    named: set[int] = field(default_factory=set)
    attributes: set[int] = field(default_factory=set)
    launched: set[str] = field(default_factory=set)


@dataclass
class _Fn:
    """One function or lambda: its own scope."""

    node: AnyFunction | ast.Lambda
    outer: _Fn | None
    cls: ast.ClassDef | None  # the class whose body defines it
    params: list[str]  # positional, in order
    keywords: set[str]  # every parameter a keyword argument may bind
    bound: set[str]
    jit_local: set[str]  # names it binds by @triton.jit definitions alone
    def_only: set[str]  # names it binds by function (or class) definitions alone
    bindings: list[tuple[str, ast.AST | None]]
    receiver: str = ""
    static: bool = False
    class_bound: bool = False  # a classmethod: bound to its class when looked up there
    loads: list[ast.Name] = field(default_factory=list)  # Name loads in its own scope
    calls: list[ast.Call] = field(default_factory=list)  # calls in its own scope
    captured: set[str] = field(default_factory=set)  # names nested scopes read or rebind
    declared: set[str] = field(default_factory=set)  # global / nonlocal names
    local_defs: dict[str, list[_Fn]] = field(default_factory=dict)  # functions it defines


class _Module:
    def __init__(self, tree: ast.Module, jit_ids: set[int]) -> None:
        self.jit_ids = jit_ids
        self.functions: list[_Fn] = []
        self.top_defs: dict[str, list[_Fn]] = {}  # module-level functions
        self.classes = {c.name: c for c in tree.body if isinstance(c, ast.ClassDef)}
        self.methods: dict[int, dict[str, list[_Fn]]] = {}  # class id -> its methods
        self.class_kernels = {
            item.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef)
            for item in node.body
            if isinstance(item, AnyFunction) and id(item) in jit_ids
        }
        self.stored_attributes = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load)
        }
        self.module_jit = _jit_only(list(tree.body), set(), jit_ids)
        self.module_defs = _jit_only(list(tree.body), set(), None)
        self.module_subscripts: list[tuple[ast.Subscript, _Fn | None]] = []
        self.attribute_nodes: list[tuple[ast.Attribute, _Fn | None]] = []
        self._walk(tree.body, None, None)

    # ------------------------------------------------------------------ scopes

    def _walk(self, nodes: Sequence[ast.AST], fn: _Fn | None, cls: ast.ClassDef | None) -> None:
        """Walks ``nodes`` in ``fn``'s own scope (None: module or class level)."""
        stack = list(reversed(nodes))
        while stack:
            node = stack.pop()
            if isinstance(node, AnyFunction | ast.Lambda):
                outside: list[ast.AST] = [*node.args.defaults]
                outside += [d for d in node.args.kw_defaults if d is not None]
                if not isinstance(node, ast.Lambda):
                    outside += node.decorator_list
                stack.extend(reversed(outside))
                self._function(node, fn, cls if fn is None else None)
                continue
            if isinstance(node, ast.ClassDef):
                stack.extend(reversed([*node.decorator_list, *node.bases, *node.keywords]))
                if fn is None:
                    self._walk(node.body, None, node)
                else:  # a class inside a function: its methods see the function's names
                    self._walk(node.body, fn, None)
                continue
            if fn is not None:
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    fn.loads.append(node)
                elif isinstance(node, ast.Call):
                    fn.calls.append(node)
                elif isinstance(node, ast.Global | ast.Nonlocal):
                    fn.declared.update(node.names)
            if isinstance(node, ast.Subscript):
                self.module_subscripts.append((node, fn))
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                self.attribute_nodes.append((node, fn))
            stack.extend(reversed(list(ast.iter_child_nodes(node))))

    def _function(
        self, node: AnyFunction | ast.Lambda, outer: _Fn | None, cls: ast.ClassDef | None
    ) -> None:
        args = node.args
        params = [a.arg for a in [*args.posonlyargs, *args.args]]
        keywords = {a.arg for a in [*args.args, *args.kwonlyargs]}
        every = set(params) | keywords
        every |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        body: list[ast.AST] = [node.body] if isinstance(node, ast.Lambda) else list(node.body)
        bindings = bindings_of(body)  # type: ignore[arg-type]
        decorators = [] if isinstance(node, ast.Lambda) else node.decorator_list
        names = {getattr(d, "id", "") for d in decorators}
        fn = _Fn(
            node,
            outer,
            cls,
            params,
            keywords,
            every | {name for name, _ in bindings},
            _jit_only(body, every, self.jit_ids),
            _jit_only(body, every, None),
            bindings,
            static="staticmethod" in names,
            class_bound="classmethod" in names,
        )
        if cls is not None and params and not fn.static:
            fn.receiver = params[0]
        if id(node) not in self.jit_ids:  # a kernel's body holds and hands on no kernel
            self.functions.append(fn)
            if not isinstance(node, ast.Lambda):
                if cls is not None:
                    self.methods.setdefault(id(cls), {}).setdefault(node.name, []).append(fn)
                elif outer is not None:
                    outer.local_defs.setdefault(node.name, []).append(fn)
                else:
                    self.top_defs.setdefault(node.name, []).append(fn)
        self._walk(body, fn, None)
        for inner in _own_nodes(body, nested=True):
            for name in ast.walk(inner):
                if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load):
                    fn.captured.add(name.id)
                elif isinstance(name, ast.Nonlocal):  # rebinds this function's names
                    fn.captured.update(name.names)

    # ------------------------------------------------------------------ resolution

    def is_kernel(self, name: str, fn: _Fn | None) -> bool:
        """Whether ``name`` read in ``fn`` (None: module or class level) is a kernel."""
        scope = fn
        while scope is not None:
            if name in scope.bound:
                return name in scope.jit_local
            scope = scope.outer
        return name in self.module_jit

    def attribute_is_kernel(self, node: ast.Attribute, fn: _Fn | None) -> bool:
        if node.attr not in self.class_kernels or node.attr in self.stored_attributes:
            return False
        owner = node.value
        looked_up: ast.ClassDef | None = None
        if isinstance(owner, ast.Name):
            if fn is not None and owner.id == fn.receiver and fn.cls is not None:
                looked_up = fn.cls
            elif not self._bound_in(owner.id, fn):
                looked_up = self.classes.get(owner.id)
        if looked_up is None:
            return True
        for item in looked_up.body:
            if isinstance(item, AnyFunction | ast.ClassDef) and item.name == node.attr:
                return id(item) in self.jit_ids
            if isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                if any(isinstance(t, ast.Name) and t.id == node.attr for t in targets):
                    return False
        return True  # not defined there: inherited, from some class of the module

    def _bound_in(self, name: str, fn: _Fn | None) -> bool:
        while fn is not None:
            if name in fn.bound:
                return True
            fn = fn.outer
        return False

    def targets(self, call: ast.Call, fn: _Fn) -> tuple[list[_Fn], int] | None:
        """The functions ``call`` (in ``fn``) may call, and how many positional parameters
        the call fills before its first argument (a bound method's receiver); None when
        they are not all the module's own."""
        func = call.func
        if isinstance(func, ast.Name):
            scope: _Fn | None = fn
            while scope is not None:
                if func.id in scope.bound:
                    defs = scope.local_defs.get(func.id, [])
                    return (defs, 0) if defs and func.id in scope.def_only else None
                scope = scope.outer
            found = self.top_defs.get(func.id)
            return (found, 0) if found and func.id in self.module_defs else None
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return None
        owner = func.value.id
        if fn.receiver and owner == fn.receiver and fn.cls is not None:
            if owner in {n for n, v in fn.bindings}:
                return None
            methods = self.methods.get(id(fn.cls), {}).get(func.attr)
            bound = True
        elif owner in self.classes and not self._bound_in(owner, fn):
            methods = self.methods.get(id(self.classes[owner]), {}).get(func.attr)
            bound = False
        else:
            return None
        if not methods:
            return None
        shifts = {0 if m.static else int(bound or m.class_bound) for m in methods}
        return (methods, shifts.pop()) if len(shifts) == 1 else None


def _own_nodes(body: list[ast.AST], *, nested: bool = False) -> Iterator[ast.AST]:
    """The nodes of ``body`` in its own scope, definitions included but not what they hold
    (``nested``: instead, the bodies of the functions, lambdas and classes nested in it,
    each whole)."""
    stack = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, AnyFunction | ast.Lambda | ast.ClassDef):
            if nested:
                yield from [node.body] if isinstance(node, ast.Lambda) else node.body
            else:
                yield node
            if isinstance(node, ast.ClassDef):
                stack.extend([*node.decorator_list, *node.bases, *node.keywords])
            else:
                stack.extend([*node.args.defaults, *(d for d in node.args.kw_defaults if d)])
                if not isinstance(node, ast.Lambda):
                    stack.extend(node.decorator_list)
            continue
        if not nested:
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _jit_only(body: list[ast.AST], params: set[str], jit_ids: set[int] | None) -> set[str]:
    """The names ``body``'s own scope binds by definitions alone, all of them kernels'
    (``jit_ids``; None: any function or class definitions)."""
    defs: dict[str, list[bool]] = {}
    for node in _own_nodes(body):
        if isinstance(node, AnyFunction | ast.ClassDef):
            kernel = jit_ids is None or id(node) in jit_ids
            defs.setdefault(node.name, []).append(kernel)
    unvalued: dict[str, int] = {}  # bindings to new objects: definitions, imports ...
    valued = set(params)
    for name, value in bindings_of(body):  # type: ignore[arg-type]
        if value is None:
            unvalued[name] = unvalued.get(name, 0) + 1
        else:
            valued.add(name)
    return {
        name
        for name, kinds in defs.items()
        if all(kinds) and unvalued.get(name) == len(kinds) and name not in valued
    }


def _leaves(value: ast.AST | None) -> list[ast.Name] | None:
    """The names a binding of a holder may take: a name, or a conditional expression of
    them; None for any other value."""
    if isinstance(value, ast.Name):
        return [value]
    if isinstance(value, ast.IfExp):
        body, orelse = _leaves(value.body), _leaves(value.orelse)
        return None if body is None or orelse is None else body + orelse
    return None


def kernel_uses(tree: ast.Module, jit_ids: set[int]) -> KernelUses:
    """Where the module's kernels (``jit_ids``: the ids of its @triton.jit functions'
    nodes) are launched, held and looked up (see the module's docstring)."""
    module = _Module(tree, jit_ids)
    uses = KernelUses()
    for attribute, fn in module.attribute_nodes:
        if module.attribute_is_kernel(attribute, fn):
            uses.attributes.add(id(attribute))
    holders = _Holders(module)
    for subscript, fn in module.module_subscripts:
        value = subscript.value
        if isinstance(value, ast.Name):
            held = fn is not None and (id(fn), value.id) in holders.valid
            if held or module.is_kernel(value.id, fn):
                uses.launches.add(id(subscript))
        elif id(value) in uses.attributes:
            uses.launches.add(id(subscript))
    called = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    uses.launches &= called
    for subscript, fn in module.module_subscripts:
        if id(subscript) in uses.launches:
            value = subscript.value
            if isinstance(value, ast.Attribute):
                uses.launched.add(value.attr)
            elif isinstance(value, ast.Name) and module.is_kernel(value.id, fn):
                uses.launched.add(value.id)
    uses.named = holders.kernel_names
    uses.launched |= holders.launched_kernels()
    return uses


class _Holders:
    """The holders of the module's functions (see the module's docstring): ``valid``, as
    (id of the function's _Fn, name); ``kernel_names``, ids of the kernels' names they
    take."""

    def __init__(self, module: _Module) -> None:
        self.module = module
        self.fns = {id(fn): fn for fn in module.functions}
        candidates: set[Slot] = set()
        for fn in module.functions:
            if isinstance(fn.node, ast.Lambda):
                continue
            read = {load.id for load in fn.loads}
            excluded = fn.captured | fn.declared | fn.def_only
            local = {name for name, _ in fn.bindings}
            for name in read - excluded:
                if name in fn.keywords or name in fn.params:
                    if name not in local:
                        candidates.add((id(fn), name))
                elif name in local and all(_leaves(v) for n, v in fn.bindings if n == name):
                    candidates.add((id(fn), name))
        self.valid = candidates
        changed = True
        while changed:
            changed = False
            for slot in sorted(self.valid):
                if not self._holds(slot):
                    self.valid.discard(slot)
                    changed = True
        self.kernel_names: set[int] = set()
        for fn, leaf, _ in self._given():
            if module.is_kernel(leaf.id, fn):
                self.kernel_names.add(id(leaf))

    def _uses(self, fn: _Fn) -> dict[int, list[Slot]]:
        """Per read name (id of the Name) in ``fn``: the holders it goes into there (a local
        holder's binding, a holder parameter of a function called); a launch: []."""
        out: dict[int, list[Slot]] = {}
        for call in fn.calls:
            if isinstance(call.func, ast.Subscript) and isinstance(call.func.value, ast.Name):
                out[id(call.func.value)] = []
            found = self.module.targets(call, fn)
            if found is None:
                continue
            defs, shift = found
            given: list[tuple[ast.expr, int | str]] = []
            for index, arg in enumerate(call.args):
                if isinstance(arg, ast.Starred):
                    break
                given.append((arg, index + shift))
            given += [(k.value, k.arg) for k in call.keywords if k.arg is not None]
            for arg, where in given:
                leaves = _leaves(arg)  # a name, or a conditional expression of names
                if leaves is None:
                    continue
                slots: list[Slot] = []
                for target in defs:
                    if isinstance(where, int):
                        param = target.params[where] if where < len(target.params) else ""
                    else:
                        param = where if where in target.keywords else ""
                    slots.append((id(target), param))
                if all(slot in self.valid for slot in slots):
                    out.update((id(leaf), slots) for leaf in leaves)
        for name, value in fn.bindings:
            if (id(fn), name) in self.valid:
                for leaf in _leaves(value) or []:
                    out[id(leaf)] = [(id(fn), name)]
        return out

    def _holds(self, slot: Slot) -> bool:
        fn = self.fns[slot[0]]
        name = slot[1]
        uses = self._uses(fn)
        if not all(id(load) in uses for load in fn.loads if load.id == name):
            return False
        for bound, value in fn.bindings:
            if bound != name:
                continue
            for leaf in _leaves(value) or []:
                if not (self.module.is_kernel(leaf.id, fn) or (id(fn), leaf.id) in self.valid):
                    return False
        return True

    def _given(self) -> Iterator[tuple[_Fn, ast.Name, list[Slot]]]:
        """(function, a name read there, the valid holders it goes into) for every name
        that goes into one."""
        for fn in self.module.functions:
            uses = self._uses(fn)
            for load in fn.loads:
                slots = uses.get(id(load))
                if slots:
                    yield fn, load, slots

    def launched_kernels(self) -> set[str]:
        """The kernels that go into a holder from which a launch is reached."""
        launching: set[Slot] = set()
        given = list(self._given())
        for fn in self.module.functions:
            uses = self._uses(fn)
            for load in fn.loads:
                if uses.get(id(load)) == [] and (id(fn), load.id) in self.valid:
                    launching.add((id(fn), load.id))
        changed = True
        while changed:
            changed = False
            for fn, load, slots in given:
                source = (id(fn), load.id)
                new = source in self.valid and source not in launching
                if new and any(slot in launching for slot in slots):
                    launching.add(source)
                    changed = True
        return {
            load.id
            for fn, load, slots in given
            if self.module.is_kernel(load.id, fn) and any(s in launching for s in slots)
        }
