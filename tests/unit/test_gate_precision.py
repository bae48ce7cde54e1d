"""The static gate on ordinary code of the kinds it once refused (precision), each next to
the attack its rule still stops (containment), and the strictness policies.

Every legitimate kernel here is written for these tests, in the styles public KernelBench
solutions use (bench/verifier_precision.py measures the gate on those themselves). Each
class failed before the rules followed data and the Triton language instead of names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from kernelflow.events.model import POLICY_NAME_PATTERN
from kernelflow.verification.gate import check_candidate, gate_findings
from kernelflow.verification.policy import (
    CHOICE_RULES,
    KERNELBENCH,
    NAME_PATTERN,
    STRICT,
    UnknownPolicy,
    policy,
    policy_names,
)

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
RELU_TASK = (TASKS / "relu.py").read_text()
SUM_DIM_TASK = (TASKS / "sum_dim.py").read_text()

HEADER = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl
"""
RELU_KERNEL = """
@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=offs < n), 0.0), mask=offs < n)
"""


def candidate(body: str, header: str = HEADER) -> str:
    return header + textwrap.dedent(body)


def rules(source: str, task: str = RELU_TASK, policy_name: str = "strict") -> set[str]:
    found = check_candidate(source, task_source=task, policy=policy_name)
    return {v.rule for v in found}


