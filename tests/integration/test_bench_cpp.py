"""``kernelflow bench --backend cpp``: C++ kernels searched, built, checked and timed on
the CPU, with a local OpenAI-compatible server standing in for the model: the run's
numbers are measured (fast_p for p > 0, speedups, their intervals on the card)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import EXAMPLES, cli_env, run_cli
from tests.fake_llm_servers import FakeOpenAI

FUSED = (EXAMPLES / "candidates" / "cpp" / "tanh_gelu_fused.py").read_text()


def policy(body: dict[str, Any]) -> str:
    """A coder that writes the fused C++ GELU, whatever it is asked."""
    return f"```python\n{FUSED}```"


def test_bench_of_cpp_kernels_reports_measured_speedups(
    tmp_path: Path, extension_cache: Path
) -> None:
    problems = tmp_path / "level1"
    problems.mkdir()
    shutil.copy(EXAMPLES / "kernelbench" / "level1" / "12_tanh_gelu.py", problems)
    # One thread: the suite's other worker shares these cores (OpenMP's barriers would
    # turn a core taken away into a timeslice's wait).
    env = cli_env(
        KF_DATA_DIR=str(tmp_path / "data"),
        KF_VERIFY_THREADS="1",
        KF_EXTENSION_CACHE=str(extension_cache),
    )
    with FakeOpenAI(policy, model="policy") as server:
        result = run_cli(
            "bench",
            str(problems),
            "--backend",
            "cpp",
            "--samples",
            "1",
            "--workflow",
            "coder_only",
            "--llm",
            f"openai:{server.url}/v1#policy",
            "--json",
            env=env,
            timeout=600,
        )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["timed"] is True and out["note"] is None
    assert out["fast_p"]["0"] == 1.0
    (problem,) = out["problems"]
    assert problem["solved"]
    # A timing this machine's load left inconclusive is no figure: not counted, and said.
    if problem["speedup_conclusive"] is False:
        assert out["inconclusive"] == 1 and out["fast_p"]["1"] == 0.0
        assert out["geomean_speedup"] is None
    else:
        assert out["inconclusive"] == 0
        assert isinstance(out["fast_p"]["1"], float) and out["fast_p"]["1"] == 1.0
        assert out["geomean_speedup"] > 1.0 and problem["speedup"] > 1.0
    card = out["card"]
    (method,) = card["timing"]
    assert "on the CPU" in method["method"] and method["threads"] == [1]
    (timing,) = card["timings"]
    low, high = timing["speedup_ci95"]
    assert low <= problem["speedup"] <= high
    assert timing["speedup_conclusive"] == problem["speedup_conclusive"]
    assert "1 thread" in card["devices"][0]["device_name"]
