"""Static checks of task files and candidate modules (pure ast, nothing is executed), a
task's size constants, the overrides the sandbox applies to them, and the size policy."""

from __future__ import annotations

import math
import sys
import traceback
from pathlib import Path

import pytest

from kernelflow.verification.child.taskload import load_task, override_source
from kernelflow.verification.shapes import CPU_BUDGET, auto_shape_sets, input_shapes
from kernelflow.verification.taskfile import (
    CandidateError,
    TaskFileError,
    check_candidate_source,
    check_task_source,
    parse_task,
    size_constants,
    task_constants,
)

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"

GOOD_TASK = """
import torch
import torch.nn as nn

batch_size = 4

class Model(nn.Module):
    def forward(self, x):
        return x * 2

def get_inputs():
    return [torch.randn(batch_size, 8)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("path", sorted(TASKS.glob("*.py")), ids=lambda p: p.name)
def test_example_tasks_are_valid(path: Path) -> None:
    assert check_task_source(path.read_text(), str(path)) is None  # raises when refused


def test_good_task_passes() -> None:
    assert check_task_source(GOOD_TASK, "good.py") is None  # raises when refused


def test_syntax_error_names_file_and_line() -> None:
    source = "import torch\n\nclass Model(nn.Module:\n    pass\n"
    with pytest.raises(TaskFileError) as info:
        check_task_source(source, "broken_task.py")
    message = str(info.value)
    assert "broken_task.py" in message
    assert "not valid Python" in message
    assert "line 3" in message


def test_missing_model_is_named() -> None:
    source = GOOD_TASK.replace("class Model(nn.Module):", "class Other(nn.Module):")
    with pytest.raises(TaskFileError) as info:
        check_task_source(source, "no_model.py")
    message = str(info.value)
    assert "no_model.py" in message
    assert "`Model`" in message
    assert "get_inputs" not in message.split("(KernelBench")[0]


def test_all_missing_functions_in_one_message() -> None:
    source = "import torch.nn as nn\n\nclass Model(nn.Module):\n    pass\n"
    with pytest.raises(TaskFileError) as info:
        check_task_source(source, "half_task.py")
    message = str(info.value)
    assert "half_task.py" in message
    assert "missing `get_inputs`" in message
    assert "missing `get_init_inputs`" in message
    assert "missing `Model`" not in message


def test_model_must_be_a_class() -> None:
    source = GOOD_TASK.replace(
        "class Model(nn.Module):\n    def forward(self, x):\n        return x * 2\n",
        "Model = None\n",
    )
    with pytest.raises(TaskFileError, match="`Model` must be a class"):
        check_task_source(source, "t.py")


def test_empty_file_lists_everything() -> None:
    with pytest.raises(TaskFileError) as info:
        check_task_source("", "empty.py")
    message = str(info.value)
    for name in ("Model", "get_inputs", "get_init_inputs"):
        assert f"missing `{name}`" in message


def test_nested_definitions_do_not_count() -> None:
    # A Model hidden inside a function body is not a module-level class.
    source = GOOD_TASK.replace("class Model(nn.Module):", "def _f():\n  class Model(nn.Module):")
    source = source.replace(
        "    def forward(self, x):\n        return x * 2\n",
        "    def forward(self, x):\n      return x\n",
    )
    with pytest.raises(TaskFileError, match="missing `Model`"):
        check_task_source(source, "nested.py")


def test_candidate_ok() -> None:
    source = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    pass\n"
    assert check_candidate_source(source) is None  # raises when refused


def test_candidate_syntax_error() -> None:
    with pytest.raises(CandidateError, match=r"not valid Python .*line 2"):
        check_candidate_source("class ModelNew:\n    def forward(self x):\n        pass\n")


def test_candidate_without_modelnew() -> None:
    with pytest.raises(CandidateError, match="ModelNew"):
        check_candidate_source("import torch.nn as nn\nclass Model(nn.Module):\n    pass\n")


def test_candidate_errors_are_value_errors() -> None:
    assert issubclass(CandidateError, ValueError)
    assert issubclass(TaskFileError, ValueError)


# ------------------------------------------------------------------ size constants

SIZED_TASK = """
import torch
import torch.nn as nn