def forward(body: str, signature: str = "self, x") -> str:
    """A ReLU candidate whose forward runs ``body`` (indented; may use x) first."""
    lines = textwrap.indent(textwrap.dedent(body).strip(), " " * 8)
    return candidate(
        RELU_KERNEL
        + f"""

class ModelNew(nn.Module):
    def forward({signature}):
{lines}
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""
    )


# --------------------------------------------------------------------------- Triton values


TILE_KERNELS = """
@triton.jit
def outer(a, b):
    return a[:, None] * b[None, :]


@triton.jit
def ident(v):
    return v


@triton.jit
def tile_kernel(x_ptr, y_ptr, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.arange(0, BC)
    mask = (r[:, None] < rows) & (c[None, :] < cols)
    ptrs = x_ptr + r[:, None] * cols + c[None, :]
    tile = tl.load(ptrs, mask=mask, other=0.0)
    weights = outer(r.to(tl.float32), c.to(tl.float32))
    SNIPPET
    out = tl.maximum(tile, 0.0) + weights * 0.0
    tl.store(y_ptr + r[:, None] * cols + c[None, :], out, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        rows, cols = x.shape
        y = torch.empty_like(x)
        block = triton.next_power_of_2(cols)
        tile_kernel[(triton.cdiv(rows, 4),)](x, y, rows, cols, BR=4, BC=block)
        return y
"""


@pytest.mark.parametrize(
    "line",
    [
        "pass",
        "row = tile[0]",  # a tile the kernel loaded
        "col = ident(c)[None, :]",  # through a helper, a value of the language
        "total = tl.sum(tile, axis=1)[:, None]",
        "half = tile.sum(axis=1)",  # a method of a language value
    ],
)
def test_indexing_and_methods_of_triton_values_pass(line: str) -> None:
    source = candidate(TILE_KERNELS.replace("SNIPPET", line))
    assert rules(source) == set()


@pytest.mark.parametrize(
    "line",
    [
        "z = x_ptr[rows]",  # a launched kernel's argument: whatever the host handed in
        "z = outer(x_ptr, c)",  # a helper indexing what it was given from the host
        "z = ident(x_ptr)[:, None]",  # a host value handed back by a helper
        "z = (x_ptr or c)[r]",
        "z = x_ptr.data.sum()",  # a method of a host object
    ],
)
def test_host_values_stay_out_of_reach_in_kernels(line: str) -> None:
    source = candidate(TILE_KERNELS.replace("SNIPPET", line))
    assert "kernel_body" in rules(source)


def test_an_element_of_a_tuple_argument_passes() -> None:
    """Triton 3 kernels take tuples (`x.stride()`) and read their elements."""
    line = "z = tl.load(x_ptr + r[:, None] * STRIDES[0] + c[None, :] * STRIDES[1])"
    source = candidate(TILE_KERNELS.replace("SNIPPET", line))
    source = source.replace("BR: tl.constexpr,", "STRIDES, BR: tl.constexpr,")
    source = source.replace("(x, y, rows, cols,", "(x, y, rows, cols, x.stride(),")
    assert rules(source) == set()


def test_the_triton_language_under_its_full_name_passes() -> None:
    """``triton.language.advance`` (block pointers, Triton 2.1 to 3.4) as ``tl.advance``."""
    source = candidate(
        """
        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            src = tl.make_block_ptr(x_ptr, (n,), (1,), (0,), (BLOCK,), (0,))
            dst = tl.make_block_ptr(y_ptr, (n,), (1,), (0,), (BLOCK,), (0,))
            for _ in range(0, n, BLOCK):
                vals = tl.load(src, boundary_check=(0,))
                tl.store(dst, tl.maximum(vals, 0.0), boundary_check=(0,))
                src = triton.language.advance(src, (BLOCK,))
                dst = tl.advance(dst, (BLOCK,))


        class ModelNew(nn.Module):
            def forward(self, x):
                y = torch.empty_like(x)
                copy_kernel[(1,)](x, y, x.numel(), BLOCK=256)
                return y
        """
    )
    assert rules(source) == set()


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    ("signature", "body"),
    [
        ("self, input", "x = input"),  # a parameter named like a builtin
        ("self, x", "vars = list(x.shape)\nn = len(vars)"),  # a local
        ("self, x", "input = x\ndef helper():\n    return input\nhelper()"),  # a closure
        ("self, x", "dir = 1 if x.dim() else -1"),
    ],
)
def test_a_name_is_what_it_refers_to(signature: str, body: str) -> None:
    assert rules(forward(body, signature)) == set()


@pytest.mark.parametrize(
    "body",
    [
        'f = open("/etc/passwd")',  # the builtin itself
        "f = vars(x)",
        "def helper(reader=open):\n    return reader\nhelper()",  # a default: the caller's
    ],
)
def test_builtins_that_reach_outside_are_still_refused(body: str) -> None:
    assert "introspection" in rules(forward(body))


def test_a_module_level_name_does_not_shadow_a_builtin() -> None:
    """At module level `open = open` reads the builtin: only function scopes shadow."""
    source = forward("f = open").replace("class ModelNew", "open = open\n\n\nclass ModelNew")
    assert "introspection" in rules(source)


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize(
    "body",
    [
        "perm = list(range(x.dim()))\nperm.pop(0)\nperm.append(0)",
        "shape = list(x.shape)\nshape[0] = 1",
        "sizes = [*x.shape]\nsizes[-1] = sizes[-1] * 2\ndel sizes[0]",
        "order = sorted(range(x.dim()), reverse=True)\norder.reverse()",
        "seen = {}\nseen.setdefault(0, []).append(1)",
        "stats = dict(n=x.numel())\nstats['n'] += 1",
        "pair = [x, x]\npair[0] = x.view(-1)",  # the list is the call's; x stays untouched
    ],
)
def test_containers_made_in_the_call_may_change(body: str) -> None:
    assert rules(forward(body)) == set()


@pytest.mark.parametrize(
    "body",
    [
        "params = list(self.parameters())\nparams[0].copy_(x)",  # what it holds: the module's
        "kept = [self.buf]\nkept[0][0] = 1.0",
        "alias = self.cache\nalias[0] = x",
        "d = self.cache.copy()\nd['y'].copy_(x)",  # a shallow copy holds the same tensors
        "self.cache['y'] = x",
    ],
)
def test_what_outlives_the_call_stays_unchanged(body: str) -> None:
    assert "caching" in rules(forward(body))


@pytest.mark.parametrize(
    "body",
    [
        # weights laid out from the parameters on the first call
        "if self.wt is None:\n    self.wt = (self.w * self.scale).t().contiguous()",
        "self.conv = self.conv.to(x.device)",  # moved, not changed
        "self.w.data = self.w.data.to(x.device)",
        "self.seen_shape = x.shape",  # the inputs' metadata is not their data
    ],
)
def test_state_no_call_s_data_went_into_may_be_kept(body: str) -> None:
    assert rules(forward(body)) == set()


@pytest.mark.parametrize(
    "body",
    [
        "self.last = x",  # the call's data
        "y0 = x * 2\nself.last = y0",  # through a local
        "self.calls = self.calls + 1",  # a counter: state that changes from call to call
        "self.calls += 1",
        "self.grow = torch.empty(self.grow.shape[0] + 1)",  # the state's size is state too
        "self.total = self.peek()",  # a method whose reads are not followed
        "self.conv = self.conv.to(x.device) if x.sum() > 0 else self.conv",
    ],
)
def test_state_that_could_carry_results_stays_refused(body: str) -> None:
    source = forward(body).replace(
        "class ModelNew(nn.Module):",
        "class ModelNew(nn.Module):\n    def peek(self):\n        return self.helper(self)\n",
    )
    assert "caching" in rules(source)


def test_the_level1_47_solution_with_its_list_idioms_passes() -> None:
    source = (ROOT / "examples" / "candidates" / "legit" / "sum_dim_moved_last.py").read_text()
    assert rules(source, SUM_DIM_TASK) == set()


# --------------------------------------------------------------------------- where code runs


INIT_HELPERS = """
class ModelNew(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(features))
        self.reset_parameters()

    def reset_parameters(self):
        bound = 1 / math.sqrt(self.weight.numel())
        nn.init.uniform_(self.weight, -bound, bound)

    def forward(self, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return [64]
"""


def test_code_that_runs_only_while_the_module_is_built_is_init_code() -> None:
    """A helper only __init__ calls, and the task's get_inputs copied into the candidate
    (the verifier never calls a candidate's), may initialise as __init__ does."""
    source = candidate(RELU_KERNEL + INIT_HELPERS, HEADER + "import math\n")
    assert rules(source) == set()


@pytest.mark.parametrize(
    "changes",
    [
        # called from forward too
        [("y = torch.empty_like(x)", "self.reset_parameters()\n        y = torch.empty_like(x)")],
        [("y = torch.empty_like(x)", "y = torch.empty_like(get_inputs()[0])")],
        # a name PyTorch calls on a module itself (model.eval())
        [
            ("def reset_parameters(self):", "def eval(self):"),
            ("self.reset_parameters()", "self.eval()"),
        ],
    ],
)
def test_init_code_called_from_forward_is_judged_as_forward(changes: list[tuple[str, str]]) -> None:
    source = candidate(RELU_KERNEL + INIT_HELPERS, HEADER + "import math\n")
    for old, new in changes:
        source = source.replace(old, new)
    assert rules(source) & {"torch_compute", "module_escape"}


def test_the_module_api_names_cover_the_installed_torch() -> None:
    import inspect

    import torch.nn as nn

    from kernelflow.verification.gate.rules import NN_MODULE_API

    members = {
        n for n, v in inspect.getmembers(nn.Module) if callable(v) or isinstance(v, property)
    }
    assert {n for n in members if not n.startswith("__")} <= NN_MODULE_API


# --------------------------------------------------------------------------- policies


CONV_TASK = """
import torch
import torch.nn as nn

batch, channels, out_channels, size = 2, 3, 8, 16


class Model(nn.Module):
    def __init__(self, channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, out_channels, 3)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 2.0


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels, out_channels]
"""
# The convolution kept in PyTorch, its epilogue fused in a kernel: "replace some ops"
# in KernelBench's words.
CONV_EPILOGUE = candidate(
    """
    @triton.jit
    def relu_scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, tl.maximum(v, 0.0) * scale, mask=offs < n)


    class ModelNew(nn.Module):
        def __init__(self, channels, out_channels):
            super().__init__()
            self.conv = nn.Conv2d(channels, out_channels, 3)

        def forward(self, x):
            z = self.conv(x).contiguous()
            y = torch.empty_like(z)
            scale = torch.sqrt(torch.tensor(4.0)).item()
            relu_scale_kernel[(triton.cdiv(z.numel(), 1024),)](z, y, z.numel(), scale, BLOCK=1024)
            return y
    """
)


def test_pytorch_compute_is_the_policy_s_choice() -> None:
    strict, _ = gate_findings(CONV_EPILOGUE, task_source=CONV_TASK, policy="strict")
    assert {v.rule for v in strict} == {"torch_compute"}
    refused, warned = gate_findings(CONV_EPILOGUE, task_source=CONV_TASK, policy="kernelbench")
    assert refused == [] and {v.rule for v in warned} == {"torch_compute"}


def test_tf32_is_the_policy_s_choice() -> None:
    source = (ROOT / "examples" / "candidates" / "solutions" / "matmul.py").read_text()
    source = source.replace('input_precision="ieee"', "allow_tf32=True")
    task = (TASKS / "matmul.py").read_text()
    assert rules(source, task) == {"precision_downgrade"}
    assert rules(source, task, "kernelbench") == set()


@pytest.mark.parametrize(
    "body",
    [
        "assert x.dtype in (torch.float16, torch.float32)",  # compared: nothing converted
        "if x.dtype == torch.bfloat16:\n    x = x.float()",
    ],
)
def test_naming_a_low_precision_dtype_is_not_a_downgrade(body: str) -> None:
    assert rules(forward(body)) == set()


@pytest.mark.parametrize(
    "body", ["x = x.half()", "x = x.to(torch.float16)", "w = torch.empty(4, dtype=torch.bfloat16)"]
)
def test_converting_to_a_low_precision_dtype_is(body: str) -> None:
    assert rules(forward(body)) == {"precision_downgrade"}


def test_tl_dot_without_a_precision_is_tf32() -> None:
    source = (ROOT / "examples" / "candidates" / "solutions" / "matmul.py").read_text()
    source = source.replace(', input_precision="ieee"', "")
    task = (TASKS / "matmul.py").read_text()
    assert rules(source, task) == {"precision_downgrade"}
    assert rules(source, task, "kernelbench") == set()


@pytest.mark.parametrize(
    "cheat",
    [
        "reference_inherit",
        "exception_fallback",
        "result_cache",
        "monkey_patch",
        "frame_inspect",
        "thread_escape",
        "side_stream",
        "lazy_subclass",
        "no_kernel",
        "read_task_file",
    ],
)
def test_integrity_rules_refuse_under_every_policy(cheat: str) -> None:
    source = (ROOT / "examples" / "candidates" / "cheats" / f"{cheat}.py").read_text()
    for name in policy_names():
        refused, _ = gate_findings(source, task_source=RELU_TASK, policy=name)
        assert refused, f"{cheat} passes the gate under {name}"


def test_policies_are_named_as_the_wire_allows_and_only_choices_warn() -> None:
    assert NAME_PATTERN == POLICY_NAME_PATTERN
    assert policy("") is STRICT and policy("kernelbench") is KERNELBENCH
    assert STRICT.warned == frozenset() and KERNELBENCH.warned == CHOICE_RULES
    with pytest.raises(UnknownPolicy, match="known: kernelbench, strict"):
        policy("lenient")


# --------------------------------------------------------------------------- the language


CDIV_KERNEL = """
@triton.jit
def row_relu_kernel(x_ptr, y_ptr, cols, N_COLS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    SNIPPET
    for step in range(triton.cdiv(N_COLS, BLOCK)):
        offs = step * BLOCK + tl.arange(0, BLOCK)
        mask = offs < cols
        v = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * cols + offs, tl.maximum(v, 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        rows, cols = x.shape
        y = torch.empty_like(x)
        row_relu_kernel[(rows,)](x, y, cols, N_COLS=cols, BLOCK=128)
        return y
"""


def test_triton_cdiv_on_constexprs_in_a_kernel_passes() -> None:
    """triton.cdiv and next_power_of_2 are Triton's constexpr functions: integer
    arithmetic a kernel may call."""
    snippet = "WIDTH: tl.constexpr = triton.next_power_of_2(BLOCK)"
    assert rules(candidate(CDIV_KERNEL.replace("SNIPPET", snippet))) == set()


@pytest.mark.parametrize("line", ["z = triton.Config({})", "z = triton.jit", "z = triton.runtime"])
def test_the_rest_of_triton_stays_out_of_kernels(line: str) -> None:
    found = rules(candidate(CDIV_KERNEL.replace("SNIPPET", line)))
    assert found & {"kernel_body", "module_escape"}


def test_memory_formats_are_glue() -> None:
    source = candidate(
        RELU_KERNEL
        + """

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.layout = torch.channels_last
        self.fallback = torch.contiguous_format

    def forward(self, x):
        if x.dim() == 5:
            x = x.contiguous(memory_format=torch.channels_last_3d)
        elif x.dim() == 4:
            x = x.contiguous(memory_format=self.layout)
        y = torch.empty_like(x, memory_format=torch.preserve_format)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""
    )
    assert rules(source) == set()
    # the names __init__ may use are still an allow-list
    global_state = source.replace(
        "self.fallback = torch.contiguous_format", "torch.set_default_dtype(torch.float64)"
    )
    assert "module_escape" in rules(global_state, policy_name="kernelbench")


@pytest.mark.parametrize(
    "made",
    [
        "torch.Tensor._make_subclass(torch.Tensor, y)",
        "torch.Tensor._make_wrapper_subclass(torch.Tensor, y.shape)",
        "y.as_subclass(torch.Tensor)",
        "torch.Tensor.__new__(torch.Tensor)",
        "torch._C.TensorBase(y)",
    ],
)
@pytest.mark.parametrize("policy_name", ["strict", "kernelbench"])
def test_tensor_subclasses_made_from_values_are_refused_under_every_policy(
    made: str, policy_name: str
) -> None:
    """KernelBench's lazy_eval: a tensor of another class runs its class's code on every
    operation PyTorch does with it (the comparison with the reference's included)."""
    refused, _ = gate_findings(
        forward(f"y = torch.empty_like(x)\nz = {made}"), task_source=RELU_TASK, policy=policy_name
    )
    found = [v for v in refused if v.rule == "callback"]
    assert found and "tensor subclass" in found[0].message
    plain = forward("assert isinstance(x, torch.Tensor)")  # naming the class is no subclass
    assert rules(plain, policy_name=policy_name) == set()


# --------------------------------------------------------------------------- helpers of torch


def test_ordinary_helpers_models_use_pass() -> None:
    """Asking whether an attribute exists (no other spelling does without try/except),
    torch's int-to-tuple helpers, a size computed with torch in __init__, and PyTorch's
    own gradient functions in an autograd function's backward (which the verifier, under
    no_grad, never runs)."""
    source = candidate(
        RELU_KERNEL
        + """
from torch.nn.modules.utils import _triple


class Relu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y

    @staticmethod
    def backward(ctx, grad):
        return torch.nn.grad.conv1d_input((4, 1, 8), torch.ones(1, 1, 1), grad)


class ModelNew(nn.Module):
    def __init__(self, shape=(4, 4)):
        super().__init__()
        self.size = int(torch.prod(torch.tensor(shape)))
        self.kernel_size = _triple(3)

    def forward(self, x):
        if hasattr(self, "size") and hasattr(x, "shape"):
            return Relu.apply(x)
        return Relu.apply(x)
"""
    )
    for policy_name in ("strict", "kernelbench"):
        assert check_candidate(source, task_source=RELU_TASK, policy=policy_name) == []


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ('hasattr(torch, "os")', "module_escape"),  # a module as a value
        ('hasattr(x, "__class__")', "introspection"),
        ('hasattr(x, "f_" + "back")', "introspection"),  # a name the gate cannot read
        ('getattr(x, "shape")', "introspection"),  # hands back the object: write x.shape
        ("import torch.nn.modules.conv as c", "introspection"),  # only the tuple helpers
    ],
)
def test_lookups_and_modules_beyond_those_stay_refused(line: str, rule: str) -> None:
    assert rule in rules(forward(line))
