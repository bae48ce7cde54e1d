"""The shape sets a candidate is checked on: which of the task's size constants to override,
and with what.

A KernelBench task sizes its problem with module-level constants (found statically,
:func:`~.taskfile.task_constants`); the child executes the task once per shape set with
those constants overridden (:func:`~.child.taskload.load_task`), so derived shapes follow.
The policy, per task (deterministic):

- Which constants are sizes: ints >= 2 that are not structure. Kernel sizes, strides,
  padding, dilation, groups, pooling, axes (``dim = 1``) and scalar parameters (scale,
  divisor, clamp bounds...) are recognised by name and never change; batch-like names
  (``batch_size``) shrink first; channel-like ones stay multiples of the task's groups
  (its constants, and the group counts written into its code: ``num_groups=4`` as a
  parameter's default, ``nn.GroupNorm(8, ...)``), two channels a group at least.
- Sizes the reference needs equal stay equal in every set, where the task has them
  equal: the channel counts of a convolution grouped by one of them (a depthwise
  ``groups=in_channels``), and the sizes two inputs meet where ``forward`` combines them
  as they come (``predictions * targets``: they broadcast). Other sizes the task has
  equal stay equal only in set 1 (set 2 shows a swapped height and width).
- On the CPU (interpreted Triton) the task's sizes are halved, largest first, until no
  size that is more than one axis of the inputs (a matmul's) is above ``max_dim``, no
  input tensor (``get_inputs()``, evaluated statically) holds more than ``max_elements``
  and the problem's volume (the product of its sizes and kernel extents: the work of a
  matmul, convolution or norm) is at most ``max_work``;
  no size goes below a floor (2 for a batch, 4 channels, else 8 and wide enough for the
  task's kernel and pooling windows; channels too where the inputs have no spatial axis
  for a window to slide over, as a pooling of a linear layer's features). Small tasks
  keep their own sizes. That is set 1.
- Set 2 changes every size of set 1 (from 4 up; batch sizes from 2): to an odd size
  about three quarters of it, all different where there is room above the floor, else
  to a larger one as long as the set stays within the budget (twice set 1 where that is
  over it). Code written for one shape, a block-size multiple or square inputs fails.
- Set 3, for a shrunk task: every size at its floor but the longest one of the inputs,
  as long as the budget allows (up to ``long_dim``, and odd), if that is at least twice
  its size in set 1: a kernel that assumes a row fits in one block fails there. Only a
  size that is one axis of the inputs holding it, and tied to no other, qualifies (a
  long ``M`` in ``A(M, K) @ B(K, M)`` would square the output).
- On a GPU: the task's own sizes, then the perturbed set.

Sets the reference itself fails on are skipped by the child with a note (``auto_shapes``).
Where it fails on all of them (a task that relies on sizes the policy changed apart, as
a LayerNorm over ``out_channels`` that matches a transposed convolution's output width
only at the task's own sizes), the fallback sets are checked instead: every size divided
by one power of two that divides them all (the least that fits the budget, and twice
that), so relations between the sizes that are linear hold (:func:`fallback_shape_sets`).
Parent side: nothing here executes the task.
"""

from __future__ import annotations

import ast
import functools
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from kernelflow.verification.child.taskload import split_key
from kernelflow.verification.taskfile import (
    NotStatic,
    Value,
    evaluate,
    parse_task,
    task_constants,
)

__all__ = ["CPU_BUDGET", "SizeBudget", "auto_shape_sets", "fallback_shape_sets", "input_shapes"]


@dataclass(frozen=True)
class SizeBudget:
    """How large a shape set may be on the CPU (see the module docstring)."""

    max_dim: int = 160  # a size that is more than one axis of the inputs (a matmul's)
    max_elements: int = 1 << 18  # any one input tensor
    max_work: int = 1 << 20  # product of all sizes and kernel extents
    long_dim: int = 1 << 14  # the long size of set 3


CPU_BUDGET = SizeBudget()

