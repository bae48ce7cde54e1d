"""The comparison of a candidate's outputs with the reference's: KernelBench's tolerances by
dtype, and an absolute tolerance that shrinks with an output that is all near zero, so that
zeros or any tiny value do not pass where the reference's outputs are merely small
(KernelBench issue #165)."""

from __future__ import annotations

import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.verification.child.compare import (
    DEFAULT_TOLERANCES,
    compare_outputs,
    tolerances_of,
)
from kernelflow.verification.child.report import VerificationFailure
from kernelflow.verification.engine import VerifierConfig, verify

TOLERANCES = tolerances_of({})


def passes(expected: torch.Tensor, got: torch.Tensor) -> bool:
    try:
        compare_outputs(expected, got, TOLERANCES)
    except VerificationFailure:
        return False
    return True


def test_tolerances_are_kernelbench_s_current_ones() -> None:
    assert DEFAULT_TOLERANCES["float32"] == (1e-4, 1e-4)
    assert DEFAULT_TOLERANCES["float16"] == DEFAULT_TOLERANCES["bfloat16"] == (1e-2, 1e-2)
    assert TOLERANCES["float64"] == (1e-4, 1e-4)


@settings(max_examples=60, deadline=None)
@given(
    scale=st.sampled_from([1e-9, 1e-6, 1e-3, 1.0, 1e3]),
    seed=st.integers(0, 2**16),
)
def test_a_correct_result_passes_and_zeros_fail_at_every_scale(scale: float, seed: int) -> None:
    """Whatever the magnitude of the reference's outputs: the same values computed another
    way (fp32 rounding) pass; zeros, and values off by a tenth, do not."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 33, generator=generator, dtype=torch.float64)
    expected = (torch.softmax(x, dim=1) * scale).float()
    recomputed = (torch.exp(x) / torch.exp(x).sum(dim=1, keepdim=True) * scale).float()
    assert passes(expected, recomputed)
    assert not passes(expected, torch.zeros_like(expected))
    assert not passes(expected, expected * 1.1)


def test_large_outputs_keep_the_absolute_tolerance() -> None:
    expected = torch.tensor([1000.0, 0.0, 2.0])
    assert passes(expected, expected + torch.tensor([0.0, 5e-5, 0.0]))  # near 0: atol 1e-4


def test_the_report_says_the_tolerance_was_scaled() -> None:
    expected = torch.full((4,), 3e-6)
    with pytest.raises(VerificationFailure, match="atol scaled to the output's magnitude"):
        compare_outputs(expected, torch.zeros(4), TOLERANCES)


# A reference whose outputs are all far below fp32's absolute tolerance of 1e-4.
SMALL_OUTPUTS = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    rows = 8
    cols = 512


    class Model(nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=1) * 1e-3


    def get_inputs():
        return [torch.randn(rows, cols)]


    def get_init_inputs():
        return []
    """
)
# Input-dependent (so not a constant output), and within 1e-4 of every reference value.
TINY_ANSWER = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def tiny_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        vals = tl.load(x_ptr + offs, mask=offs < n)
        tl.store(y_ptr + offs, vals * 1e-9, mask=offs < n)


    class ModelNew(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            tiny_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y
    """
)
SOFTMAX = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def softmax_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        vals = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=-float("inf"))
        num = tl.exp(vals - tl.max(vals, axis=0))
        out = num / tl.sum(num, axis=0) * 1e-3
        tl.store(y_ptr + row * cols + offs, out, mask=offs < cols)


    class ModelNew(nn.Module):
        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            block = triton.next_power_of_2(x.shape[1])
            softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=block)
            return y
    """
)


def test_a_tiny_answer_to_a_small_output_is_a_mismatch_and_the_real_one_passes() -> None:
    config = VerifierConfig(trials=1, timeout_s=120.0)
    cheat = verify(SMALL_OUTPUTS, TINY_ANSWER, config=config)
    assert cheat.verdict == "mismatch", (cheat.summary, cheat.reasons)
    real = verify(SMALL_OUTPUTS, SOFTMAX, config=config)
    assert real.verdict == "pass", (real.summary, real.errors)
    assert real.tolerances["float32"] == [1e-4, 1e-4]  # recorded with the verdict
