"""Shape sets the reference itself fails on: the verifier chose them, so the candidate is
never blamed. A set the reference fails on is skipped (whichever it is) without costing
trials, and where it fails on every set the sizes scaled together are checked instead
(two sets);
shape sets given explicitly are never skipped."""

from __future__ import annotations

from kernelflow.verification.engine import VerifierConfig, verify
from kernelflow.verification.shapes import auto_shape_sets, fallback_shape_sets

# The reference relies on a relation between two sizes (channels == 2 * length) that the
# policy's sets break (channels shrink to their floor first) and scaling keeps.
TASK = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        return torch.relu(x.repeat(1, 2).view(x.shape[0], self.channels))


batch_size = 4096
channels = 512
length = 256


def get_inputs():
    return [torch.rand(batch_size, length)]


def get_init_inputs():
    return [channels]
"""

CANDIDATE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def twice_relu_kernel(x_ptr, y_ptr, n, length, channels, HALF: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    row = offsets // channels
    col = offsets % channels
    if HALF:  # wrong: the second copy of each row left at zero
        keep = col < length
    else:
        keep = col >= 0
    x = tl.load(x_ptr + row * length + col % length, mask=mask & keep, other=0.0)
    tl.store(y_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.channels = channels

    def forward(self, x):
        x = x.contiguous()
        rows, length = x.shape
        y = torch.empty((rows, self.channels), dtype=x.dtype, device=x.device)
        n = y.numel()
        twice_relu_kernel[(triton.cdiv(n, 1024),)](
            x, y, n, length, self.channels, HALF=HALF, BLOCK=1024
        )
        return y


HALF = False
"""


def test_the_policy_s_sets_break_the_task_and_the_fallback_keeps_it() -> None:
    sets = auto_shape_sets(TASK, "cpu")
    own = {"batch_size": 4096, "channels": 512, "length": 256}
    assert all({**own, **s}["channels"] != 2 * {**own, **s}["length"] for s in sets)
    fallback = fallback_shape_sets(TASK, "cpu")
    assert all(s["channels"] == 2 * s["length"] for s in fallback)
    # The least scaling that fits the budget (no more shrunk than needed), and twice that.
    assert fallback == [
        {"batch_size": 512, "channels": 64, "length": 32},
        {"batch_size": 256, "channels": 32, "length": 16},
    ]
    assert fallback_shape_sets(TASK.replace("length = 256", "length = 255"), "cpu") == []


def test_code_written_for_one_shape_fails_on_the_fallback_sets() -> None:
    fixed = CANDIDATE.replace("rows, length = x.shape", "rows, length = 512, 32")
    first, second = fallback_shape_sets(TASK, "cpu")
    # On the first fallback set alone it would pass: the second is what catches it.
    alone = verify(TASK, fixed, config=VerifierConfig(shapes=(first,), timeout_s=120.0))
    assert alone.verdict == "pass", alone.summary
    report = verify(TASK, fixed, config=VerifierConfig(trials=3, timeout_s=120.0))
    assert report.verdict != "pass" and report.shapes[-1] == second, report.summary


def test_a_correct_kernel_is_checked_on_the_fallback_sets_with_every_trial() -> None:
    report = verify(TASK, CANDIDATE, config=VerifierConfig(trials=3, timeout_s=120.0))
    assert report.verdict == "pass", (report.summary, report.errors)
    assert report.shapes == fallback_shape_sets(TASK, "cpu")
    assert report.trials == 3  # the skipped sets cost no trials
    notes = "\n".join(report.errors)
    assert notes.count("skipped: the reference fails there") == len(auto_shape_sets(TASK, "cpu"))
    assert "checked instead" in notes


def test_a_wrong_kernel_fails_on_the_fallback_sets() -> None:
    wrong = CANDIDATE.replace("HALF = False", "HALF = True")
    report = verify(TASK, wrong, config=VerifierConfig(trials=3, timeout_s=120.0))
    assert report.verdict == "mismatch", (report.summary, report.errors)
    assert report.shapes[-1:] == fallback_shape_sets(TASK, "cpu")[:1]


def test_shape_sets_given_explicitly_are_never_skipped() -> None:
    sets = tuple(auto_shape_sets(TASK, "cpu"))
    report = verify(TASK, CANDIDATE, config=VerifierConfig(shapes=sets, timeout_s=120.0))
    assert report.verdict == "task_error" and report.fault == "task"  # not the candidate's
    assert "the task's reference model fails" in report.summary