# Words of a constant's name (``pool_kernel_size`` -> pool, kernel, size) that make it
# structure or a scalar parameter rather than a size.
_FIXED_WORD = re.compile(
    r"kernel|strides?|pad(ding)?|dilation|groups?|(max|avg)?pool|axis|eps|momentum|p|dropout"
    r"|scal(e|ing)|factor|divi(sor|de)|multipl(ier|y)|value|clamp|min|max|slope|constant"
    r"|weight|bias|alpha|beta|threshold|margin|indices"
)
_AXIS_WORDS = frozenset({"dim", "dims"})  # ``dim = 1``: an axis; ``dim = 16384``: a size
_MAX_RANK = 8
_BATCH_WORDS = frozenset({"batch", "b", "bs"})
_CHANNEL_WORDS = frozenset(
    {"channels", "channel", "features", "feature", "hidden", "size", "classes", "heads"}
)
_GROUP_WORDS = frozenset({"groups", "group"})
_DILATION_WORDS = frozenset({"dilation"})
_POOL_WORDS = frozenset({"pool", "maxpool", "avgpool"})
_KERNEL_WORDS = _POOL_WORDS | {"kernel"}
# A batch size shrinks before any other size up to four times as large, a channel count
# before one up to twice as large: the spatial and feature sizes exercise the most code.
_BATCH_WEIGHT = 4
_CHANNEL_WEIGHT = 2
_MIN_CHANNELS = 4  # the least a channel count shrinks to (where the task has it larger)
_MIN_EXTENT = 8  # the least other sizes shrink to: room for a convolution and two pools
_BATCH_FLOOR = 2
_PERTURBED_FROM = 4  # set 2 changes sizes from 4 up (and batch sizes from 2)
_SET2_GROWTH = 2  # set 2 may be this much larger than set 1 where that is over budget

# torch factories in get_inputs() whose size arguments give an input's shape.
_SHAPE_ARGS = frozenset({"rand", "randn", "ones", "zeros", "empty"})


def _words(key: str) -> frozenset[str]:
    return frozenset(re.findall(r"[a-z]+", split_key(key)[0].lower()))


@dataclass(frozen=True)
class _Knob:
    """A size the policy may change."""

    key: str
    value: int  # the task's own
    weight: int  # shrinks before sizes this many times as large: batch 4, channels 2
    floor: int  # shrinking stops here (the task's own value if smaller)
    multiple: int  # stays a multiple of this (the task's groups, for channel counts)
    least: int  # set 2 goes no lower: the floor, but for channels 2 (2 a group)

    @property
    def batch(self) -> bool:
        return self.weight == _BATCH_WEIGHT


@dataclass(frozen=True)
class _Task:
    """A task's sizes, and how large the tensors and the work are for given sizes."""

    tree: ast.Module
    knobs: tuple[_Knob, ...]
    kernel_volume: int  # product of the kernel and pooling extents (the work per output)
    ties: tuple[tuple[str, ...], ...] = ()  # sizes the reference needs equal: in every set

    def shapes(self, sizes: dict[str, int]) -> list[tuple[int, ...]]:
        return input_shapes(self.tree, sizes)

    def elements(self, sizes: dict[str, int]) -> int:
        return max((math.prod(s) for s in self.shapes(sizes)), default=0)

    def work(self, sizes: dict[str, int]) -> int:
        return math.prod(sizes[k.key] for k in self.knobs) * self.kernel_volume

    def fits(self, sizes: dict[str, int], budget: SizeBudget) -> bool:
        return self.work(sizes) <= budget.max_work and self.elements(sizes) <= budget.max_elements

    def occurrences(self, key: str, sizes: dict[str, int]) -> list[int]:
        """How often ``key`` is a factor of each input's shape (doubling it doubles the
        input that many times)."""
        base = self.shapes(sizes)
        doubled = self.shapes({**sizes, key: sizes[key] * 2})
        if len(doubled) != len(base):
            return []
        return [
            round(math.log2(math.prod(d) / math.prod(b))) if math.prod(b) else 0
            for b, d in zip(base, doubled, strict=True)
        ]

    def units(self) -> list[tuple[tuple[str, ...], _Knob]]:
        """The sizes the policy changes apart, in the task's order: one knob, or the sizes
        tied together (the strictest of their limits)."""
        tie_of = {key: tie for tie in self.ties for key in tie}
        units = []
        for knob in self.knobs:
            keys = tie_of.get(knob.key, (knob.key,))
            if knob.key != keys[0]:
                continue
            members = [k for k in self.knobs if k.key in keys]
            merged = replace(
                knob,
                weight=min(k.weight for k in members),
                floor=max(k.floor for k in members),
                multiple=math.lcm(*(k.multiple for k in members)),
                least=max(k.least for k in members),
            )
            units.append((keys, merged))
        return units

    def single(self, key: str, sizes: dict[str, int]) -> bool:
        """``key`` is one axis of the inputs that hold it, all of one shape (a long row,
        not the ``M`` of ``A(M, K) @ B(K, M)``)."""
        counts = self.occurrences(key, sizes)
        shapes = self.shapes(sizes)
        holding = {shapes[i] for i, n in enumerate(counts) if n}
        return bool(holding) and all(n in (0, 1) for n in counts) and len(holding) == 1


