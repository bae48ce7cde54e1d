"""The predefined ``agentic`` workflow (docs/workflows.md): one coding agent with the
kernel engineer's tools, through ``kernelflow run`` (its daemon in the process) with a
scripted model that times a slow C++ kernel, reads that it is far from speed-of-light,
times a fused one and hands that over; the verifier's verdict decides."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import EXAMPLES, cli_env, run_cli

TASK = EXAMPLES / "kernelbench" / "level1" / "12_tanh_gelu.py"
SLOW = (EXAMPLES / "candidates" / "cpp" / "tanh_gelu_slow.py").read_text()
FUSED = (EXAMPLES / "candidates" / "cpp" / "tanh_gelu_fused.py").read_text()


def engineer_script(tmp_path: Path) -> Path:
    """The engineer's replies: time the slow kernel, time the fused one, answer it."""
    script = {
        "engineer": [
            {
                "text": "Thought: A first kernel, one scalar pass; let me time it.\n"
                f"Action: time_kernel(code='''{SLOW}''')\n"
            },
            {
                "text": "Thought: Far from speed-of-light for a memory-bound op: fuse the "
                "whole formula into one vectorisable pass.\n"
                f"Action: time_kernel(code='''{FUSED}''')\n"
            },
            {"text": f"Thought: This one is faster.\nFinal Answer:\n```python\n{FUSED}```\n"},
        ]
    }
    path = tmp_path / "engineer.yaml"
    path.write_text(yaml.safe_dump(script, width=1000))
    return path


def test_the_agentic_workflow_times_kernels_and_hands_over_the_faster(
    tmp_path: Path, extension_cache: Path
) -> None:
    env = cli_env(
        KF_DATA_DIR=str(tmp_path / "data"),
        KF_EXTENSION_CACHE=str(extension_cache),  # what other tests built, found built
        KF_VERIFY_THREADS="1",
    )
    done = run_cli(
        "run", str(TASK), "--workflow", "agentic", "--backend", "cpp",
        "--llm", f"scripted:{engineer_script(tmp_path)}", "--json",
        env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "success" and result["verdict"] == "pass"
    assert result["final_code"].strip() == FUSED.strip()
    task = result["task_id"]
    trajectory = run_cli("replay", task, "--json", env=env)
    assert trajectory.returncode == 0, trajectory.stderr
    steps = json.loads(trajectory.stdout)["steps"]
    timed = [
        s
        for s in steps
        if s.get("tool_name") == "time_kernel" and s["step_type"] == "action_result"
    ]
    assert len(timed) == 2  # the slow kernel, then the fused one: each a recorded call
    for s in timed:
        assert "speedup over eager PyTorch: " in s["content"]
        assert "speed-of-light: " in s["content"] and "(memory-bound: " in s["content"]