batch_size = 16; N = 2048 * 2
height = width = 128
depth, rows = (16, 8 + 4)
input_shape = (32768,)
bias_shape = (N, 1, 1)  # derived: follows N
kernel_size = (3, 5)
_private = 64
flag = True
scale = 0.5

class Model(nn.Module):
    def forward(self, x):
        return x

def get_inputs():
    return [torch.rand(batch_size, *input_shape), torch.randint(0, 2, (batch_size,))]

def get_init_inputs():
    return [bias_shape]
"""


def test_size_constants_follow_expressions_chains_unpacking_and_tuples() -> None:
    assert size_constants(SIZED_TASK) == {
        "batch_size": 16,
        "N": 4096,
        "height": 128,
        "width": 128,
        "depth": 16,
        "rows": 12,
        "input_shape[0]": 32768,
        "kernel_size[0]": 3,
        "kernel_size[1]": 5,
    }


def test_the_last_binding_counts_and_a_derived_one_is_no_knob() -> None:
    source = "height = width = 2048\nheight, width = 32, 32\nN = 64\nN *= 2\nM = N + 1\nM = 7\n"
    assert size_constants(source) == {"height": 32, "width": 32, "N": 128, "M": 7}
    assert size_constants("N = 8\nN = N * 2\n") == {}  # derived from a name: it follows


def test_the_evaluator_computes_nothing_unbounded() -> None:
    assert size_constants("N = 10 ** 10 ** 10\nM = 2 ** 64 ** 2\nK = len('abc')\n") == {}


def test_static_constants_apply_overrides_as_the_child_does() -> None:
    tree = parse_task(SIZED_TASK)
    assert tree is not None
    values = task_constants(tree, {"N": 24, "input_shape[0]": 97}).values
    assert values["bias_shape"] == (24, 1, 1)
    assert values["input_shape"] == (97,)
    assert values["N"] == 24


# ------------------------------------------------------------------ overrides in the child


def test_override_source_keeps_line_numbers_and_derived_values_follow(tmp_path: Path) -> None:
    source = SIZED_TASK.replace("scale = 0.5", "scale = 0.5  # a comment")
    rewritten = override_source(source, {"N": 24, "width": 7, "input_shape[0]": 97})
    assert len(rewritten.splitlines()) == len(source.splitlines())
    assert "batch_size = 16; N = 2048 * 2; N = 24" in rewritten
    assert "height = width = 128; width = 7" in rewritten
    task = tmp_path / "task.py"
    task.write_text(source)
    module = load_task(task, {"N": 24, "width": 7, "input_shape[0]": 97}, "kf_test_sized")
    assert (module.N, module.width, module.height) == (24, 7, 128)
    assert module.bias_shape == (24, 1, 1)
    assert module.input_shape == (97,)
    assert [tuple(t.shape) for t in module.get_inputs()] == [(16, 97), (16,)]
    assert sys.modules["kf_test_sized"] is module
    assert module.__file__ == str(task)


def test_load_task_executes_afresh_each_time() -> None:
    first = load_task(SIZED_TASK, {"N": 24}, "kf_test_fresh")
    second = load_task(SIZED_TASK, {}, "kf_test_fresh")
    assert first is not second and first.Model is not second.Model
    assert (first.N, second.N) == (24, 4096)
    assert sys.modules["kf_test_fresh"] is second


def test_a_task_that_raises_is_not_left_registered() -> None:
    with pytest.raises(ZeroDivisionError):
        load_task("N = 4\nboom = 1 / 0\n", {"N": 2}, "kf_test_raises")
    assert "kf_test_raises" not in sys.modules


def test_tracebacks_show_the_executed_line() -> None:
    with pytest.raises(ZeroDivisionError) as info:
        load_task("N = 4\nboom = N / 0\n", {"N": 2}, "kf_test_traceback")
    assert "boom = N / 0" in "".join(traceback.format_exception(info.value))


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"missing": 3}, ValueError),  # a misspelt size would check the task's own sizes
        ({"N = 1; import os; N": 3}, ValueError),  # keys end up in source text
        ({"N": 2.5}, TypeError),
        ({"N": True}, TypeError),
    ],
)
def test_overrides_the_task_cannot_take_are_refused(
    overrides: dict[str, int], error: type[Exception]
) -> None:
    with pytest.raises(error):
        override_source("N = 4\nif N:\n    missing = 1\n", overrides)


# ------------------------------------------------------------------ the size policy

CONV_TASK = """
import torch
import torch.nn as nn

