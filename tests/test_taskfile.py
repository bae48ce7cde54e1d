"""Static checks of task files and candidate modules (pure ast, nothing is executed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelflow.actors.verifier.taskfile import (
    CandidateError,
    TaskFileError,
    check_candidate_source,
    check_task_source,
)

TASKS = Path(__file__).resolve().parent.parent / "examples" / "tasks"

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
