"""The static gate on ordinary code of the kinds it once refused, each next to the attack
its rule still stops (continuing test_gate_precision): kernels named by scope, chosen into
a variable or handed to a launcher; values judged by the bindings that reach them; and
running statistics updated as nn.BatchNorm updates its own.

Every legitimate kernel here is written for these tests."""

from __future__ import annotations

import textwrap

import pytest

from kernelflow.verification.gate import gate_findings
from tests.unit.test_gate_precision import RELU_KERNEL, candidate, forward, rules

# --------------------------------------------------------------------------- kernels held


TWO_KERNELS = """
@triton.jit
def relu_fp32(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, tl.where(v > 0, v, 0.0), mask=offs < n)


@triton.jit
def relu_fp16(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, tl.maximum(v, 0.0), mask=offs < n)


def run_relu(kernel, x, y):
    kernel[(triton.cdiv(x.numel(), 512),)](x, y, x.numel(), BLOCK=512)


class ModelNew(nn.Module):
    def _launch(self, kernel, x, y):
        kernel[(triton.cdiv(x.numel(), 512),)](x, y, x.numel(), BLOCK=512)

    def _inspect(self, kernel):
        return kernel.fn

    def forward(self, x):
        y = torch.empty_like(x)
        half = x.dtype == torch.float16
        SNIPPET
        return y
"""
GRID = "(triton.cdiv(x.numel(), 512),)"


@pytest.mark.parametrize(
    "snippet",
    [
        f"kernel = relu_fp16 if half else relu_fp32\nkernel[{GRID}](x, y, x.numel(), BLOCK=512)",
        "if half:\n    kernel = relu_fp16\nelse:\n    kernel = relu_fp32\n"
        f"kernel[{GRID}](x, y, x.numel(), BLOCK=512)",
        "kernel = relu_fp16 if half else relu_fp32\nrun_relu(kernel, x, y)",
        "self._launch(relu_fp16 if half else relu_fp32, x, y)",
        "chosen = relu_fp32\nkernel = relu_fp16 if half else chosen\nself._launch(kernel, x, y)",
    ],
)
def test_a_kernel_chosen_and_then_launched_passes(snippet: str) -> None:
    """A variable that only ever holds kernels and is only launched, or handed to a
    function (or method) that only launches what it is given, is a launch."""
    source = candidate(TWO_KERNELS.replace("SNIPPET", textwrap.indent(snippet, " " * 8)[8:]))
    assert rules(source) == set()


@pytest.mark.parametrize(
    "snippet",
    [
        # the variable used otherwise too: a kernel's hooks run code during its launches
        f"kernel = relu_fp16 if half else relu_fp32\nkernel.add_pre_run_hook(print)\n"
        f"kernel[{GRID}](x, y, x.numel(), BLOCK=512)",
        # it may hold something else than a kernel
        f"kernel = relu_fp32 if half else print\nkernel[{GRID}](x, y, x.numel(), BLOCK=512)",
        # read inside a lambda: launched from a callback, out of sight
        "kernel = relu_fp32\ngrid = lambda meta: (kernel[(1,)](x, y, 1, BLOCK=4), 1)[1:]\n"
        "relu_fp16[grid](x, y, x.numel(), BLOCK=512)",
        # handed to a method that does not only launch it
        f"self._inspect(relu_fp32)\nrelu_fp16[{GRID}](x, y, x.numel(), BLOCK=512)",
    ],
)
def test_a_kernel_held_otherwise_than_launched_is_refused(snippet: str) -> None:
    source = candidate(TWO_KERNELS.replace("SNIPPET", textwrap.indent(snippet, " " * 8)[8:]))
    assert "callback" in rules(source)


LEAKY = """
@triton.jit
def leaky_relu(x_ptr, y_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, tl.where(v >= 0, v, v * slope), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, slope: float = 0.01):
        super().__init__()
        self.slope = slope

    def leaky_relu(self, x):
        y = torch.empty_like(x)
        leaky_relu[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), self.slope, BLOCK=256)
        SNIPPET
        return y

    def forward(self, x):
        return self.leaky_relu(x.contiguous())
"""


def test_a_method_named_like_the_kernel_it_launches_passes() -> None:
    """Inside the method the name is the module's kernel; ``self.leaky_relu`` is the
    method (names are resolved by scope)."""
    assert rules(candidate(LEAKY.replace("SNIPPET", "pass"))) == set()


