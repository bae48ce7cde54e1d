"""Where each read of a name in a function may get its value from (the bindings that reach
it), and so whether that read holds a value the call itself made.

A name is not one value for a whole function: ``shape = x.shape`` and later ``shape =
list(shape)`` bind two, and a write after the second (``shape.pop(d)``) lands in the list
the call made, not in the input's shape. So the gate judges a write by the bindings that
reach the name it writes through, as Python runs the function: in order, both ways of an
``if``, loops until nothing new reaches their head, every state of a ``try`` body into its
handlers. More bindings may reach a read than ever do (a ``return`` in a branch does not
stop the analysis), never fewer.

A binding holds a value *made in the call* when every name its value may hold
(:func:`~.scopes.held_loads`) is read where only such bindings reach it, and when
what was later put into it is made in the call as well: an item appended to a list the
call made (``kept.append(self.buf)``), assigned into it (``kept[0] = self.buf``), an
attribute set on an object (``y.data = self.buf``) or a storage swapped in (``y.set_(...)``)
makes that object hold outside state; a write through any alias of it counts (the aliases
are followed back through the bindings that made them). Writing into a tensor's items
(``y[0] = x[0]``) copies data and holds nothing. A binding makes a *container* when its
value is a new list, dict or set (a display, a comprehension, ``list(...)``, a shallow
``.copy()``) or another read of one: it may itself be changed whatever it holds.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from kernelflow.verification.gate.rules import COPYING_METHODS

__all__ = ["Reads", "flow_reads", "held_loads", "new_container", "root_name"]

State = dict[str, frozenset[int]]
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
# Methods that put their arguments into the container they are called on (an autograd
# function's ctx keeps what it saves: `ctx.saved_tensors` are the inputs); `set_` makes a
# tensor share the storage it is given.
_STORING = frozenset(
    {"append", "extend", "insert", "setdefault", "update", "add", "appendleft", "extendleft"}
    | {"save_for_backward", "save_for_forward"}
)
_PARAMETER = ast.Name(id="<parameter>")  # a parameter's value: the caller's
_OUTSIDE = ast.Name(id="<outside>")  # a global or nonlocal name's value, or a module's
_NOT_MADE = (_PARAMETER, _OUTSIDE)
# A parameter made for each call (an autograd function's ctx): the object is the call's, what
# it holds (the inputs forward saved) is not.
_PER_CALL = ast.Name(id="<per call>")


@dataclass(frozen=True)
class Reads:
    """Ids of the names read in a function (and of the roots of its writes) whose every
    reaching binding holds a value made in the call (``fresh``), or makes a container, or
    is made in the call (``containers``)."""

    fresh: frozenset[int]
    containers: frozenset[int]


def flow_reads(
    func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
    *,
    makers: frozenset[str],
    fresh_params: frozenset[str],
    shadowed: frozenset[str],
) -> Reads:
    """``makers``: names whose calls make new values (held_loads); ``fresh_params``:
    parameters made for each call (an autograd function's ctx); ``shadowed``: the names
    bound in the function (so not the builtins ``list``, ``dict`` ...)."""
    walker = _Walker()
    args = func.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    every += [a for a in (args.vararg, args.kwarg) if a is not None]
    state: State = {}
    for arg in every:
        per_call = arg.arg in fresh_params
        state = walker.bind(state, arg.arg, _PER_CALL if per_call else _PARAMETER, arg)
    if isinstance(func, ast.Lambda):
        walker.expr(func.body, state)
    else:
        walker.block(func.body, state)
    bindings, reaching = walker.bindings, walker.reaching
    declared = walker.declared  # global and nonlocal names: every read of them outlives

    def held(value: ast.AST | None) -> list[ast.Name]:
        if value is None or value in (*_NOT_MADE, _PER_CALL):
            return []
        return held_loads(value, makers)

    def holder(value: ast.AST | None) -> bool:
        """A new object whose items or attributes are references: a list, dict or set,
        or an object made for the call (a definition, an autograd function's ctx)."""
        return value is None or value is _PER_CALL or new_container(value, shadowed)

    # What writes put into objects: every binding the written name may hold, and those its
    # value was made from (an alias's object is the one written into).
    extra: dict[int, list[ast.AST]] = {}
    for root, values, any_object in walker.stores:
        todo = list(reaching.get(root, ()))
        seen = set(todo)
        while todo:
            index = todo.pop()
            _, value = bindings[index]
            if any_object or holder(value):
                extra.setdefault(index, []).extend(values)
            for read in held(value):
                for source in reaching.get(id(read), ()):
                    if source not in seen:
                        seen.add(source)
                        todo.append(source)
    outside = {name for name, value in bindings if value is _OUTSIDE and name in declared}
    fresh = [value not in (*_NOT_MADE, _PER_CALL) for _, value in bindings]

    def all_fresh(read: ast.Name) -> bool:
        sources = reaching.get(id(read), frozenset())
        return bool(sources) and all(fresh[s] for s in sources)

    changed = True
    while changed:
        changed = False
        for index, (bound, value) in enumerate(bindings):
            if not fresh[index]:
                continue
            made_of: list[ast.AST | None] = [value, *extra.get(index, [])]
            if bound in outside or not all(all_fresh(n) for v in made_of for n in held(v)):
                fresh[index] = False
                changed = True
    container = [value not in _NOT_MADE for _, value in bindings]
    changed = True
    while changed:
        changed = False
        for index, (_, value) in enumerate(bindings):
            if not container[index] or holder(value):
                continue
            sources = reaching.get(id(value), frozenset()) if isinstance(value, ast.Name) else None
            if not (sources and all(fresh[s] or container[s] for s in sources)):
                container[index] = False
                changed = True
    made: set[int] = set()
    kept: set[int] = set()
    for where, sources in reaching.items():
        if not sources or any(bindings[s][0] in outside for s in sources):
            continue
        if all(fresh[s] for s in sources):
            made.add(where)
        if all(fresh[s] or container[s] for s in sources):
            kept.add(where)
    return Reads(frozenset(made), frozenset(kept))


def _join(*states: State) -> State:
    out: State = {}
    for state in states:
        for name, sources in state.items():
            out[name] = out.get(name, frozenset()) | sources
    return out


def held_loads(node: ast.AST, makers: frozenset[str] = frozenset()) -> list[ast.Name]:
    """The names (their reads) whose objects ``node`` may evaluate to or hold: through
    attributes, items, conditionals, displays, and calls (``x.view(-1)``, ``d.get(k)``,
    ``list(d.values())``, ``f(x)`` may give back their receiver or arguments, or objects
    kept in them); not through the functions of ``makers`` (imported modules:
    ``torch.empty_like(x)``; in a kernel, other kernels) or copying methods
    (``x.clone()``), which make new values."""
    if isinstance(node, ast.Name):
        return [node]
    if isinstance(node, ast.Attribute | ast.Subscript | ast.Starred | ast.NamedExpr):
        return held_loads(node.value, makers)
    if isinstance(node, ast.Call):
        callee = held_loads(node.func, makers)
        made = bool(callee) and {name.id for name in callee} <= makers
        if made or getattr(node.func, "attr", "") in COPYING_METHODS:
            return []
        given = [*node.args, *(keyword.value for keyword in node.keywords)]
        names = [name for value in given for name in held_loads(value, makers)]
        return names + (callee if isinstance(node.func, ast.Attribute) else [])
    if isinstance(node, ast.IfExp):
        return held_loads(node.body, makers) + held_loads(node.orelse, makers)
    parts: list[ast.AST] = []
    if isinstance(node, ast.BoolOp):
        parts = list(node.values)
    elif isinstance(node, ast.Tuple | ast.List | ast.Set):
        parts = list(node.elts)
    elif isinstance(node, ast.Dict):
        parts = list(node.values)
    elif isinstance(node, _COMPREHENSIONS):
        parts = [gen.iter for gen in node.generators]
    return [name for part in parts for name in held_loads(part, makers)]


# Builtins whose call makes a new container (when not shadowed by a local).
_CONTAINER_BUILTINS = frozenset({"list", "dict", "set", "sorted", "bytearray"})
_DISPLAYS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)


def new_container(value: ast.AST | None, shadowed: frozenset[str] | set[str]) -> bool:
    """Whether ``value`` always evaluates to a new (mutable) container: a display, a
    comprehension, ``list(...)``/``dict(...)``/``sorted(...)``, or a shallow ``.copy()``."""
    if isinstance(value, _DISPLAYS):
        return True
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Name):
        return func.id in _CONTAINER_BUILTINS and func.id not in shadowed
    return isinstance(func, ast.Attribute) and func.attr == "copy" and not value.args


