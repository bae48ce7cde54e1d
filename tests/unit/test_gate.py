"""The static gate (kernelflow.verification.gate) on its own: fast, no sandbox, nothing
run. Every escape is tried in every place code can hide in a candidate module (module
level, class body, __init__, forward, a helper, a nested function, a lambda, a default
argument, a decorator, a @triton.jit body), and every legitimate candidate of the
examples still passes."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import yaml

from kernelflow.verification.gate import MAX_VIOLATIONS, check_candidate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CANDIDATES = EXAMPLES / "candidates"
RELU_TASK = (EXAMPLES / "tasks" / "relu.py").read_text()

# A correct ReLU candidate with a slot ({...}) in each place code can hide in. A position
# fills one slot with `value = <expression>` (or the expression itself where a statement
# does not fit) and leaves the others empty; {x} in an expression is a tensor in reach.
TEMPLATE = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl
{module}

@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    {jit}
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def helper(x):
    {helper}
    return x
{decorated}

class ModelNew(nn.Module):
    {class_body}

    def __init__(self):
        super().__init__()
        {init}

    def forward(self, x{default}):
        {forward}
        y = torch.empty_like(helper(x))
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""
SLOTS = ("module", "jit", "helper", "decorated", "class_body", "init", "default", "forward")
# position -> (slot, how the expression is placed, the tensor in reach)
POSITIONS = {
    "module": ("module", "value = {e}", "torch.empty(1)"),
    "class_body": ("class_body", "value = {e}", "torch.empty(1)"),
    "init": ("init", "value = {e}", "torch.empty(1)"),
    "forward": ("forward", "value = {e}", "x"),
    "helper": ("helper", "value = {e}", "x"),
    "nested": ("forward", "def inner():\n            return {e}\n        inner()", "x"),
    "lambda": ("forward", "value = (lambda: {e})", "x"),
    "default": ("default", ", value={e}", "torch.empty(1)"),
    "decorator": ("decorated", "\n@({e})\ndef decorated():\n    pass\n", "torch.empty(1)"),
    "jit": ("jit", "value = {e}", "x_ptr"),
}
# Where the gate's stricter rules apply instead of (or beside) the escape's own.
STRICT = {"lambda": "callback", "jit": "kernel_body"}


def place(position: str, expression: str) -> str:
    slot, form, tensor = POSITIONS[position]
    filled = dict.fromkeys(SLOTS, "")
    filled[slot] = form.format(e=expression.replace("{x}", tensor))
    return TEMPLATE.format(**filled)


def rules(source: str, task: str = RELU_TASK, backend: str = "triton") -> set[str]:
    return {v.rule for v in check_candidate(source, backend=backend, task_source=task)}


def with_import(statement: str, source: str) -> str:
    return source.replace("import torch\n", f"{statement}\nimport torch\n", 1)


PRELUDE = TEMPLATE.format(**dict.fromkeys(SLOTS, "")).split("\n\ndef helper")[0]


def module(body: str, snippet: str = "") -> str:
    """A candidate: the imports, the ReLU kernel and ``body`` (dedented), ``snippet`` in
    place of its line ``SNIPPET`` (indented as that line)."""
    text = textwrap.dedent(body)
    if snippet:
        line = next(line for line in text.splitlines() if line.strip() == "SNIPPET")
        text = text.replace(line, textwrap.indent(snippet, line[: line.index("SNIPPET")]))
    return f"{PRELUDE}\n\n{text}"


FORWARD = """
class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""

# --------------------------------------------------------------------------- escapes