@pytest.mark.parametrize(
    ("snippet", "method_body"),
    [
        ("leaky_relu.add_pre_run_hook(print)", ""),  # the kernel itself, used as a value
        # a kernel defined in the class body is its instances' attribute
        ("self.inner.fn(x)", "@triton.jit\n    def inner(x_ptr):\n        pass\n"),
    ],
)
def test_a_kernel_reached_by_scope_is_still_only_launched(snippet: str, method_body: str) -> None:
    source = LEAKY.replace("SNIPPET", snippet)
    source = source.replace(
        "    def leaky_relu(self", f"    {method_body}\n    def leaky_relu(self"
    )
    assert "callback" in rules(candidate(source))


# --------------------------------------------------------------------------- values by flow


@pytest.mark.parametrize(
    "body",
    [
        "shape = x.shape\nout_shape = list(shape)\nout_shape.pop(0)\n"
        "z = torch.empty(out_shape, device=x.device)",
        "shape = x.shape\nshape = list(shape)\nshape[0] = 1\nshape.append(1)\nshape.insert(0, 2)\n"
        "del shape[-1]\nshape = tuple(shape)",
        "dims = x.size()\nkeep = list(dims)\nif keep:\n    keep[-1] = 1\nkeep = torch.Size(keep)",
        "z = x\nz = torch.empty_like(x)\nz[0] = 1.0",  # rebound to the call's own tensor
    ],
)
def test_a_list_rebound_from_a_shape_is_the_call_s_own(body: str) -> None:
    """A name is judged where it is written, by the bindings that reach it there."""
    assert rules(forward(body)) == set()


@pytest.mark.parametrize(
    "body",
    [
        "shape = list(x.shape)\nshape = self.sizes\nshape.append(1)",  # rebound to state
        "z = torch.empty_like(x) if x.dim() else self.buf\nz[0] = 1.0",
        "z = torch.empty_like(x)\nfor _ in range(2):\n    z[0] = 1.0\n    z = self.buf",
        # what is put into a container the call made is not the call's
        "kept = []\nkept.append(self.buf)\nkept[0][0] = 1.0",
        "kept = []\nalias = kept\nalias.append(self.buf)\nkept[0].copy_(x)",
        "z = torch.empty_like(x)\nz.set_(self.buf)\nz.copy_(x)",  # storage swapped in
        "z = torch.empty_like(x)\nz.data = self.buf\nz[0] = 1.0",
        "import torch as T\nT.relu = print",  # a module imported in the call is no value of it
    ],
)
def test_what_a_name_may_hold_there_stays_judged(body: str) -> None:
    assert "caching" in rules(forward(body))


def test_an_autograd_ctx_may_hold_the_inputs_but_not_change_them() -> None:
    ctx = """
    class Relu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.empty_like(x)
            relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            ctx.saved = x
            SNIPPET
            return y


    class ModelNew(nn.Module):
        def forward(self, x):
            return Relu.apply(x)
    """
    ctx = textwrap.dedent(ctx)
    assert rules(candidate(RELU_KERNEL + ctx.replace("SNIPPET", "pass"))) == set()
    for change in [
        "ctx.saved.zero_()",
        "ctx.save_for_backward(x)\n(kept,) = ctx.saved_tensors\nkept.zero_()",
    ]:
        snippet = textwrap.indent(change, " " * 8)[8:]
        changed = candidate(RELU_KERNEL + ctx.replace("SNIPPET", snippet))
        assert "caching" in rules(changed, policy_name="kernelbench"), change


# --------------------------------------------------------------------------- running statistics


BN_KERNELS = """
@triton.jit
def channel_stats_kernel(x_ptr, mean_ptr, var_ptr, n, hw, C: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n * hw, BLOCK):
        i = start + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + (i // hw) * C * hw + c * hw + i % hw, mask=i < n * hw, other=0.0)
        acc += v
        acc2 += v * v
    mean = tl.sum(acc, 0) / (n * hw)
    tl.store(mean_ptr + c, mean)
    tl.store(var_ptr + c, tl.sum(acc2, 0) / (n * hw) - mean * mean)


@triton.jit
def normalize_kernel(x_ptr, y_ptr, mean_ptr, var_ptr, total, hw, eps, C: tl.constexpr,
                     BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    c = (i // hw) % C
    v = tl.load(x_ptr + i, mask=i < total, other=0.0)
    m = tl.load(mean_ptr + c, mask=i < total, other=0.0)
    s = tl.load(var_ptr + c, mask=i < total, other=1.0)
    tl.store(y_ptr + i, (v - m) / tl.sqrt(s + eps), mask=i < total)
"""
# Batch normalisation as nn.BatchNorm2d computes it: batch statistics and updated running
# statistics in training mode, the running statistics in eval mode.
BATCH_NORM = (
    BN_KERNELS
    + """

class ModelNew(nn.Module):
    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.momentum, self.eps = momentum, eps
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def _track(self, mean, var):
        SNIPPET

    def forward(self, x):
        x = x.contiguous()
        n, c, hw = x.shape[0], x.shape[1], x[0, 0].numel()
        y = torch.empty_like(x)
        if self.training:
            mean = torch.empty(c, device=x.device)
            var = torch.empty(c, device=x.device)
            channel_stats_kernel[(c,)](x, mean, var, n, hw, C=c, BLOCK=256)
            self._track(mean, var)
        else:
            mean, var = READ
        normalize_kernel[(triton.cdiv(x.numel(), 256),)](
            x, y, mean, var, x.numel(), hw, self.eps, C=c, BLOCK=256
        )
        return y
"""
)
TRACK = """m = self.momentum
self.running_mean.mul_(1 - m).add_(m * mean)
self.running_var.copy_((1 - m) * self.running_var + m * var)
self.num_batches_tracked += 1"""
EVAL_READ = "self.running_mean, self.running_var"