@functools.lru_cache(maxsize=8)  # each check asks for its sets, then for its fallback sets
def _analyse(task_source: str) -> _Task | None:
    tree = parse_task(task_source)
    if tree is None:
        return None
    literals = task_constants(tree).literals
    rank = max((len(s) for s in input_shapes(tree, {})), default=3) - 2  # spatial axes
    windows = _Windows.of(literals, max(1, rank))
    groups = [v for key, v in literals.items() if _words(key) & _GROUP_WORDS and v >= 2]
    groups += _model_groups(tree)
    # Inputs without a spatial axis (batch x features) and a window to slide: it slides
    # over features (a pooling of a linear layer's outputs), which stay wide enough for it.
    feature_reach = windows.reach if rank <= 0 else 0
    knobs = []
    for key, value in literals.items():
        words = _words(key)
        if value < 2 or any(_FIXED_WORD.fullmatch(w) for w in words):
            continue
        if words & _AXIS_WORDS and value < _MAX_RANK:
            continue
        if words & _BATCH_WORDS:
            floor = min(value, _BATCH_FLOOR)
            knobs.append(_Knob(key, value, _BATCH_WEIGHT, floor, 1, floor))
        elif words & _CHANNEL_WORDS:
            multiple = math.lcm(1, *(g for g in groups if value % g == 0))
            # Two channels a group at least: a group of one normalises to nothing.
            least = max(2 * multiple if multiple > 1 else 2, feature_reach)
            floor = min(value, max(_MIN_CHANNELS, least))
            knobs.append(_Knob(key, value, _CHANNEL_WEIGHT, floor, multiple, min(value, least)))
        else:  # spatial, or unknown: wide enough for every window the task slides
            floor = min(value, max(_MIN_EXTENT, windows.reach))
            knobs.append(_Knob(key, value, 1, floor, 1, floor))
    task = _Task(tree, tuple(knobs), windows.volume)
    return replace(task, ties=_ties(task))