ESCAPES = {  # name: (expression, the rule refusing it)
    # modules reached through allowed ones
    "torch.importlib": ('torch.importlib.import_module("builtins")', "module_escape"),
    "torch.os": ('torch.os.system("true")', "module_escape"),
    "torch.inspect": ("torch.inspect.stack()", "module_escape"),
    "torch.threading": ("torch.threading.Thread", "module_escape"),
    "torch.sys frames": ("torch.sys._current_frames()", "introspection"),
    "torch.multiprocessing": ("torch.multiprocessing.Process", "module_escape"),
    "torch private module": ("torch._utils", "module_escape"),
    "torch._C": ("torch._C._get_tracing_state", "introspection"),
    "torch.ops": ("torch.ops.aten.relu", "introspection"),
    "torch.library": ("torch.library.Library", "introspection"),
    "torch.torch": ("torch.torch.os", "module_escape"),
    "torch.Tensor methods": ("torch.Tensor.relu", "torch_compute|module_escape"),
    "cpp_extension": ("torch.utils.cpp_extension.load_inline", "file_io"),
    "triton.runtime": ("triton.runtime.driver", "module_escape"),
    "triton.testing": ("triton.testing.do_bench", "module_escape"),
    "tl.core": ("tl.core.builtins.exec", "module_escape"),
    "tl.math.core": ("tl.math.core", "module_escape"),
    "tl.extra loader": ("tl.extra.module_from_spec", "module_escape"),
    "F.torch": ("torch.nn.functional.torch", "module_escape|torch_compute"),
    "nn.init.math": ("torch.nn.init.math", "module_escape"),
    "module as value": ("[torch, tl]", "module_escape"),
    # dynamic code and lookups
    "__import__": ('__import__("os")', "introspection"),
    "exec": ('exec("1")', "introspection"),
    "eval": ('eval("1")', "introspection"),
    "compile": ('compile("1", "f", "exec")', "introspection"),
    "globals": ("globals()", "introspection"),
    "vars": ("vars()", "introspection"),
    "dir": ("dir()", "introspection"),
    "getattr computed": ('getattr(torch, "re" + "lu")', "introspection"),
    "getattr literal": ('getattr({x}, "numpy")', "introspection"),
    "hasattr": ('hasattr(torch, "os")', "introspection|module_escape"),
    "hasattr dunder": ('hasattr({x}, "__class__")', "introspection"),
    "hasattr computed": ('hasattr({x}, "f_" + "back")', "introspection"),
    "getattr as value": ("[getattr]", "introspection"),
    "type() class": ('type("T", (), {})', "introspection"),
    "format fields": ('"{0.__class__}".format({x})', "introspection"),
    "format computed": ('("{" + "0.x}").format({x})', "introspection"),
    "unbound builtin": ("dict.setdefault", "introspection"),
    # dunders
    "__class__": ("{x}.__class__", "introspection"),
    "__bases__": ("().__class__.__bases__[0].__subclasses__()", "introspection"),
    "__globals__": ("(lambda: 0).__globals__", "introspection"),
    "__code__": ("(lambda: 0).__code__", "introspection"),
    "__builtins__": ("__builtins__", "introspection"),
    "__array__": ("{x}.__array__()", "introspection"),
    "__array_namespace__": ("{x}.__array_namespace__", "introspection"),
    "__torch_function__": ("{x}.__torch_function__", "introspection"),
    "__dict__": ("{x}.__dict__", "introspection"),
    "__loader__": ("__loader__", "introspection"),
    # frames
    "f_back": ("{x}.f_back", "introspection"),
    # dtypes built at run time
    "tl.dtype computed": ('tl.dtype("fp" + "16")', "precision_downgrade"),
    "tl.dtype keyword": ('tl.dtype(name="fp" + "16")', "precision_downgrade"),
    "torch half": ("torch.half", "precision_downgrade"),
    "tl fp8": ("tl.float8e5", "precision_downgrade"),
    "fp16 string": ('"fp16"', "precision_downgrade"),
    ".type computed": ('{x}.type("torch." + "HalfTensor")', "precision_downgrade"),
    # files
    "torch.load": ('torch.load("out.pt")', "file_io"),
}


@pytest.mark.parametrize("position", POSITIONS)
def test_the_template_passes_in_every_position(position: str) -> None:
    assert rules(place(position, "1")) == set()


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("escape", ESCAPES)
def test_an_escape_is_refused_in_every_position(escape: str, position: str) -> None:
    expression, accepted = ESCAPES[escape]  # accepted: rule|rule (by where it runs)
    found = rules(place(position, expression))
    assert found & {*accepted.split("|"), STRICT.get(position, "")}, found


@pytest.mark.parametrize(
    ("position", "rule"),
    [
        ("module", "torch_compute"),
        ("class_body", "torch_compute"),
        ("forward", "torch_compute"),
        ("helper", "torch_compute"),
        ("nested", "torch_compute"),
        ("default", "torch_compute"),
        ("decorator", "torch_compute"),
        ("lambda", "callback"),
        ("jit", "kernel_body"),
        ("init", "module_escape"),  # not a name __init__ needs either
    ],
)
def test_torch_compute_named_as_a_value_is_refused(position: str, rule: str) -> None:
    assert rule in rules(place(position, "torch.relu"))