batch_size = 64
in_channels = 32
out_channels = 64
height = width = 512
kernel_size = 5
stride = 2
groups = 4
dim = 1

class Model(nn.Module):
    pass

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, groups, dim]
"""


def test_small_tasks_keep_their_sizes_and_get_a_perturbed_set() -> None:
    sets = auto_shape_sets((TASKS / "relu.py").read_text(), "cpu")
    assert sets == [{}, {"batch_size": 11, "dim": 749}]


def test_a_gpu_checks_the_task_s_own_sizes_first() -> None:
    sets = auto_shape_sets(CONV_TASK, "cuda")
    assert sets[0] == {} and len(sets) == 2
    assert sets[1]["height"] != sets[1]["width"]  # a swapped height and width shows


def test_structure_never_changes_and_channels_stay_multiples_of_groups() -> None:
    sets = auto_shape_sets(CONV_TASK, "cpu")
    assert len(sets) == 3
    for sizes in sets:
        assert set(sizes) <= {"batch_size", "in_channels", "out_channels", "height", "width"}
        assert all(sizes.get(c, 4) % 4 == 0 for c in ("in_channels", "out_channels"))
        # Two channels a group at least; room for the 5 x 5 kernel.
        assert sizes.get("in_channels", 32) >= 8 and sizes.get("height", 512) >= 5


def test_cpu_sets_fit_the_budget_and_set_2_changes_every_size() -> None:
    source = CONV_TASK.replace("groups = 4", "groups = 1")
    tree = parse_task(source)
    assert tree is not None
    first, second, long = auto_shape_sets(source, "cpu")
    assert set(first) == set(second)
    assert all(first[k] != second[k] for k in first)
    assert all(v % 2 for v in second.values())  # not a multiple of any block size
    assert second["height"] != second["width"]  # a swapped height and width shows
    for sizes in (first, second, long):
        assert max(math.prod(s) for s in input_shapes(tree, sizes)) <= CPU_BUDGET.max_elements
    # The long set: one axis long (odd), the rest at their floors.
    assert max(long.values()) > 2 * max(first.values()) and max(long.values()) % 2


def test_a_size_on_more_than_one_axis_is_capped() -> None:
    # A square matmul: its work grows with the cube of N, though its inputs fit.
    source = (TASKS / "matmul.py").read_text().replace("M = 45", "M = 4096")
    source = source.replace("torch.randn(M, K), torch.randn(K, N)", "torch.randn(M, M)] * 2 + [")
    first = auto_shape_sets(source, "cpu")[0]
    assert first["M"] <= CPU_BUDGET.max_dim < 2 * first["M"]


def test_a_long_set_is_never_built_on_a_squared_axis() -> None:
    source = (TASKS / "matmul.py").read_text().replace("M = 45", "M = 40000")
    source = source.replace("torch.randn(K, N)", "torch.randn(K, M)")
    sets = auto_shape_sets(source, "cpu")
    assert len(sets) == 2  # M is in both A(M, K) and B(K, M): no long M


def test_the_policy_is_deterministic() -> None:
    assert auto_shape_sets(CONV_TASK, "cpu") == auto_shape_sets(CONV_TASK, "cpu")


def test_a_task_without_sizes_is_checked_as_it_is() -> None:
    assert auto_shape_sets("import torch\n", "cpu") == [{}]
    assert auto_shape_sets("not python(", "cpu") == [{}]


# ------------------------------------------- relations between sizes the reference needs

# Each task below relies on something about its sizes that a shape set of the policy once
# broke (the reference failed there, so the verifier skipped the set).
DEPTHWISE_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, groups=in_channels)

    def forward(self, x):
        return torch.tanh(self.conv(x))

batch_size = 32
in_channels = 96
out_channels = 96
kernel_size = 3
rows = 384
cols = 640

def get_inputs():
    return [torch.rand(batch_size, in_channels, rows, cols)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
"""

