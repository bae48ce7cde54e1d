"""The ``cupy`` backend: CUDA C candidates compiled and launched with CuPy raw kernels.

On a machine without a CUDA GPU the verdict is ``unsupported`` (never a crash, never a
pass). The static gate is checked everywhere. The sandbox's CuPy plumbing (launch
counting through ``RawKernel``/``RawModule.get_function``, the PyTorch-op guard around
``cupy.from_dlpack`` views) runs here against a stand-in ``cupy`` module whose raw
"kernels" are numpy code on CPU tensors; on a CUDA machine the real thing runs instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kernelflow.verification.engine import detect_device, verify
from kernelflow.verification.gate import check_candidate
from tests.child_jobs import RELU_TASK, run_child_job

ROOT = Path(__file__).resolve().parents[2]
CUDA = ROOT / "examples" / "candidates" / "cupy"
RELU_CUDA = (CUDA / "relu.py").read_text()


def rules(source: str) -> set[str]:
    return {v.rule for v in check_candidate(source, backend="cupy", task_source=RELU_TASK)}


# --------------------------------------------------------------------------- gate


def test_gate_accepts_the_cuda_candidate() -> None:
    assert check_candidate(RELU_CUDA, backend="cupy", task_source=RELU_TASK) == []


def test_gate_refuses_cupy_for_the_triton_backend() -> None:
    assert {"forbidden_import", "no_kernel"} <= {v.rule for v in check_candidate(RELU_CUDA)}


@pytest.mark.parametrize(
    ("name", "expected"),
    [("torch_instead", {"torch_compute", "no_kernel"}), ("cupy_compute", {"torch_compute"})],
)
def test_gate_rejects_cuda_cheats(name: str, expected: set[str]) -> None:
    assert rules((CUDA / f"{name}.py").read_text()) == expected


def test_gate_requires_a_launched_global_kernel() -> None:
    no_launch = RELU_CUDA.replace("        self.relu_kernel(\n", "        (\n")
    assert "self.relu_kernel(" not in no_launch
    assert rules(no_launch) == {"no_kernel"}
    no_global = RELU_CUDA.replace("__global__", "__device__")
    assert rules(no_global) == {"no_kernel"}
    not_compiled = RELU_CUDA.replace("cupy.RawModule(code=RELU_SOURCE)", "RELU_SOURCE")
    assert "no_kernel" in rules(not_compiled)
    direct = RELU_CUDA.replace(
        'cupy.RawModule(code=RELU_SOURCE).get_function("relu_kernel")',
        'cupy.RawKernel(RELU_SOURCE, "relu_kernel")',
    )
    assert rules(direct) == set()


def test_gate_rejects_cupy_streams() -> None:
    side = RELU_CUDA.replace(
        "        self.relu_kernel(\n",
        "        s = cupy.cuda.Stream(non_blocking=True)\n        self.relu_kernel(\n",
    )
    assert "stream_trick" in rules(side)


# --------------------------------------------------------------------------- no GPU here


def test_cupy_backend_is_unsupported_without_a_gpu() -> None:
    if detect_device() == "cuda":
        pytest.skip("this machine has a CUDA GPU")
    report = verify(RELU_TASK, RELU_CUDA, backend="cupy")
    assert report.verdict == "unsupported"
    assert "device" in report.summary and "no CUDA GPU" in report.summary
    assert report.backend == "cupy" and report.device == "cpu"
    assert report.feedback.startswith("Verdict: unsupported.")


def test_cuda_candidate_passes_on_a_gpu() -> None:
    if detect_device() != "cuda" or importlib.util.find_spec("cupy") is None:
        pytest.skip("needs a CUDA GPU and CuPy")
    report = verify(RELU_TASK, RELU_CUDA, backend="cupy")
    assert report.verdict == "pass", (report.summary, report.errors)
    assert report.speedup is not None
    cheat = verify(RELU_TASK, (CUDA / "torch_instead.py").read_text(), backend="cupy")
    assert cheat.verdict == "rejected_static"


# --------------------------------------------------------------------------- sandbox plumbing

FAKE_CUPY = '''
"""Stand-in for CuPy without a GPU: a raw kernel runs a numpy function of the same name."""
import numpy

int32, int64, float32 = numpy.int32, numpy.int64, numpy.float32
DEVICES = {devices}


def _relu_kernel(x, y, n):
    numpy.maximum(x.reshape(-1)[:n], 0, out=y.reshape(-1)[:n])


class cuda:
    class runtime:
        @staticmethod
        def getDeviceCount():
            if not DEVICES:
                raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
            return DEVICES


def from_dlpack(tensor):
    return numpy.from_dlpack(tensor)  # a view: the "kernel" writes the tensor's memory


class RawKernel:
    def __init__(self, code, name, **options):
        assert "__global__" in code and name in code
        self.name = name

    def __call__(self, grid, block, args, **options):
        globals()["_" + self.name](*args)


class RawModule:
    def __init__(self, code, **options):
        self.code = code

    def get_function(self, name):
        return RawKernel(self.code, name)
'''


def run_sandbox(tmp_path: Path, candidate: str, devices: int = 1) -> dict[str, object]:
    """One job in a fresh sandbox process that imports the stand-in CuPy."""
    fake = tmp_path / "fake"
    (fake / "cupy").mkdir(parents=True)
    (fake / "cupy" / "__init__.py").write_text(FAKE_CUPY.format(devices=devices))
    shapes = [{}, {"batch_size": 5, "dim": 77}]
    return run_child_job(
        tmp_path / "work", candidate, fake, backend="cupy", trials=2, shapes=shapes
    )


def test_sandbox_counts_raw_kernel_launches(tmp_path: Path) -> None:
    result = run_sandbox(tmp_path, RELU_CUDA)
    assert result["verdict"] == "pass", result
    assert result["trials"] == 2


def test_sandbox_rejects_forward_that_launches_no_cuda_kernel(tmp_path: Path) -> None:
    lazy = RELU_CUDA.replace("        self.relu_kernel(\n", "        (\n")
    result = run_sandbox(tmp_path, lazy)
    assert result["verdict"] == "rejected_runtime", result
    assert "launched no CUDA kernel" in str(result["reasons"]), result


def test_sandbox_catches_torch_ops_in_a_cuda_candidate(tmp_path: Path) -> None:
    result = run_sandbox(tmp_path, (CUDA / "torch_instead.py").read_text())
    assert result["verdict"] == "rejected_runtime", result
    assert str(result["reasons"]).startswith("['torch_compute:"), result


def test_sandbox_answers_unsupported_when_cupy_sees_no_device(tmp_path: Path) -> None:
    result = run_sandbox(tmp_path, RELU_CUDA, devices=0)
    assert result["verdict"] == "unsupported", result
    assert "unsupported on this device (cpu)" in str(result["summary"])
    assert "no CUDA-capable device" in str(result["summary"])