@pytest.mark.parametrize("expression", ["torch.randn(4)", "torch.cat([{x}, {x}])"])
def test_init_may_prepare_parameters_with_torch(expression: str) -> None:
    assert rules(place("init", expression)) == set()
    assert "torch_compute" in rules(place("forward", expression))


@pytest.mark.parametrize(
    ("statement", "rule"),
    [
        ("from torch import os", "module_escape"),
        ("from torch import inspect as looking", "module_escape"),
        ("import torch.utils.cpp_extension", "file_io"),
        ("from triton.runtime import driver", "module_escape"),
        ("from triton.language import core", "module_escape"),
        ("from torch import _C", "introspection"),
        ("from typing import sys", "module_escape"),
        ("from torch.nn.functional import importlib", "module_escape"),
        ("import collections", "forbidden_import"),
        ("from collections import OrderedDict", "forbidden_import"),
        ("import importlib", "forbidden_import"),
        ("from torch import relu", "torch_compute"),
        ("from torch import float16 as full", "precision_downgrade"),
        ("from triton.language import float16", "precision_downgrade"),
    ],
)
def test_imports_reach_only_allowed_names(statement: str, rule: str) -> None:
    assert rule in rules(with_import(statement, place("module", "1")))


@pytest.mark.parametrize(
    "statement",
    [
        "import torch.nn.functional as F",
        "from torch.nn import functional as F",
        "from torch import nn, Tensor",
        "from triton.language.extra import libdevice",
        "from triton.language.extra.cuda import libdevice",
        "from typing import Optional",
        "from collections.abc import Sequence",
        "from math import sqrt",
    ],
)
def test_allowed_imports_pass(statement: str) -> None:
    assert rules(with_import(statement, place("module", "1"))) == set()


def test_an_imported_function_is_judged_like_its_path() -> None:
    source = module(
        """
        from torch.nn.functional import relu

        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
                return relu(x)
        """
    )
    assert "torch_compute" in rules(source)


# --------------------------------------------------------------------------- caching

CACHES = {
    "setdefault on self": "self.store.setdefault(1, y)",
    "item on self": "self.store[1] = y",
    "update on self": "self.store.update({1: y})",
    "alias of self's dict": "d = self.store\nd[1] = y",
    "getter of self's dict": "self.store.get(1).append(y)",
    "class dict via type()": "type(self).shared[1] = y",
    "class dict by name": "ModelNew.shared[1] = y",
    "module dict": "_STORE[1] = y",
    "module list": "_STORE_LIST.append(y)",
    "in-place into a kept buffer": "self.buffer.copy_(y)",
    "kept buffer through a loop": "for b in [self.buffer]:\n    b.copy_(y)",
    "register_buffer": 'self.register_buffer("out", y)',
    "a view of a kept buffer": "view = self.buffer.view(-1)\nview.copy_(y.view(-1))",
    "a list of kept values": "list(self.store.values())[0].copy_(y)",
    "generator state": "(yield y)",
    "attribute on self": "self.last = y",
    "function attribute": "helper.last = y",
    "default argument": "_seen[1] = y",
    "unbound dict method": "dict.setdefault(self.store, 1, y)",
    "global": "global _STORE",
}


@pytest.mark.parametrize("name", ["none", *CACHES])
def test_forward_may_not_keep_results(name: str) -> None:
    source = module(
        """
        _STORE = {}
        _STORE_LIST = []


        def helper(x):
            return x


        class ModelNew(nn.Module):
            shared = {}

            def __init__(self):
                super().__init__()
                self.store = {}
                self.buffer = torch.empty(16, 1000)

            def forward(self, x, _seen={}):
                y = torch.empty_like(x)
                relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
                SNIPPET
                return y
        """,
        CACHES.get(name, "pass"),
    )
    found = rules(source)
    if name == "none":
        assert found == set()  # the same state, left alone by forward
        return
    assert found & {"caching", "monkey_patch", "introspection"}, found
    if name not in ("function attribute", "unbound dict method"):
        assert "caching" in found


def test_a_helper_may_not_write_into_its_arguments() -> None:
    source = module(
        """
        def keep(store, y):
            store.append(y)
        """
    )
    called = FORWARD.replace("return y", "keep([], y)\n        return y")
    assert "caching" in rules(source + called)