def _model_groups(tree: ast.Module) -> list[int]:
    """Group counts the task writes into its code rather than as size constants: a
    parameter's default (``def __init__(self, ..., num_groups=4)``) and a literal argument
    (``groups=8``, ``nn.GroupNorm(8, channels)``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            params = [*node.posonlyargs, *node.args]
            pairs = [
                *zip(params[len(params) - len(node.defaults) :], node.defaults, strict=True),
                *zip(node.kwonlyargs, node.kw_defaults, strict=True),
            ]
            found += [_int(d) for a, d in pairs if _words(a.arg) & _GROUP_WORDS]
        elif isinstance(node, ast.Call):
            found += [_int(k.value) for k in node.keywords if _words(k.arg or "") & _GROUP_WORDS]
            name = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if name == "GroupNorm" and node.args:
                found.append(_int(node.args[0]))
    return [g for g in found if g is not None and g >= 2]


def _int(node: ast.expr | None) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _ties(task: _Task) -> tuple[tuple[str, ...], ...]:
    """Sizes the reference needs equal wherever the task has them equal, so every set keeps
    them equal (the policy otherwise makes set 2's sizes differ and stretches one alone in
    set 3): the channel counts of a convolution grouped by one of them (a depthwise
    ``groups=in_channels``: its output channels are a multiple of it), and the sizes two
    inputs meet where ``forward`` combines them as they are (``predictions * targets``,
    of shapes ``(batch_size, n)`` and ``(batch_size,)`` with ``n`` the batch size: they
    broadcast, aligned on their last axes)."""
    own = {k.key: k.value for k in task.knobs}
    channels = {k.key for k in task.knobs if k.weight == _CHANNEL_WEIGHT}
    links = [
        {key} | {c for c in channels if own[c] == own[key]} for key in _group_sizes(task.tree, own)
    ]
    axes = _axis_keys(task, own)
    for pair in _broadcast_pairs(task.tree):
        first, second = (axes[i] if i < len(axes) else None for i in pair)
        if first is not None and second is not None:
            for a, b in zip(reversed(first), reversed(second), strict=False):
                if a and b and a != b and own[a] == own[b]:
                    links.append({a, b})
    merged: list[set[str]] = []
    for link in links:
        for joined in [m for m in merged if m & link]:
            merged.remove(joined)
            link |= joined
        merged.append(link)
    order = list(own)
    return tuple(tuple(sorted(m, key=order.index)) for m in merged if len(m) > 1)


def _broadcast_pairs(tree: ast.Module) -> set[tuple[int, int]]:
    """The inputs (by position) that ``Model.forward`` combines with an arithmetic
    operator as they come (``predictions * targets``; a parameter it rebinds, as in
    ``x = self.linear(x)``, is no longer its input)."""
    forward = _method(tree, "Model", "forward")
    if forward is None:
        return set()
    rebound = {
        n.id for n in ast.walk(forward) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
    }
    position = {a.arg: i for i, a in enumerate(forward.args.args[1:]) if a.arg not in rebound}
    pairs = set()
    for node in ast.walk(forward):
        if isinstance(node, ast.BinOp) and not isinstance(node.op, ast.MatMult):
            left, right = (getattr(side, "id", None) for side in (node.left, node.right))
            if left in position and right in position and left != right:
                pairs.add((position[left], position[right]))
    return pairs


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    return None


def _returned(tree: ast.Module, name: str) -> list[ast.expr]:
    """The elements of the list the module's function ``name`` returns, with a name the
    function assigned replaced by what it assigned (``A = torch.rand(N); return [A]``)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            assigned = {
                target.id: stmt.value
                for stmt in node.body
                if isinstance(stmt, ast.Assign)
                for target in stmt.targets
                if isinstance(target, ast.Name)
            }
            for stmt in node.body:
                if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.List | ast.Tuple):
                    return [
                        assigned.get(e.id, e) if isinstance(e, ast.Name) else e
                        for e in stmt.value.elts
                    ]
    return []


def _group_sizes(tree: ast.Module, own: dict[str, int]) -> set[str]:
    """The size constants the model passes as a ``groups=`` argument (``groups=in_channels``):
    named directly, through a module-level alias (``groups = in_channels``), or through
    the ``__init__`` parameter that ``get_init_inputs()`` fills with them (by position)."""
    init = _method(tree, "Model", "__init__")
    params = [a.arg for a in init.args.args[1:]] if init is not None else []
    passed = {
        param: value.id
        for param, value in zip(params, _returned(tree, "get_init_inputs"), strict=False)
        if isinstance(value, ast.Name)
    }
    aliases = {
        target.id: node.value.id
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.keyword)
            and node.arg == "groups"
            and isinstance(node.value, ast.Name)
        ):
            name = passed.get(node.value.id, node.value.id)
            name = aliases.get(name, name)
            if name in own:
                found.add(name)
    return found


