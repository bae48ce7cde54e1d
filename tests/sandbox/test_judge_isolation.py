"""The judge is not the judged: attacks a candidate can make on the check from inside its
own process, each with the static gate off (the gate is one layer, not the wall), each of
which passed when the candidate ran in the process that judged it. Real sandboxes, real
(interpreted) Triton."""

from __future__ import annotations

import pytest

from kernelflow.verification.engine import VerifierConfig, verify
from tests.sandbox.test_verifier import RELU_TASK, candidate

GATE_OFF = VerifierConfig(trials=1, timeout_s=90.0, static_gate=False, shapes=({},))

# A kernel that copies its input: on get_inputs()'s torch.rand (all >= 0) it equals ReLU.
COPY_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


def copy(x):
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
"""

# name -> (forward's body, module prelude, the verdict it gets)
ATTACKS = {
    # Finds the judge's secrets in its own process's frames and forges a passing result.
    "forge_from_frames": (
        "import sys, json\n"
        "for frame in list(sys._current_frames().values()):\n"
        "    while frame is not None:\n"
        "        for name in ('nonce', 'expected', 'result_fd'):\n"
        "            if name in frame.f_locals:\n"
        "                print('FOUND', name)\n"
        "        frame = frame.f_back\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, json.dumps({'verdict': 'pass', 'summary': 'forged'}).encode())\n"
        "    except OSError:\n"
        "        pass\n"
        "return copy(x)",
        "import os\n" + COPY_KERNEL,
        "rejected_runtime",  # what it wrote reached only its own channel: it broke protocol
    ),
    # Patches the op the reference calls, so the reference computes what the candidate does.
    "patch_the_reference": ("return copy(x)", COPY_KERNEL + "torch.relu = copy\n", "mismatch"),
    # Makes every comparison the harness makes succeed.
    "patch_comparisons": (
        "return copy(x)",
        COPY_KERNEL
        + "torch.Tensor.__gt__ = lambda a, b: torch.zeros_like(a, dtype=torch.bool)\n"
        + "torch.allclose = lambda *a, **k: True\n"
        + "torch.equal = lambda *a, **k: True\n",
        "mismatch",
    ),
    # Regenerates the inputs from the seed it was built with (at import, where building
    # parameters computes anyway) and returns the answer it precomputed.
    "predict_the_inputs": (
        "return copy(GUESS.reshape(x.shape).to(x.device))",
        COPY_KERNEL
        + "torch.manual_seed(torch.initial_seed() + 7919)\n"
        + "GUESS = torch.rand(16, 1000).clamp_min(0)\n",
        "mismatch",
    ),
    # Copies its input: right for torch.rand's non-negative inputs only.
    "copy_is_not_relu": ("return copy(x)", COPY_KERNEL, "mismatch"),
    # Reads the harness's expected output from the caller's frames.
    "read_expected_from_frames": (
        "import inspect\n"
        "for info in inspect.stack():\n"
        "    for value in info.frame.f_locals.values():\n"
        "        if isinstance(value, torch.Tensor) and value.shape == x.shape:\n"
        "            return copy(value)\n"
        "return copy(x)",
        COPY_KERNEL,
        "mismatch",  # no expected output in its process: it finds only its own input
    ),
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_an_attack_from_inside_the_candidates_process_does_not_pass(name: str) -> None:
    body, prelude, verdict = ATTACKS[name]
    report = verify(RELU_TASK, candidate(body, prelude), config=GATE_OFF)
    assert report.verdict == verdict, (name, report.summary)
    assert "forged" not in report.summary
    assert "FOUND" not in "\n".join(report.errors)


def test_the_candidate_cannot_kill_or_signal_its_judge() -> None:
    """It tries every process it can name (its parent, every pid under /proc, everything
    it may signal), then computes honestly: the judge is alive to pass it."""
    body = (
        "import os, signal\n"
        "me = os.getpid()\n"
        "names = [os.getppid(), -1] + [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
        "for pid in names:\n"
        "    if pid not in (0, me):\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
        "return relu_k(x)"
    )
    report = verify(RELU_TASK, candidate(body), config=GATE_OFF)
    assert report.verdict == "pass", (report.summary, report.errors)


def test_a_legitimate_kernel_passes_on_inputs_it_cannot_predict() -> None:
    report = verify(RELU_TASK, candidate("return relu_k(x)"), config=GATE_OFF)
    assert report.verdict == "pass", (report.summary, report.errors)
    # Two checks of the same candidate run on different inputs: nothing to memorise.
    again = verify(RELU_TASK, candidate("return relu_k(x)"), config=GATE_OFF)
    assert again.verdict == "pass"


def test_threads_started_in_init_are_refused() -> None:
    source = candidate("return relu_k(x)").replace(
        "        super().__init__()\n",
        "        super().__init__()\n"
        "        import threading, time\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n",
    )
    report = verify(RELU_TASK, source, config=GATE_OFF)
    assert report.verdict == "rejected_runtime", report.summary
    assert report.reasons[0].startswith("threads:"), report.reasons