WITH_INIT = """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        SNIPPET

    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


@pytest.mark.parametrize(
    ("body", "write"),
    [
        ("SNIPPET\n" + FORWARD, "T = torch.Tensor\nT.allclose = print"),
        ("SNIPPET\n" + FORWARD, "type(torch.empty(1)).allclose = print"),
        (WITH_INIT, "T = torch.Tensor\nT.allclose = print"),
        (WITH_INIT, "self.norm = nn.LayerNorm(4)\nnorm = self.norm\nnorm.forward = print"),
    ],
)
def test_patching_through_another_name_is_refused(body: str, write: str) -> None:
    assert "monkey_patch" in rules(module(body, write))


def test_init_sets_attributes_on_self() -> None:
    assert rules(module(WITH_INIT, "self.norm = nn.LayerNorm(4)\nself.norm.eps = 1e-6")) == set()


def test_a_grid_object_may_not_write_into_the_launch_arguments() -> None:
    """An nn.Module used as a grid runs inside the launch with the arguments in ``meta``."""
    body = """
    class Grid(nn.Module):
        def forward(self, meta):
            out = list(meta.values())[1]
            out.copy_(meta["x_ptr"].clamp_min(0))
            return (1,)
    """
    assert "caching" in rules(module(body) + FORWARD)


def test_a_closure_cache_is_refused() -> None:
    source = module(
        """
        def make():
            results = {}

            def run(x):
                results[tuple(x.shape)] = x
                return x

            return run


        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
                return make()(y)
        """
    )
    assert "callback" in rules(source)  # `run` handed out as a value: launch-time rules


def test_writes_into_values_made_in_the_call_pass() -> None:
    source = module(
        """
        class ModelNew(nn.Module):
            def __init__(self):
                super().__init__()
                self.sizes = []
                self.sizes.append(1024)

            def forward(self, x):
                y = torch.empty_like(x)
                y.fill_(0.0)
                parts = []
                parts.append(y)
                shape = {}
                shape["n"] = x.numel()
                relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, shape["n"], BLOCK=1024)
                return parts[0]
        """
    )
    assert rules(source) == set()


# --------------------------------------------------------------------------- launch callbacks


LAUNCHING = """
def helper(x):
    return x


class ModelNew(nn.Module):
    def grid_of(self, meta):
        return (int(self.w.sum()),)

    def forward(self, x):
        y = torch.empty_like(x)

        def grid(meta):
            return (x.clamp_min(0).numel(),)

        SNIPPET
        relu_kernel[(1,)](x, y, 0, BLOCK=1024)
        return y