def root_name(node: ast.AST) -> ast.Name | None:
    """The name a write into ``node`` (an attribute, item, or a method's receiver) goes
    through: ``self`` for ``self.d[k]``; None when it is not a name."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Starred | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node if isinstance(node, ast.Name) else None


class _Walker:
    """Runs a function body's statements over states (name -> the bindings that may hold
    it), recording the bindings, the bindings reaching each name read, and the writes that
    put values into objects: (id of the written name's read, the values, whether any
    object holds them or only containers do)."""

    def __init__(self) -> None:
        self.bindings: list[tuple[str, ast.AST | None]] = []
        self.reaching: dict[int, frozenset[int]] = {}
        self.stores: list[tuple[int, Sequence[ast.AST], bool]] = []
        self.seen: list[list[State]] = []  # the states inside each loop or try being run
        self.sites: dict[tuple[int, str], int] = {}  # (id of a binding's node, name) -> it
        self.declared: set[str] = set()  # global and nonlocal names

    def bind(self, state: State, name: str, value: ast.AST | None, site: ast.AST) -> State:
        """``state`` with ``name`` bound to ``value`` at ``site`` (one binding however
        often a loop runs it)."""
        index = self.sites.get((id(site), name))
        if index is None:
            index = self.sites[(id(site), name)] = len(self.bindings)
            self.bindings.append((name, value))
        return {**state, name: frozenset({index})}

    def read(self, name: ast.Name, sources: frozenset[int]) -> None:
        self.reaching[id(name)] = self.reaching.get(id(name), frozenset()) | sources

    def store(self, target: ast.AST, values: Sequence[ast.AST], any_object: bool) -> None:
        root = root_name(target)
        if root is not None:
            self.stores.append((id(root), values, any_object))

    # ------------------------------------------------------------------ statements

    def block(self, body: list[ast.stmt], state: State) -> State:
        for statement in body:
            state = self.statement(statement, state)
            for seen in self.seen:
                seen.append(state)
        return state

    def statement(self, node: ast.stmt, state: State) -> State:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            state = self.expr(node.value, state)
            if node.value is None:
                return state
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                state = self.target(target, node.value, state)
            return state
        if isinstance(node, ast.AugAssign):
            state = self.expr(node.value, state)
            if isinstance(node.target, ast.Name):  # `items += [...]`: a list extended
                self.read(node.target, state.get(node.target.id, frozenset()))
                self.stores.append((id(node.target), [node.value], False))
                return state
            state = self.expr(node.target, state)
            self.store(node.target, [node.value], isinstance(node.target, ast.Attribute))
            return state
        if isinstance(node, ast.Delete):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    state = {**state, target.id: frozenset()}
                else:
                    state = self.expr(target, state)
            return state
        if isinstance(node, ast.For | ast.AsyncFor):
            state = self.expr(node.iter, state)
            return self.loop(node, state, lambda s: self.target(node.target, node.iter, s))
        if isinstance(node, ast.While):
            return self.loop(node, state, lambda s: self.expr(node.test, s))
        if isinstance(node, ast.If):
            state = self.expr(node.test, state)
            return _join(self.block(node.body, state), self.block(node.orelse, state))
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                state = self.expr(item.context_expr, state)
                if item.optional_vars is not None:
                    state = self.target(item.optional_vars, item.context_expr, state)
            return self.block(node.body, state)
        if isinstance(node, ast.Try | ast.TryStar):
            return self.try_(node, state)
        if isinstance(node, ast.Match):
            state = self.expr(node.subject, state)
            outs = [state]
            for case in node.cases:
                inner = state
                for pattern in ast.walk(case.pattern):
                    name = getattr(pattern, "name", None) or getattr(pattern, "rest", None)
                    if isinstance(name, str):
                        inner = self.bind(inner, name, node.subject, pattern)
                inner = self.expr(case.guard, inner)
                outs.append(self.block(case.body, inner))
            return _join(*outs)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            for part in _evaluated_where_defined(node):
                state = self.expr(part, state)
            return self.bind(state, node.name, None, node)
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:  # a module (or what it holds): not the call's
                name = (alias.asname or alias.name).split(".")[0]
                state = self.bind(state, name, _OUTSIDE, alias)
            return state
        if isinstance(node, ast.Global | ast.Nonlocal):
            self.declared.update(node.names)
            for name in node.names:
                state = self.bind(state, name, _OUTSIDE, node)
            return state
        for child in ast.iter_child_nodes(node):  # Expr, Return, Raise, Assert ...
            if isinstance(child, ast.expr):
                state = self.expr(child, state)
        return state

    def loop(
        self,
        node: ast.For | ast.AsyncFor | ast.While,
        state: State,
        enter: Callable[[State], State],
    ) -> State:
        """A loop from ``state``: ``enter`` is what each iteration starts with (binding a
        ``for`` target, evaluating a ``while`` test); run until its head takes no new
        binding. After it: the head, or any state inside (a ``break``)."""
        head = state
        while True:
            self.seen.append([])
            inside = enter(head)
            out = self.block(node.body, inside)
            seen = self.seen.pop()
            new_head = _join(head, inside, out, *seen)
            if new_head == head:
                break
            head = new_head
        done = self.block(node.orelse, enter(head))
        return _join(done, head, *seen)

    def try_(self, node: ast.Try | ast.TryStar, state: State) -> State:
        self.seen.append([])
        body = self.block(node.body, state)
        raised = _join(state, body, *self.seen.pop())
        outs = [self.block(node.orelse, body)]
        for handler in node.handlers:
            entry = self.expr(handler.type, raised)
            if handler.name:
                entry = self.bind(entry, handler.name, None, handler)
            outs.append(self.block(handler.body, entry))
        if not node.finalbody:
            return _join(*outs)
        return self.block(node.finalbody, _join(raised, *outs))

    def target(self, target: ast.AST, value: ast.AST, state: State) -> State:
        if isinstance(target, ast.Name):
            return self.bind(state, target.id, value, target)
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                state = self.target(element, value, state)
            return state
        if isinstance(target, ast.Starred):
            return self.target(target.value, value, state)
        state = self.expr(target, state)  # a.b = v, a[k] = v: reads a (and k)
        self.store(target, [value], isinstance(target, ast.Attribute))
        return state

    # ------------------------------------------------------------------ expressions

    def expr(self, node: ast.AST | None, state: State) -> State:
        """Records the reads in ``node`` (evaluated in ``state``); the state after it (a
        walrus binds a name: it joins the state, as it may not run)."""
        if node is None:
            return state
        walrus = [n for n in _own(node) if isinstance(n, ast.NamedExpr)]
        for named in walrus:
            if isinstance(named.target, ast.Name):
                bound = self.bind(state, named.target.id, named.value, named)
                state = _join(state, bound)
        self.reads(node, state, {})
        return state

    def reads(self, node: ast.AST, state: State, local: State) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.read(node, local.get(node.id, state.get(node.id, frozenset())))
            return
        if isinstance(node, ast.Lambda):
            for default in [*node.args.defaults, *node.args.kw_defaults]:
                if default is not None:
                    self.reads(default, state, local)
            return
        if isinstance(node, _COMPREHENSIONS):
            inner = dict(local)
            for generator in node.generators:
                self.reads(generator.iter, state, inner)
                for name in ast.walk(generator.target):
                    if isinstance(name, ast.Name):
                        inner = self.bind(inner, name.id, generator.iter, name)
                for condition in generator.ifs:
                    self.reads(condition, state, inner)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self.reads(part, state, inner)
            return
        for child in ast.iter_child_nodes(node):
            self.reads(child, state, local)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in _STORING or method == "set_":  # (`__setitem__` is refused)
                values = [*node.args, *(k.value for k in node.keywords)]
                self.store(node.func.value, values, method == "set_")


def _own(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it holds, but not the bodies of lambdas (their own scope)."""
    stack = [node]
    while stack:
        item = stack.pop()
        yield item
        if isinstance(item, ast.Lambda):
            stack.extend(d for d in [*item.args.defaults, *item.args.kw_defaults] if d)
        else:
            stack.extend(ast.iter_child_nodes(item))


def _evaluated_where_defined(
    node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef,
) -> list[ast.expr]:
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]
    args = node.args
    return [*node.decorator_list, *args.defaults, *(d for d in args.kw_defaults if d)]
