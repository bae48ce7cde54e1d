"""Running statistics: the buffers a forward path may update in place.

nn.BatchNorm updates its buffers in each call in training mode
(``running_mean.mul_(1 - m).add_(m * mean)``, ``num_batches_tracked += 1``), and a
candidate that computes batch normalisation updates the same state the same way. The
caching rule exists so that nothing computed in one call reaches what a later call
returns; an update of a buffer is no such channel when nothing that call or a later one
returns can read the buffer back. So a forward path may update a *running buffer* of the
module the verifier builds:

- a running buffer is one ``__init__`` registers (``self.register_buffer("name", ...)``)
  or a buffer (``running_mean``, ``running_var``, ``num_batches_tracked``) of an
  nn.BatchNorm*/InstanceNorm* submodule it builds (``self.bn = nn.BatchNorm2d(c)``), of a
  class nothing else in the module builds, derives from or holds (its instance is reached
  only as its methods' receiver);
- an update is a statement of its own on the buffer itself: in-place tensor methods
  chained on it (``self.running_mean.mul_(a).add_(b)``, ``.copy_(v)``; not ``set_``,
  which would make it share another tensor's storage), an augmented assignment
  (``self.num_batches_tracked += 1``) or an assignment of arithmetic (``self.rv = (1 - m)
  * self.rv + m * var``); its arguments may read running buffers through arithmetic and
  methods that make new values, nothing that writes elsewhere (in-place methods, ``out=``,
  launches, the candidate's functions, walrus);
- and either the buffer is *write-only*: no forward path reads its data but its updates
  (the receiver handed whole, ``self.bn(x)``, ``self.state_dict()``, a kernel launched on
  it, a value made from it, all read it; its shape, dtype and device do not); or, as
  nn.BatchNorm itself, it is *mode-separated*: every update runs in training mode only
  (under ``if self.training:``, or in a method only such code calls) and every read in
  eval mode only (the ``else`` of that test, ``if not self.training:``, what follows a
  training branch that returns), and nothing in the module can change the mode (it
  defines no ``train``/``eval``/``training``, reaches no ``.train``/``.eval`` and writes
  no ``.training``). In either mode the buffer is then written and never read, or read
  and never written.

Still refused: any other write into module state in forward, a buffer updated where its
value is read back (``self.cache.copy_(y)`` with ``return self.cache.clone()``), or an
update in code that runs in the mode where it is read.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator

from kernelflow.verification.gate.rules import AUTOGRAD_API, MUTATING_METHODS, NN_MODULE_API
from kernelflow.verification.gate.state import METADATA_ATTRS, METADATA_METHODS

__all__ = ["running_updates"]

AnyFunction = ast.FunctionDef | ast.AsyncFunctionDef
Chain = tuple[str, ...]  # attributes after the receiver: ("bn", "running_mean")
NORM_BUFFERS = ("running_mean", "running_var", "num_batches_tracked")
_NORM_CLASSES = (
    *(
        f"torch.nn.{kind}{dims}"
        for kind in ("BatchNorm", "LazyBatchNorm", "InstanceNorm", "LazyInstanceNorm")
        for dims in ("1d", "2d", "3d")
    ),
    "torch.nn.SyncBatchNorm",
)
_MODE = frozenset({"train", "eval"})  # what changes a module's mode (with `.training = `)
_PURE_BUILTINS = frozenset({"float", "int", "abs", "min", "max", "round"})
_EVERYTHING: Chain = ()  # a read of the receiver whole: every buffer


def running_updates(
    tree: ast.Module,
    *,
    init_code: set[int],
    jit_ids: set[int],
    resolve: Callable[[ast.AST], str | None],
) -> set[int]:
    """The ids of the update nodes (the in-place calls, the assignment targets) of running
    buffers that forward paths may make (see the module's docstring); ``init_code``: ids
    of the functions that run only while the module is built; ``resolve``: an expression's
    imported path."""
    allowed: set[int] = set()
    fixed = _mode_fixed(tree, init_code)
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and not _held_elsewhere(tree, cls.name):
            allowed |= _Class(cls, init_code, jit_ids, resolve).allowed(fixed)
    return allowed


def _held_elsewhere(tree: ast.Module, name: str) -> bool:
    """Whether ``name`` (a class) is read other than as ``name.attr`` or ``super(name,
    ...)``: built, derived from, or handed on by the module itself."""
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    owners = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == name and id(node) not in owners:
            parent = parents.get(id(node))
            is_super = isinstance(parent, ast.Call) and getattr(parent.func, "id", "") == "super"
            if not is_super:
                return True
    return False


def _mode_fixed(tree: ast.Module, init_code: set[int]) -> bool:
    """Whether nothing in the module can change a module's training mode."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                names = [getattr(item, "name", "")]
                if isinstance(item, ast.Assign | ast.AnnAssign):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    names = [getattr(t, "id", "") for t in targets]
                if {*names} & {*_MODE, "training"}:
                    return False
        if isinstance(node, ast.Attribute):
            if node.attr in _MODE:
                return False
            if node.attr == "training" and not isinstance(node.ctx, ast.Load):
                return False
    return True


class _Class:
    def __init__(
        self,
        cls: ast.ClassDef,
        init_code: set[int],
        jit_ids: set[int],
        resolve: Callable[[ast.AST], str | None],
    ) -> None:
        methods = [m for m in cls.body if isinstance(m, AnyFunction) and id(m) not in jit_ids]
        self.method_names = {m.name for m in methods}
        self.init = [m for m in methods if id(m) in init_code]
        self.forward = [m for m in methods if id(m) not in init_code and _receiver(m)]
        self.buffers: set[Chain] = set()
        self.assigned: set[str] = set()  # attributes __init__ sets on the receiver
        for method in self.init:
            self._registered(method, resolve)
        # Per buffer: its updates (nodes whose check is waived), and where it is read.
        self.updates: dict[Chain, list[tuple[ast.AST, list[int]]]] = {}
        self.exempt: set[int] = set()  # receiver reads inside updates
        self.reads: list[tuple[Chain, ast.AST]] = []

    def _registered(self, method: AnyFunction, resolve: Callable[[ast.AST], str | None]) -> None:
        receiver = _receiver(method)
        for node in ast.walk(method):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                literal = node.args and isinstance(node.args[0], ast.Constant)
                if (
                    node.func.attr == "register_buffer"
                    and isinstance(owner, ast.Name)
                    and owner.id == receiver
                    and literal
                    and isinstance(node.args[0].value, str)  # type: ignore[attr-defined]
                ):
                    self.buffers.add((node.args[0].value,))  # type: ignore[attr-defined]
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                chain = _chain(node.targets[0], receiver)
                if chain is not None and len(chain) == 1:
                    self.assigned.add(chain[0])
                    value = node.value
                    if isinstance(value, ast.Call) and resolve(value.func) in _NORM_CLASSES:
                        self.buffers.update((chain[0], b) for b in NORM_BUFFERS)

    def allowed(self, mode_fixed: bool) -> set[int]:
        if not self.buffers:
            return set()
        regions: dict[int, str] = {}
        for method in self.forward:
            self._scan(method)
            _mark_modes(method, _receiver(method), regions)
        self._guarded_methods(regions)
        out: set[int] = set()
        for buffer, updates in self.updates.items():
            reads = [node for chain, node in self.reads if _overlap(chain, buffer)]
            separated = (
                mode_fixed
                and all(regions.get(id(statement)) == "train" for statement, _ in updates)
                and all(regions.get(id(node)) == "eval" for node in reads)
            )
            if not reads or separated:
                out.update(i for _, ids in updates for i in ids)
        return out

    def _guarded_methods(self, regions: dict[int, str]) -> None:
        """A method every call of which (``self.m(...)``) is in training (or eval) code
        runs in that mode only."""
        changed = True
        while changed:
            changed = False
            for method in self.forward:
                if id(method) in regions or method.name in NN_MODULE_API | AUTOGRAD_API:
                    continue  # PyTorch calls these itself, in either mode
                modes = {
                    regions.get(id(node))
                    for other in self.forward
                    for node in ast.walk(other)
                    if isinstance(node, ast.Attribute) and node.attr == method.name
                }
                if len(modes) == 1 and None not in modes:
                    mode = modes.pop()
                    for node in ast.walk(method):
                        regions[id(node)] = mode  # type: ignore[assignment]
                    changed = True

    # ------------------------------------------------------------------ one method

    def _scan(self, method: AnyFunction) -> None:
        receiver = _receiver(method)
        rebound = any(
            isinstance(n, ast.Name) and n.id == receiver and not isinstance(n.ctx, ast.Load)
            for n in ast.walk(method)
        )
        if rebound:
            self.reads.append((_EVERYTHING, method))
            return
        for statement in _statements(method.body):
            self._update(statement, receiver)
        parents = {id(c): p for p in ast.walk(method) for c in ast.iter_child_nodes(p)}
        for node in ast.walk(method):
            if isinstance(node, ast.Name) and node.id == "super":
                self.reads.append((_EVERYTHING, node))
            if not (isinstance(node, ast.Name) and node.id == receiver):
                continue
            if isinstance(node.ctx, ast.Load) and id(node) not in self.exempt:
                read = self._read(node, parents)
                if read is not None:
                    self.reads.append((read, node))

    def _update(self, statement: ast.stmt, receiver: str) -> None:
        """Records ``statement`` if it is an update of a buffer (see the docstring)."""
        target: ast.AST | None = None
        values: list[ast.AST] = []
        ids: list[int] = []
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call: ast.AST = statement.value
            while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                method = call.func.attr
                if not method.endswith("_") or method.startswith("_") or method == "set_":
                    return
                ids.append(id(call))
                values += [*call.args, *(k.value for k in call.keywords)]
                call = call.func.value
            target = call
        elif isinstance(statement, ast.AugAssign):
            target, values, ids = statement.target, [statement.value], [id(statement.target)]
        elif (
            isinstance(statement, ast.Assign)
            and len(statement.targets) == 1
            and isinstance(statement.value, ast.BinOp | ast.UnaryOp)
        ):
            target, values = statement.targets[0], [statement.value]
            ids = [id(target)]
        chain = _chain(target, receiver) if target is not None else None
        if chain is None or chain not in self.buffers or not ids:
            return
        self.updates.setdefault(chain, []).append((statement, ids))
        self.exempt.add(id(_root(target)))  # type: ignore[arg-type]
        for value in values:
            if _pure(value, receiver, self.method_names):
                self.exempt.update(
                    id(n) for n in ast.walk(value) if isinstance(n, ast.Name) and n.id == receiver
                )

    def _read(self, name: ast.Name, parents: dict[int, ast.AST]) -> Chain | None:
        """What a read of the receiver (``name``) reads of its state: the chain it reads
        whole (``_EVERYTHING``: the receiver itself); None: no data (metadata, a call of
        the class's own method, a write)."""
        node: ast.AST = name
        attrs: list[str] = []
        parent = parents.get(id(node))
        while isinstance(parent, ast.Attribute) and parent.value is node:
            node = parent
            attrs.append(parent.attr)
            parent = parents.get(id(node))
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            return None  # a write: judged by the caching rule
        if attrs and attrs[0].startswith("_") and attrs[0] not in self.method_names:
            return _EVERYTHING  # nn.Module's own tables (_buffers, _modules ...)
        for index, attr in enumerate(attrs):
            if index and attr in METADATA_ATTRS:
                return None
        called = isinstance(parent, ast.Call) and parent.func is node
        if called and attrs:
            if len(attrs) == 1 and attrs[0] in self.method_names:
                return None  # the class's own method: its body is scanned itself
            if len(attrs) > 1 and attrs[-1] in METADATA_METHODS:
                return None
            if len(attrs) > 1 or attrs[0] not in self.assigned:
                return tuple(attrs[:-1])  # a method of what holds it: that object whole
        return tuple(attrs)


def _receiver(method: AnyFunction) -> str:
    args = [*method.args.posonlyargs, *method.args.args]
    static = any(getattr(d, "id", "") == "staticmethod" for d in method.decorator_list)
    return args[0].arg if args and not static else ""


def _chain(node: ast.AST | None, receiver: str) -> Chain | None:
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.insert(0, node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == receiver and attrs:
        return tuple(attrs)
    return None


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node


def _overlap(read: Chain, buffer: Chain) -> bool:
    """Whether reading ``read`` whole reads ``buffer`` (or part of it)."""
    shorter = min(len(read), len(buffer))
    return read[:shorter] == buffer[:shorter]


def _pure(value: ast.AST, receiver: str, methods: set[str]) -> bool:
    """Whether evaluating ``value`` writes nothing and hands nothing to code that could:
    arithmetic, comparisons, items, attributes, and calls of methods that make new values
    (no in-place ones, no ``out=``, none of the candidate's) and of a few builtins."""
    for node in ast.walk(value):
        if isinstance(node, ast.NamedExpr | ast.Lambda | ast.Await | ast.Yield):
            return False
        if isinstance(node, ast.comprehension):
            return False
        if not isinstance(node, ast.Call):
            continue
        if any(k.arg == "out" or k.arg is None for k in node.keywords):
            return False
        func = node.func
        if isinstance(func, ast.Name):
            if func.id not in _PURE_BUILTINS:
                return False
        elif isinstance(func, ast.Attribute):
            owner = func.value
            own = isinstance(owner, ast.Name) and owner.id == receiver
            writes = func.attr.endswith("_") or func.attr in MUTATING_METHODS
            if writes or (own and func.attr in methods):
                return False
        else:
            return False  # a launch, a computed callee
    return True


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement of ``body``, in nested blocks too (not in nested functions)."""
    for statement in body:
        yield statement
        if isinstance(statement, AnyFunction | ast.ClassDef):
            continue
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(statement, field, []))
        for handler in getattr(statement, "handlers", []):
            yield from _statements(handler.body)
        for case in getattr(statement, "cases", []):
            yield from _statements(case.body)


def _mode_test(test: ast.AST, receiver: str) -> tuple[str, bool] | None:
    """("train"|"eval", whether the test is exactly the mode: its else is the other
    mode) for a test of ``receiver.training``; None for any other test."""
    if _is_training(test, receiver):
        return "train", True
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    if negated and _is_training(test.operand, receiver):  # type: ignore[attr-defined]
        return "eval", True
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        for value in test.values:
            found = _mode_test(value, receiver)
            if found is not None:
                return found[0], False
    return None


def _is_training(node: ast.AST, receiver: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "training"
        and isinstance(node.value, ast.Name)
        and node.value.id == receiver
    )


_OTHER = {"train": "eval", "eval": "train"}


def _mark_modes(method: AnyFunction, receiver: str, regions: dict[int, str]) -> None:
    """Marks (``regions``: node id -> mode) the nodes of ``method`` that run only in
    training or only in eval mode."""

    def mark(node: ast.AST, mode: str | None) -> None:
        if isinstance(node, ast.IfExp):
            found = _mode_test(node.test, receiver)
            if found is not None:
                mark(node.test, mode)
                mark(node.body, found[0])
                mark(node.orelse, _OTHER[found[0]] if found[1] else mode)
                if mode is not None:
                    regions[id(node)] = mode
                return
        if mode is not None:
            regions[id(node)] = mode
        if isinstance(node, ast.If):
            found = _mode_test(node.test, receiver)
            if found is not None:
                mark(node.test, mode)
                block(node.body, found[0])
                block(node.orelse, _OTHER[found[0]] if found[1] else mode)
                return
        if isinstance(node, ast.stmt) and not isinstance(node, AnyFunction | ast.ClassDef):
            for field in ("body", "orelse", "finalbody"):
                if getattr(node, field, None):
                    block(getattr(node, field), mode)
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, ast.stmt):
                    mark(child, mode)
            return
        for child in ast.iter_child_nodes(node):
            mark(child, mode)

    def block(body: list[ast.stmt], mode: str | None) -> None:
        for statement in body:
            mark(statement, mode)
            if isinstance(statement, ast.If) and mode is None:
                found = _mode_test(statement.test, receiver)
                exits = statement.body and isinstance(statement.body[-1], ast.Return | ast.Raise)
                if found is not None and found[1] and exits and not statement.orelse:
                    mode = _OTHER[found[0]]  # what follows runs in the other mode only

    block(method.body, None)