"""


@pytest.mark.parametrize(
    "launch",
    [
        "pass",
        "relu_kernel[lambda meta: (y.copy_(x.clamp_min(0)), 1)[1:]](x, y, 0, BLOCK=1024)",
        "relu_kernel[lambda meta: (torch.relu(x, out=y), 1)[1:]](x, y, 0, BLOCK=1024)",
        "relu_kernel[grid](x, y, 0, BLOCK=1024)",
        "relu_kernel[self.grid_of](x, y, 0, BLOCK=1024)",
        "relu_kernel.add_pre_run_hook(self.grid_of)",
        "relu_kernel.fn(x, y, 0, 1024)",
        "k = relu_kernel",
        "relu_kernel.run(x, y, 0, grid=(1,), warmup=False, BLOCK=1024)",
        "triton.jit(helper)",
    ],
)
def test_code_run_inside_a_launch_is_refused(launch: str) -> None:
    found = rules(module(LAUNCHING, launch))
    if launch == "pass":
        assert found == set()  # the same functions, launched from forward and called
    else:
        assert found & {"callback", "kernel_body"}, found


@pytest.mark.parametrize(
    "decorator",
    [
        '@triton.heuristics({"EVEN": lambda args: args["x_ptr"].copy_(args["y_ptr"]) is None})',
        "@triton.autotune(configs=[triton.Config({}, pre_hook=print)], key=[])",
        "@triton.autotune(configs=[], key=[], prune_configs_by={'early_config_prune': print})",
        "@triton.jit(launch_metadata=print)",
    ],
)
def test_hooks_in_kernel_decorators_are_refused(decorator: str) -> None:
    source = module(FORWARD).replace("@triton.jit\n", f"{decorator}\n@triton.jit\n", 1)
    assert "callback" in rules(source)


def test_launch_arithmetic_passes() -> None:
    source = module(
        """
        @triton.autotune(configs=[triton.Config({"B": 128}, num_warps=4)], key=["n"])
        @triton.heuristics({"EVEN": lambda args: args["n"] % args["B"] == 0})
        @triton.jit
        def tuned_kernel(x_ptr, y_ptr, n, EVEN: tl.constexpr, B: tl.constexpr):
            offs = tl.program_id(0) * B + tl.arange(0, B)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                n = x.numel()
                grid = lambda meta: (triton.cdiv(n, meta["B"]), max(1, x.shape[0] // 64))
                tuned_kernel[grid](x, y, n)
                return y
        """
    )
    assert rules(source) == set()


@pytest.mark.parametrize(
    ("klass", "rule"),
    [
        ("class Lazy(torch.Tensor):\n    pass", "callback"),
        ("class P:\n    def data_ptr(self):\n        return 0", "callback"),
        ("class P(nn.Module):\n    def __torch_function__(self):\n        pass", "callback"),
        ("class P:\n    def __index__(self):\n        return 0", "callback"),
        ("class P(nn.Module):\n    def _call_impl(self, *a):\n        pass", "callback"),
        ("class P(metaclass=type):\n    pass", "callback"),
        ("def __getattr__(name):\n    return 0", "callback"),
    ],
)
def test_classes_may_not_hook_into_torch_or_triton(klass: str, rule: str) -> None:
    assert rule in rules(module(klass + "\n\n" + FORWARD))


def test_a_decorator_of_the_candidates_own_is_refused() -> None:
    source = module(
        """
        def remember(forward):
            return forward


        class ModelNew(nn.Module):
            @remember
            def forward(self, x):
                y = torch.empty_like(x)
                relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
                return y
        """
    )
    assert "caching" in rules(source)


# --------------------------------------------------------------------------- kernel bodies


@pytest.mark.parametrize(
    "line",
    [
        "pass",
        "torch.relu(x_ptr)",
        "print(n)",
        "sum([n, n])",
        "helper(n)",
        "X.copy_(x_ptr)",
        "X.relu()",
        "x_ptr.numpy()",
        "n[0] = 1",
        "z = lambda: 0",
        "import math",
        "z = [i for i in range(4)]",
        "z = {1: 2}",
        "z = tl.reduce(offs, 0, X)",
        "z = triton.Config({})",  # triton.cdiv is arithmetic: test_gate_precision
        "z = X[n]",
        "z = X.value.exp()",
        "z = x_ptr.dtype.exp()",
        "z = x_ptr.data.sum()",
        "relu_kernel[(1,)](x_ptr, y_ptr, n, BLOCK=BLOCK)",
        "with tl.static_range(1):\n    pass",
    ],
)
def test_a_kernel_body_holds_only_the_triton_language(line: str) -> None:
    source = module(
        """
        def helper(n):
            return n


        @triton.jit
        def other_kernel(x_ptr, y_ptr, n, X: tl.constexpr, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            SNIPPET
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
        """,
        line,
    )
    source += FORWARD
    if line == "pass":
        assert rules(source) == set()
    else:
        assert "kernel_body" in rules(source)


def test_a_kernel_under_an_aliased_decorator_is_still_a_kernel() -> None:
    body = """
    @compile_it
    def sneaky_kernel(x_ptr, n):
        torch.relu(x_ptr)
    """
    source = with_import("from triton import jit as compile_it", module(body) + FORWARD)
    assert "kernel_body" in rules(source)


def test_a_kernel_defined_where_it_is_launched_passes() -> None:
    """Triton lets a kernel be defined in a function (a factory, forward itself): its body
    is judged as every kernel's is."""
    source = module(
        """
        class ModelNew(nn.Module):
            def forward(self, x):
                @triton.jit
                def inner(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
                    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
                    vals = tl.load(x_ptr + offs, mask=offs < n)
                    tl.store(y_ptr + offs, tl.maximum(vals, 0.0), mask=offs < n)

                y = torch.empty_like(x)
                inner[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
                return y
        """
    )
    assert rules(source) == set()
    escaping = source.replace("tl.maximum(vals, 0.0)", "x.relu()")  # forward's tensor
    assert "kernel_body" in rules(escaping)


def test_a_kernel_defined_inside_a_kernel_is_refused() -> None:
    source = module(
        """
        @triton.jit
        def outer(x_ptr):
            @triton.jit
            def inner(x_ptr):
                pass
        """
    )
    assert "kernel_body" in rules(source + FORWARD)


def test_the_triton_language_passes() -> None:
    source = module(
        """
        from triton.language.extra import libdevice

        SCALE = tl.constexpr(2)
        EPS = 1e-6


        @triton.jit
        def add_combine(a, b):
            return a + b


        @triton.jit
        def load_row(ptr, offs, n):
            return tl.load(ptr + offs, mask=offs < n, other=0.0)


        @triton.jit
        def full_kernel(x_ptr, y_ptr, n, OUT: tl.constexpr, BLOCK: tl.constexpr = 128):
            pid = tl.program_id(axis=0)
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
            total = tl.reduce(x, 0, add_combine) + tl.sum(load_row(x_ptr, offs, n)[:, None])
            acc = tl.zeros((BLOCK,), dtype=x_ptr.dtype.element_ty)
            for i in tl.static_range(2):
                acc += libdevice.tanh(x) * SCALE + tl.math.exp(x) + EPS + total
            lo, hi = min(BLOCK, 64), max(1, n)
            assert BLOCK >= 16
            tl.device_assert(lo <= hi)
            tl.store(y_ptr + offs, tl.where(mask, acc, 0.0).to(OUT), mask=mask)


        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                n = x.numel()
                full_kernel[(triton.cdiv(n, 128),)](x, y, n, OUT=tl.float32)
                return y
        """
    )
    assert rules(source) == set()


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize(
    "argument",
    ['input_precision="tf32"', 'input_precision="tf32x3"', "allow_tf32=True", "input_precision=P"],
)
def test_tf32_dot_is_a_precision_downgrade(argument: str) -> None:
    source = (CANDIDATES / "solutions" / "matmul.py").read_text()
    source = source.replace('input_precision="ieee"', argument)
    matmul_task = (EXAMPLES / "tasks" / "matmul.py").read_text()
    assert "precision_downgrade" in rules(source, matmul_task)


def test_half_precision_is_allowed_when_the_task_uses_it() -> None:
    source = with_import("from torch import float16", place("forward", "{x}.half()"))
    assert "precision_downgrade" in rules(source)
    assert rules(source, RELU_TASK + "\n# computes in torch.float16\n") == set()


def test_a_literal_full_precision_dtype_passes() -> None:
    assert rules(place("jit", 'tl.dtype("fp32")')) == set()


# --------------------------------------------------------------------------- reports


def test_messages_are_bounded_and_name_rule_and_line() -> None:
    chain = "torch.os" + ".x" * 500
    source = place("forward", chain) + "".join(f"\nV{i} = torch.os.getpid()" for i in range(40))
    violations = check_candidate(source, task_source=RELU_TASK)
    assert 0 < len(violations) <= MAX_VIOLATIONS
    first = violations[0]
    assert first.rule == "module_escape" and first.line > 0
    assert re.match(r"module_escape: line \d+: ", first.text())
    assert all(len(v.message) <= 400 for v in violations)


# --------------------------------------------------------------------------- legitimate code


def _scripted_answers() -> list[object]:
    """Every coder answer of the scripted demos, named after its script."""
    fence = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
    answers = []
    for path in sorted((EXAMPLES / "scripted").glob("*.yaml")):
        for i, response in enumerate(yaml.safe_load(path.read_text()).get("coder", [])):
            codes = fence.findall(response["text"])
            answers += [pytest.param(code, id=f"{path.stem}-{i}") for code in codes]
    return answers


LEGIT = [
    *sorted((CANDIDATES / "solutions").glob("*.py")),
    *sorted((CANDIDATES / "legit").glob("*.py")),
]


@pytest.mark.parametrize("path", LEGIT, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_legitimate_candidate_passes(path: Path) -> None:
    match = re.search(r"^# task: (\w+)", path.read_text(), re.M)
    task = (EXAMPLES / "tasks" / f"{match.group(1) if match else path.stem}.py").read_text()
    assert check_candidate(path.read_text(), task_source=task) == []


def test_the_cuda_candidate_passes() -> None:
    source = (CANDIDATES / "cupy" / "relu.py").read_text()
    assert check_candidate(source, backend="cupy", task_source=RELU_TASK) == []


@pytest.mark.parametrize("code", _scripted_answers())
def test_every_scripted_coder_answer_passes(code: str) -> None:
    assert check_candidate(code) == []