def batch_norm(track: str = TRACK, read: str = EVAL_READ) -> str:
    snippet = textwrap.indent(track, " " * 8)[8:]
    return candidate(BATCH_NORM.replace("SNIPPET", snippet).replace("READ", read))


@pytest.mark.parametrize(
    "track",
    [
        TRACK,  # as nn.BatchNorm does: updated in training mode, read in eval mode
        "self.running_mean.copy_(self.running_mean * 0.9 + mean * 0.1)\n"
        "self.running_var = 0.9 * self.running_var + 0.1 * var",
    ],
)
def test_running_statistics_updated_as_batch_norm_does_pass(track: str) -> None:
    refused, warned = gate_findings(batch_norm(track), task_source="", policy="kernelbench")
    assert refused == []
    assert {v.rule for v in warned} <= {"torch_compute"}  # mul_/add_: PyTorch arithmetic


def test_running_statistics_never_read_back_may_be_updated_in_any_mode() -> None:
    """Write-only state (an nn.BatchNorm2d's buffers here, updated on every call as
    KernelBench's training-mode reference does): no output reads it, so it carries
    nothing from one call to the next."""
    source = candidate(
        BN_KERNELS
        + """

class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features)

    def forward(self, x):
        x = x.contiguous()
        n, c, hw = x.shape[0], x.shape[1], x[0, 0].numel()
        mean = torch.empty(c, device=x.device)
        var = torch.empty(c, device=x.device)
        channel_stats_kernel[(c,)](x, mean, var, n, hw, C=c, BLOCK=256)
        y = torch.empty_like(x)
        normalize_kernel[(triton.cdiv(x.numel(), 256),)](
            x, y, mean, var, x.numel(), hw, self.bn.eps, C=c, BLOCK=256
        )
        m = self.bn.momentum
        self.bn.running_mean.mul_(1 - m).add_(m * mean)
        self.bn.running_var.mul_(1 - m).add_(m * var * (n * hw) / (n * hw - 1))
        self.bn.num_batches_tracked += 1
        return y
"""
    )
    assert rules(source, "", "kernelbench") == set()
    read_back = source.replace("return y", "return y + self.bn.running_mean.sum()")
    assert "caching" in rules(read_back, "", "kernelbench")


@pytest.mark.parametrize(
    ("track", "read"),
    [
        # a buffer read back in the mode it is written in: a cache
        (TRACK + "\nmean.copy_(self.running_mean)", EVAL_READ),
        ("self.running_var.copy_(var)\nself.last = self.running_var", EVAL_READ),
        # the mode changed by the module itself, so the eval branch runs after updates
        (TRACK + "\nself.train()", EVAL_READ),
        (TRACK, EVAL_READ + " if not self.eval() else None"),
        # storage swapped in, aliasing the buffer with the call's tensor
        ("self.running_mean.set_(mean)", EVAL_READ),
        # what the update hands on may write the buffer's value elsewhere
        (
            "self.running_var.copy_(mean.add_(self.running_mean))\nself.running_mean.mul_(0.5)",
            EVAL_READ,
        ),
    ],
)
def test_running_statistics_read_back_are_a_cache(track: str, read: str) -> None:
    assert "caching" in rules(batch_norm(track, read), "", "kernelbench")


def test_a_buffer_updated_where_it_is_read_is_a_cache() -> None:
    """Updates outside training mode of a buffer eval mode reads: the results of one call
    reach the next."""
    source = batch_norm().replace("            self._track(mean, var)\n", "")
    source = source.replace("        return y\n", "        self._track(y, y)\n        return y\n")
    assert "caching" in rules(source, "", "kernelbench")