def _axis_keys(task: _Task, sizes: dict[str, int]) -> list[tuple[str | None, ...] | None]:
    """For each input ``get_inputs()`` returns (by position; None where its shape does not
    follow statically), the size each axis is (None where it is no one size: a fixed
    extent, or one computed from sizes)."""

    def shapes(values: dict[str, Value]) -> list[tuple[int, ...] | None]:
        found = []
        for element in _returned(task.tree, "get_inputs"):
            calls = [c for c in ast.walk(element) if isinstance(c, ast.Call)]
            shape = None
            for call in calls:
                try:
                    shape = _shape_of(call, values)
                except NotStatic:
                    shape = None
                if shape is not None:
                    break
            found.append(shape)
        return found

    base = shapes(task_constants(task.tree, sizes).values)
    axes: list[list[str | None]] = [[None] * len(s) if s else [] for s in base]
    counts: list[list[int]] = [[0] * len(s) if s else [] for s in base]
    for knob in task.knobs:
        moved = shapes(task_constants(task.tree, {**sizes, knob.key: sizes[knob.key] + 1}).values)
        for i, (before, after) in enumerate(zip(base, moved, strict=True)):
            if before is None or after is None or len(before) != len(after):
                continue
            for axis, (b, a) in enumerate(zip(before, after, strict=True)):
                if a != b:
                    counts[i][axis] += 1
                    axes[i][axis] = knob.key if (b, a) == (sizes[knob.key], b + 1) else None
    return [
        tuple(key if n == 1 else None for key, n in zip(keys, ns, strict=True))
        if shape is not None
        else None
        for shape, keys, ns in zip(base, axes, counts, strict=True)
    ]


@dataclass(frozen=True)
class _Windows:
    """The windows a task slides (convolution kernels, pooling), from its fixed constants."""

    reach: int  # the input extent they need, chained: sum of (k - 1) * dilation + 1
    volume: int  # the work per output they add: product of their extents

    @classmethod
    def of(cls, literals: dict[str, int], rank: int) -> _Windows:
        dilation = max(
            (v for key, v in literals.items() if _words(key) & _DILATION_WORDS), default=1
        )
        # One window per operation: ``kernel_size = 3`` and ``pool_kernel_size = 2`` are
        # two, ``kernel_size_h = 3`` and ``kernel_size_w = 7`` (or a tuple) one.
        extents: dict[bool, list[int]] = {}
        for key, value in literals.items():
            words = _words(key)
            if words & _KERNEL_WORDS and value >= 1:
                extents.setdefault(bool(words & _POOL_WORDS), []).append(value)
        reach = sum((max(e) - 1) * dilation + 1 for e in extents.values())
        volume = math.prod(e[0] ** rank if len(e) == 1 else math.prod(e) for e in extents.values())
        return cls(reach, volume)


