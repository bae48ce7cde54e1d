"""Problems in KernelBench's format written for this project (examples/kernelbench/): the
CPU size policy gives each several shape sets, the task module executed with a set's
overrides has every shape that derives from the sizes follow, and the full verifier passes
a Triton solution of each."""

from __future__ import annotations

import ast
import math
import time
from pathlib import Path

import pytest

from kernelflow.verification.child.taskload import load_task, split_key
from kernelflow.verification.engine import VerifierConfig, verify
from kernelflow.verification.shapes import (
    CPU_BUDGET,
    auto_shape_sets,
    fallback_shape_sets,
    input_shapes,
)
from kernelflow.verification.taskfile import task_constants

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KERNELBENCH = EXAMPLES / "kernelbench"
PROBLEMS = sorted(KERNELBENCH.glob("level[12]/*.py"))
# Names these problems derive from their sizes at import (they must follow a shape set).
DERIVED = {
    "11_smoothed_cross_entropy": "logit_shape",
    "2_gemm_gain_relu6": "gain_shape",
    "1_conv2d_bias_leaky_relu": "bias_shape",
    "3_gemm_groupnorm_bias_silu": "bias_shape",
}
# Problems whose reference fails on every set of the policy: its LayerNorm normalises
# ``out_channels`` values, which is the transposed convolution's output width only where
# the two keep the task's ratio. They are checked on the fallback sets.
ON_FALLBACK = {"4_conv_transpose2d_layernorm_tanh"}


def problem_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def test_a_dozen_problems_each_with_a_solution_all_written_here() -> None:
    assert len(PROBLEMS) >= 12
    assert {p.name for p in PROBLEMS} == {p.name for p in (KERNELBENCH / "solutions").glob("*.py")}
    assert {p.parent.name for p in PROBLEMS} == {"level1", "level2"}
    # The project's own files: no copied KernelBench problem, so no licence of another
    # project to carry, and linted like the rest of the repository.
    assert not (KERNELBENCH / "LICENSE").exists() and not (KERNELBENCH / "ruff.toml").exists()
    readme = (KERNELBENCH / "README.md").read_text()
    assert "written for this project" in readme
    assert "kernelbench_sizes.py" in readme  # real KernelBench: read from a path given
    for path in [*PROBLEMS, *(KERNELBENCH / "solutions").glob("*.py")]:
        text = path.read_text()
        assert text.startswith('"""'), path  # each says what it is
        assert "MIT" not in text and "ScalingIntelligence" not in text, path


@pytest.mark.parametrize("path", PROBLEMS, ids=problem_id)
def test_shape_sets_are_several_and_the_task_follows_them(path: Path) -> None:
    source = path.read_text()
    tree = ast.parse(source)
    own = task_constants(tree).values
    sets = auto_shape_sets(source, "cpu")
    assert len(sets) >= 2
    assert all(a != b for i, a in enumerate(sets) for b in sets[i + 1 :])
    for index, sizes in enumerate(sets):
        module = load_task(path, sizes, f"kf_kernelbench_{path.stem}_{index}")
        for key, value in sizes.items():
            name, element = split_key(key)
            got = getattr(module, name)
            assert (got if element is None else got[element]) == value, key
        inputs = module.get_inputs()
        shapes = [tuple(x.shape) for x in inputs if hasattr(x, "shape")]
        assert shapes == input_shapes(tree, sizes)  # what the policy sized is what runs
        assert max(math.prod(s) for s in shapes) <= CPU_BUDGET.max_elements
        if path.stem in DERIVED:
            name = DERIVED[path.stem]
            assert getattr(module, name) == task_constants(tree, sizes).values[name]
            assert getattr(module, name) != own[name], f"{name} kept the task's own value"
        module.Model(*module.get_init_inputs())  # the reference builds at these sizes


@pytest.mark.parametrize("path", PROBLEMS, ids=problem_id)
def test_the_verifier_passes_the_triton_solution_in_well_under_a_minute(path: Path) -> None:
    task = path.read_text()
    solution = (KERNELBENCH / "solutions" / path.name).read_text()
    sets = auto_shape_sets(task, "cpu")
    if path.stem in ON_FALLBACK:
        sets = fallback_shape_sets(task, "cpu")
        config = VerifierConfig(timeout_s=120.0)  # the policy's own: it may fall back
    else:
        # The policy's sets, given explicitly: a set the reference fails on fails the check.
        config = VerifierConfig(timeout_s=120.0, shapes=tuple(sets))
    started = time.perf_counter()
    report = verify(task, solution, config=config)
    elapsed = time.perf_counter() - started
    assert report.verdict == "pass", (report.summary, report.errors, report.reasons)
    assert report.shapes == sets
    assert elapsed < 45.0, f"{elapsed:.1f} s"


def test_a_problem_the_policy_s_sets_break_is_checked_on_sizes_scaled_together() -> None:
    """level2/4: ``LayerNorm(out_channels)`` over the output's width, equal only at the
    task's sizes (128 = 2 * 64) and sizes scaled with them."""
    task = (KERNELBENCH / "level2" / "4_conv_transpose2d_layernorm_tanh.py").read_text()
    fallback = fallback_shape_sets(task, "cpu")
    assert len(fallback) == 2 and fallback[0] != fallback[1]
    assert all(s["out_channels"] == 2 * s["W"] for s in fallback)
    policy = auto_shape_sets(task, "cpu")
    assert all(s.get("out_channels", 128) != 2 * s.get("W", 64) for s in policy)
    tree = ast.parse(task)
    for sizes in fallback:
        assert max(math.prod(s) for s in input_shapes(tree, sizes)) <= CPU_BUDGET.max_elements
    assert fallback_shape_sets(task, "cuda") == []  # a GPU checks the task's own sizes


def test_the_verifier_sizes_a_task_by_the_policy() -> None:
    task = (EXAMPLES / "tasks" / "relu.py").read_text()
    solution = (EXAMPLES / "candidates" / "solutions" / "relu.py").read_text()
    report = verify(task, solution, config=VerifierConfig(trials=2, timeout_s=60.0))
    assert report.verdict == "pass", (report.summary, report.errors)
    assert report.shapes == auto_shape_sets(task, "cpu")