# ``margins * signs``: signs of shape (batch_size,) broadcast against the last axis of
# margins, (batch_size, n), which the task has equal to the batch size.
BROADCAST_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, margins, signs):
        return torch.relu(0.5 - margins * signs).mean()

batch_size = 8192
input_shape = (8192,)

def get_inputs():
    return [torch.randn(batch_size, *input_shape), torch.randn(batch_size).sign()]

def get_init_inputs():
    return []
"""

# The group count is a parameter's default, not a size constant.
GROUP_DEFAULT_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, num_groups=4):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, 3)
        self.norm = nn.GroupNorm(num_groups, out_channels)

    def forward(self, x):
        return self.norm(self.conv(x))

batch_size = 256
in_channels = 6
out_channels = 24
length = 4096

def get_inputs():
    return [torch.rand(batch_size, in_channels, length)]

def get_init_inputs():
    return [in_channels, out_channels]
"""

# A pooling window over a linear layer's features: the inputs have no spatial axis.
FEATURE_POOL_TASK = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, pool_size):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.pool = nn.MaxPool1d(pool_size)

    def forward(self, x):
        return self.pool(self.linear(x).unsqueeze(1)).squeeze(1).sum(dim=1)

batch_size = 512
in_features = 4096
out_features = 2048
pool_size = 12

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, pool_size]
"""


def reference_error(task: str, sizes: dict[str, int]) -> str | None:
    module = load_task(task, sizes, "kf_test_relation")
    try:
        module.Model(*module.get_init_inputs())(*module.get_inputs())
    except (RuntimeError, ValueError) as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    "task",
    [DEPTHWISE_TASK, BROADCAST_TASK, GROUP_DEFAULT_TASK, FEATURE_POOL_TASK],
    ids=["depthwise", "broadcast", "group_default", "feature_pool"],
)
def test_the_reference_runs_on_every_set(task: str) -> None:
    sets = auto_shape_sets(task, "cpu")
    assert len(sets) >= 2
    errors = {str(s): reference_error(task, s) for s in sets}
    assert not any(errors.values()), errors


def test_a_depthwise_convolution_keeps_its_channel_counts_equal() -> None:
    sets = auto_shape_sets(DEPTHWISE_TASK, "cpu")
    assert len(sets) == 3
    gpu = auto_shape_sets(DEPTHWISE_TASK, "cuda")[1]
    assert all(s["in_channels"] == s["out_channels"] for s in [*sets, gpu])
    assert sets[1]["rows"] != sets[1]["cols"]  # the other sizes still differ in set 2
    # Equal channel counts that no grouping relates still differ in set 2.
    plain = DEPTHWISE_TASK.replace(", groups=in_channels", "")
    second = auto_shape_sets(plain, "cpu")[1]
    assert second["in_channels"] != second["out_channels"]


def test_inputs_combined_as_they_come_keep_the_sizes_they_meet_equal() -> None:
    sets = auto_shape_sets(BROADCAST_TASK, "cpu")
    gpu = auto_shape_sets(BROADCAST_TASK, "cuda")[1]
    assert all(s["batch_size"] == s["input_shape[0]"] for s in [*sets, gpu])
    assert sets[1]["batch_size"] % 2  # set 2 still changes them
    # A reshaped input no longer broadcasts as it came: the sizes change apart.
    reshaped = BROADCAST_TASK.replace("margins * signs", "margins * signs.unsqueeze(1)")
    second = auto_shape_sets(reshaped, "cpu")[1]
    assert second["batch_size"] != second["input_shape[0]"]


def test_a_group_count_written_as_a_default_keeps_channels_multiples_of_it() -> None:
    for device in ("cpu", "cuda"):
        sets = auto_shape_sets(GROUP_DEFAULT_TASK, device)
        assert all({"out_channels": 24, **s}["out_channels"] % 4 == 0 for s in sets)


def test_features_a_window_slides_over_stay_wide_enough_for_it() -> None:
    sets = auto_shape_sets(FEATURE_POOL_TASK, "cpu")
    assert len(sets) == 3
    assert all(s["out_features"] >= 12 for s in sets)