def input_shapes(tree: ast.Module, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    """The shapes of the tensors ``get_inputs()`` makes with torch.rand/randn/randint/...
    when the task runs with ``sizes``, as far as they follow statically (others are left
    out)."""
    names = task_constants(tree, sizes).values
    shapes = []
    for call in _factory_calls(tree):
        try:
            shape = _shape_of(call, names)
        except NotStatic:
            continue
        if shape is not None:
            shapes.append(shape)
    return shapes


def _factory_calls(tree: ast.Module) -> Iterator[ast.Call]:
    """The calls of ``get_inputs()`` in the order they are written (``ast.walk`` alone would
    put the call in ``torch.randn(...) * 2`` after a ``torch.randint(...)`` written later)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_inputs":
            calls = [call for call in ast.walk(node) if isinstance(call, ast.Call)]
            yield from sorted(calls, key=lambda call: (call.lineno, call.col_offset))


def _shape_of(call: ast.Call, names: dict[str, Value]) -> tuple[int, ...] | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    size_kw = next((k.value for k in call.keywords if k.arg == "size"), None)
    if name in _SHAPE_ARGS:
        args = [size_kw] if size_kw is not None else call.args
    elif name == "randint":  # randint([low,] high, size)
        args = [size_kw] if size_kw is not None else call.args[1:][-1:]
    else:
        return None
    dims: list[Value] = []
    for arg in args:
        value = evaluate(arg.value if isinstance(arg, ast.Starred) else arg, names)
        dims.extend(value if isinstance(value, tuple) else [value])
    sizes = [d for d in dims if isinstance(d, int) and not isinstance(d, bool) and d >= 0]
    if not dims or len(sizes) != len(dims):
        raise NotStatic
    return tuple(sizes)


def auto_shape_sets(
    task_source: str, device: str, budget: SizeBudget = CPU_BUDGET
) -> list[dict[str, int]]:
    """The shape sets to check a candidate on: size overrides for the task, one dict per
    set, each naming the sizes that differ from the task's own (``{}``: the task's own
    sizes). See the module docstring for the policy; ``budget`` applies on the CPU."""
    task = _analyse(task_source)
    if task is None or not task.knobs:
        return [{}]
    own = {k.key: k.value for k in task.knobs}
    base = _shrunk(task, budget) if device == "cpu" else own
    candidates = [base, _perturbed(task, base, budget if device == "cpu" else None)]
    if base != own:
        candidates.append(_long(task, base, budget))
    sets: list[dict[str, int]] = []
    for sizes in candidates:
        changed = {key: v for key, v in sizes.items() if v != own[key]}
        if changed not in sets:
            sets.append(changed)
    return sets


def fallback_shape_sets(
    task_source: str, device: str, budget: SizeBudget = CPU_BUDGET
) -> list[dict[str, int]]:
    """The sets checked where the reference fails on every set of :func:`auto_shape_sets`
    (on the CPU): the task's sizes all divided by the least power of two that divides each
    of them and brings the set within ``budget`` (the largest such if none does), and by
    twice that where it divides them too (code written for one shape fails there). None
    where no power of two divides every size, or on a GPU (the task's own sizes are set 1)."""
    task = _analyse(task_source)
    if device != "cpu" or task is None or not task.knobs:
        return []
    common = math.gcd(*(k.value for k in task.knobs))
    factors = [2**n for n in range(1, common.bit_length()) if common % 2**n == 0]
    if not factors:
        return []
    first = next((f for f in factors if task.fits(_scaled(task, f), budget)), factors[-1])
    return [_scaled(task, f) for f in (first, 2 * first) if f in factors]


def _scaled(task: _Task, factor: int) -> dict[str, int]:
    return {k.key: k.value // factor for k in task.knobs}


def _shrunk(task: _Task, budget: SizeBudget) -> dict[str, int]:
    """The task's sizes halved until within ``budget``: first those above ``max_dim`` that
    are no single axis of the inputs (a matmul's sizes: the work grows with their cube,
    an output with their square), then the largest (batch sizes weighted up) until the
    tensors and the work fit. Sizes the task has equal stay equal: a task may rely on it
    (a depthwise convolution's channels, a loss whose targets broadcast to its inputs)."""
    sizes = {k.key: k.value for k in task.knobs}
    cohorts: dict[int, list[_Knob]] = {}
    for knob in task.knobs:
        cohorts.setdefault(knob.value, []).append(knob)
    shrinking = [_Cohort.of(members) for members in cohorts.values()]
    for cohort in shrinking:
        if all(task.single(key, sizes) for key in cohort.keys):
            continue
        while sizes[cohort.keys[0]] > budget.max_dim and cohort.halve(sizes):
            pass
    while not task.fits(sizes, budget):
        shrinkable = [c for c in shrinking if c.halved(sizes) < sizes[c.keys[0]]]
        if not shrinkable:
            break  # at the floors: the smallest this task allows
        max(shrinkable, key=lambda c: sizes[c.keys[0]] * c.weight).halve(sizes)
    return sizes


@dataclass(frozen=True)
class _Cohort:
    """Sizes the task has equal, shrunk together."""

    keys: tuple[str, ...]
    floor: int
    multiple: int
    weight: int  # its members' least

    @classmethod
    def of(cls, knobs: list[_Knob]) -> _Cohort:
        return cls(
            tuple(k.key for k in knobs),
            max(k.floor for k in knobs),
            math.lcm(*(k.multiple for k in knobs)),
            min(k.weight for k in knobs),
        )

    def halved(self, sizes: dict[str, int]) -> int:
        return max(self.floor, sizes[self.keys[0]] // 2 // self.multiple * self.multiple)

    def halve(self, sizes: dict[str, int]) -> bool:
        """Halve the cohort's sizes in ``sizes``; whether they shrank."""
        new = self.halved(sizes)
        if new == sizes[self.keys[0]]:
            return False
        sizes.update(dict.fromkeys(self.keys, new))
        return True


def _perturbed(task: _Task, sizes: dict[str, int], budget: SizeBudget | None) -> dict[str, int]:
    """Every size of ``sizes`` changed where it can be: about three quarters and odd,
    different from the others where there is room above the least valid size, larger
    where there is none, as long as the set stays within ``budget`` (or within twice
    ``sizes`` where that is larger)."""
    result = dict(sizes)
    wanted: dict[tuple[str, ...], int] = {}
    taken: set[int] = set()
    for keys, knob in task.units():
        size = sizes[keys[0]]
        if size < (_BATCH_FLOOR if knob.batch else _PERTURBED_FROM):
            continue
        if knob.multiple > 1:  # a channel count of groups: the neighbouring multiple
            below = size - knob.multiple
            new = below if below >= knob.least else size + knob.multiple
        else:
            target = size * 3 // 4
            new = (
                _odd_near(target, knob.least, size - 1, taken)
                or _odd_near(target, knob.least, size - 1, set())
                or _odd_near(size + 1, size + 1, 2 * size + 1, taken)
                or size + 1
            )
            taken.add(new)
        if new < size:
            result.update(dict.fromkeys(keys, new))
        else:
            wanted[keys] = new
    # Growing sizes make the set larger: keep the growths that stay within the limit,
    # the smallest first.
    limit = None
    if budget is not None:
        limit = replace(
            budget,
            max_work=max(budget.max_work, _SET2_GROWTH * task.work(sizes)),
            max_elements=max(budget.max_elements, _SET2_GROWTH * task.elements(sizes)),
        )
    for keys in sorted(wanted, key=lambda k: wanted[k] / sizes[k[0]]):
        grows = {**result, **dict.fromkeys(keys, wanted[keys])}
        if limit is None or task.fits(grows, limit):
            result = grows
    return result


def _odd_near(target: int, low: int, high: int, taken: set[int]) -> int | None:
    """The odd number in ``[low, high]`` nearest ``target`` (the lower of two) that is not
    ``taken``, if any."""
    for distance in range(max(target - low, high - target) + 1):
        for candidate in (target - distance, target + distance):
            if low <= candidate <= high and candidate % 2 and candidate not in taken:
                return candidate
    return None


def _long(task: _Task, sizes: dict[str, int], budget: SizeBudget) -> dict[str, int]:
    """Every size at its floor but the longest single axis of the inputs (tied to no
    other size), as long as the budget allows (odd); ``sizes`` itself if no axis gets at
    least twice as long."""
    floors = {key: knob.floor for keys, knob in task.units() for key in keys}
    alone = [knob for keys, knob in task.units() if len(keys) == 1]  # tied: no long one
    eligible = [k for k in alone if not k.batch and task.single(k.key, sizes)]
    if not eligible:
        return sizes
    knob = max(eligible, key=lambda k: k.value)
    low, high = knob.floor, min(knob.value, budget.long_dim)
    while low < high:  # the longest that fits
        middle = (low + high + 1) // 2
        if task.fits({**floors, knob.key: middle}, budget):
            low = middle
        else:
            high = middle - 1
    length = low - 1 if low % 2 == 0 and low - 1 >= knob.floor else low
    if length < 2 * sizes[knob.key]:
        return sizes
    return {**floors, knob.key: length}
