"""The GPU acceptance run (``bench/gpu_check.py``, ``make gpu-check``), tested where no
GPU is: its problems and candidates pair up (the Triton ones pass on the CPU, the GPU
backends' pass the static gate on their problems), and without a GPU every GPU check
answers ``unsupported``, saying why, never a crash or a pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_check import PROBLEMS
from kernelflow.verification.gate import gate_findings
from tests.conftest import REPO

SCRIPT = [sys.executable, str(REPO / "bench" / "gpu_check.py")]


def run_check(*args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    done = subprocess.run(
        [*SCRIPT, *args, "--json"], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    return done.returncode, json.loads(done.stdout)


@pytest.mark.parametrize(
    ("problem", "backend"),
    [(p, b) for p in PROBLEMS for b in p.candidates],
    ids=lambda v: v if isinstance(v, str) else v.own.stem,
)
def test_every_candidate_passes_the_gate_on_its_problem(problem, backend: str) -> None:  # type: ignore[no-untyped-def]
    violations, warnings = gate_findings(
        problem.candidates[backend].read_text(),
        backend=backend,
        task_source=problem.own.read_text(),
    )
    assert [v.text() for v in violations] == [] and warnings == []


def test_on_the_cpu_the_triton_candidates_pass_and_the_gpu_ones_are_unsupported(
    tmp_path: Path,
) -> None:
    code, out = run_check("--device", "cpu", "--problems", str(tmp_path), "--corpus", str(tmp_path))
    assert code == 1  # not every check passed
    by_backend: dict[str, list[dict]] = {}  # type: ignore[type-arg]
    for row in out["checks"]:
        by_backend.setdefault(row["backend"], []).append(row)
    assert {r["verdict"] for r in by_backend["triton"]} == {"pass"}
    for backend in ("cuda", "cupy"):
        for row in by_backend[backend]:
            assert row["verdict"] == "unsupported"
            assert "no CUDA GPU" in row["summary"]
    assert out["card"]["devices"][0]["device_name"].startswith("cpu")
    assert out["card"]["timing"] is None  # nothing timed, and the card says so


def test_asked_for_the_gpu_where_there_is_none_every_check_says_so(tmp_path: Path) -> None:
    code, out = run_check("--problems", str(tmp_path), "--corpus", str(tmp_path))
    assert code == 1
    assert {row["verdict"] for row in out["checks"]} == {"unsupported"}
    assert all("no CUDA GPU" in row["summary"] for row in out["checks"])


def test_the_world_s_code_is_checked_where_the_corpus_is_fetched(tmp_path: Path) -> None:
    # A corpus laid out as bench/corpus/fetch.py writes it, of kernels written here: the
    # prompt example's place and one CUDA entry.
    prompts = tmp_path / "kernelbench" / "prompts"
    prompts.mkdir(parents=True)
    relu_task = (REPO / "examples/tasks/relu.py").read_text()
    relu_cuda = (REPO / "examples/candidates/cuda/relu.py").read_text()
    (prompts / "model_ex_add.py").write_text(relu_task)
    (prompts / "model_new_ex_add.py").write_text(relu_cuda)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "relu.py").write_text(relu_cuda)
    (tmp_path / "problems").mkdir()
    (tmp_path / "problems" / "relu.py").write_text(relu_task)
    entry = {
        "id": "here-L1-19-a",
        "source": "here",
        "backend": "cuda",
        "level": 1,
        "problem": 19,
        "kernel": "kernels/relu.py",
        "problem_source": "problems/relu.py",
    }
    (tmp_path / "index.json").write_text(json.dumps([entry]))
    empty = tmp_path / "no-problems"
    empty.mkdir()
    code, out = run_check("--device", "cpu", "--problems", str(empty), "--corpus", str(tmp_path))
    world = [row for row in out["checks"] if not row["candidate"].startswith("examples/")]
    assert [row["problem"] for row in world] == [
        "KernelBench prompts/model_new_ex_add.py",
        "corpus here-L1-19-a",
    ]
    assert {row["verdict"] for row in world} == {"unsupported"}  # no GPU here, and it says so
    assert code == 1
