"""Which writes into the module's own state a forward path may make.

State kept across calls is how results are cached, so forward may not write into
``self``... except with values no call's data went into: weights fused from the module's
parameters on the first call (``self.fused = (self.w * self.scale).contiguous()``), or a
submodule moved to the inputs' device (``self.conv = self.conv.to(x.device)``). Such a
value is what ``__init__`` could have computed; it carries nothing from one call to the
next. So a write into ``self.<attribute>`` in forward passes when its value

- reads no input of the call (a parameter of forward, or a local made from one), but for
  the inputs' metadata (``x.device``, ``x.shape``, ``x.dtype``), which is not their data;
- and reads no attribute forward itself writes (state that changes from call to call: a
  counter), unless it is that very attribute moved or laid out again (``.to(...)``,
  ``.contiguous()``), which changes no value.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

__all__ = [
    "METADATA_ATTRS",
    "METADATA_METHODS",
    "StateReads",
    "input_locals",
    "state_write_problem",
]

# What a tensor says of itself that is not its data.
METADATA_ATTRS = frozenset({"shape", "dtype", "device", "ndim", "is_cuda", "layout"})
METADATA_METHODS = frozenset(
    {"size", "dim", "numel", "stride", "element_size", "is_contiguous", "get_device"}
)
# Methods that move or lay out a value without changing it.
_MOVES = frozenset({"to", "contiguous", "cuda", "cpu", "detach"})


def data_reads(node: ast.AST, metadata: bool = False) -> Iterator[ast.expr]:
    """The names and attribute chains ``node`` reads, each chain whole
    (``self.gemm.weight``); a method call reads its receiver and its arguments. Reads of
    metadata only (``x.device``, ``x.size(0)``) are left out unless ``metadata``."""
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute):
            if metadata or func.attr not in METADATA_METHODS:
                yield from data_reads(func.value, metadata)
        else:
            yield from data_reads(func, metadata)
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            yield from data_reads(arg, metadata)
    elif isinstance(node, ast.Attribute) and node.attr in METADATA_ATTRS and not metadata:
        return
    elif isinstance(node, ast.Attribute | ast.Name) and _chain_root(node) is not None:
        yield node
    elif not isinstance(node, ast.Lambda):  # a lambda runs later, judged where it runs
        for child in ast.iter_child_nodes(node):
            yield from data_reads(child, metadata)


def input_locals(
    bindings: list[tuple[str, ast.AST | None]], inputs: frozenset[str]
) -> frozenset[str]:
    """``inputs`` and the locals some binding of which reads their data."""
    tainted = set(inputs)
    changed = True
    while changed:
        changed = False
        for name, value in bindings:
            if name in tainted or value is None:
                continue
            if any(_chain_root(read) in tainted for read in data_reads(value)):
                tainted.add(name)
                changed = True
    return frozenset(tainted)


def written_attributes(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The attributes of its receiver (first parameter) ``method`` changes, by their first
    name (``weight`` for ``self.weight.data = ...``): every write or delete but a move of
    the attribute itself (``self.conv = self.conv.to(x.device)`` changes no value)."""
    args = [*method.args.posonlyargs, *method.args.args]
    if not args:
        return set()
    receiver = args[0].arg
    moves = {
        id(target)
        for node in ast.walk(method)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and _is_move_of(node.value, target)
    }
    written = set()
    for node in ast.walk(method):
        if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
            chain = _chain(node)
            if chain and chain[0] == receiver and len(chain) > 1 and id(node) not in moves:
                written.add(chain[1])
    return written


def _is_move_of(value: ast.AST, target: ast.Attribute) -> bool:
    """Whether ``value`` is ``target`` itself, moved or laid out again."""
    read = ast.Attribute(target.value, target.attr, ast.Load())
    return ast.dump(_unmoved(value)) == ast.dump(read)


def state_write_problem(
    target: ast.Attribute,
    value: ast.AST | None,
    receiver: str,
    tainted: frozenset[str],
    state: StateReads,
) -> str | None:
    """Why forward may not write ``value`` into ``target`` (an attribute chain rooted at
    ``receiver``; None: it may). ``tainted``: forward's inputs and the locals made from
    them; ``state``: what the class's methods write and read of their receiver."""
    if value is None:
        return "only a plain assignment of a value the call's data did not go into"
    moved = _unmoved(value)
    same = _is_move_of(value, target)
    for read in data_reads(value):
        root = _chain_root(read)
        if root in tainted:
            return f"the value reads `{root}`, which holds the call's data"
    for read in data_reads(value, metadata=True):  # the state's sizes are state too
        root = _chain_root(read)
        chain = _chain(read) or []
        if root != receiver:
            continue
        if len(chain) == 1:  # self.method(...): what the method reads of self
            called = _method_called(value, read)
            if called is None or state.reads.get(called) is None:
                return f"the value hands `{receiver}` to code whose reads are not followed"
            changed = state.reads[called] & state.written  # type: ignore[operator]
        else:
            changed = {chain[1]} & state.written
        if changed and not (same and read is moved):
            return f"the value reads `{receiver}.{min(changed)}`, which forward itself changes"
    return None


class StateReads:
    """What a class's methods do with their receiver: the attributes forward paths write
    (``written``), and per method the attributes it reads (None: it hands the receiver
    on, or calls another method of it, out of this analysis's sight)."""

    def __init__(self, methods: list[ast.FunctionDef | ast.AsyncFunctionDef], forward: set[int]):
        self.written = set().union(*(written_attributes(m) for m in methods if id(m) in forward))
        self.reads: dict[str, set[str] | None] = {m.name: _receiver_reads(m) for m in methods}


def _receiver_reads(method: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str] | None:
    args = [*method.args.posonlyargs, *method.args.args]
    if not args:
        return set()
    receiver = args[0].arg
    reads: set[str] = set()
    for statement in method.body:
        for read in data_reads(statement, metadata=True):
            chain = _chain(read) or []
            if chain[:1] == [receiver]:
                if len(chain) == 1:
                    return None
                reads.add(chain[1])
    return reads


def _method_called(value: ast.AST, receiver: ast.expr) -> str | None:
    """The method of ``receiver`` (a bare name read in ``value``) that ``value`` calls on it
    (``self.m(...)``: "m"); None when the receiver is used otherwise."""
    for node in ast.walk(value):
        func = getattr(node, "func", None)
        if (
            isinstance(node, ast.Call)
            and isinstance(func, ast.Attribute)
            and func.value is receiver
        ):
            return func.attr
    return None


def _unmoved(value: ast.AST) -> ast.AST:
    """``value`` without the moves applied to it: ``self.w`` for ``self.w.to(d).contiguous()``."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in _MOVES
    ):
        value = value.func.value
    return value


def _chain(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _chain_root(node: ast.AST) -> str | None:
    chain = _chain(node)
    return chain[0] if chain is not None else None
