"""The predefined ``agentic`` workflow (docs/workflows.md), the acceptance of issue 50 on
this machine: one coding agent with the kernel engineer's tools, through ``kernelflow run``
(its daemon in the process), with a scripted engineer that reads the roofline, times a slow
correct C++ kernel and hands it over; the kernel passes far below the target fraction of
speed-of-light, so it comes back to be improved (``improve_after_pass``): the engineer
profiles it, times a fused one and hands that over. The verifier's verdicts decide, the
task ends with the better kernel, and the trajectory exports as Flow-GRPO samples whose
responses are the model's turns alone, the tools' outputs observations in the prompts."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import EXAMPLES, cli_env, run_cli

TASK = EXAMPLES / "kernelbench" / "level1" / "12_tanh_gelu.py"
SLOW = (EXAMPLES / "candidates" / "cpp" / "tanh_gelu_slow.py").read_text()
FUSED = (EXAMPLES / "candidates" / "cpp" / "tanh_gelu_fused.py").read_text()


def engineer_script(tmp_path: Path) -> Path:
    """The engineer's replies, two hand-overs of three turns each."""
    first = [
        {"text": "Thought: What bounds this op on this machine?\nAction: roofline()\n"},
        {
            "text": "Thought: A first kernel, one scalar pass; let me time it.\n"
            f"Action: time_kernel(code='''{SLOW}''')\n"
        },
        {"text": f"Thought: Correct; hand it over.\nFinal Answer:\n```python\n{SLOW}```\n"},
    ]
    second = [
        {
            "text": "Thought: Far from speed-of-light: where does the time go?\n"
            f"Action: profile_kernel(code='''{SLOW}''')\n"
        },
        {
            "text": "Thought: Fuse the whole formula into one vectorisable pass.\n"
            f"Action: time_kernel(code='''{FUSED}''')\n"
        },
        {"text": f"Thought: This one is faster.\nFinal Answer:\n```python\n{FUSED}```\n"},
    ]
    path = tmp_path / "engineer.yaml"
    path.write_text(yaml.safe_dump({"engineer": first + second}, width=1000))
    return path


def test_the_agentic_engineer_improves_a_passing_kernel_and_its_turns_export(
    tmp_path: Path, extension_cache: Path
) -> None:
    # Two hand-overs: the limit, not the script running dry, ends the improving.
    workflow = tmp_path / "agentic_two_rounds.yaml"
    workflow.write_text("base: agentic\nlimitation_info:\n  required:\n    max_step: 4\n")
    env = cli_env(
        KF_DATA_DIR=str(tmp_path / "data"),
        KF_EXTENSION_CACHE=str(extension_cache),  # what other tests built, found built
        KF_VERIFY_THREADS="1",
    )
    done = run_cli(
        "run", str(TASK), "--workflow", str(workflow), "--backend", "cpp",
        "--llm", f"scripted:{engineer_script(tmp_path)}", "--json",
        env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["status"] == "success" and result["verdict"] == "pass"
    assert result["final_code"].strip() == FUSED.strip()  # the better of two passes
    assert result["sol_fraction"] is not None and result["sol_fraction"] > 0
    task = result["task_id"]

    trajectory = run_cli("replay", task, "--json", env=env)
    assert trajectory.returncode == 0, trajectory.stderr
    steps = json.loads(trajectory.stdout)["steps"]
    results = {
        s["tool_name"]: s["content"]
        for s in steps
        if s.get("tool_name") not in (None, "verifier") and s["step_type"] == "action_result"
    }
    assert set(results) == {"roofline", "time_kernel", "profile_kernel"}
    assert "memory-bound" in results["roofline"]
    assert "speed-of-light: " in results["time_kernel"]
    assert "tanh_gelu" in results["profile_kernel"]  # the extension's op, in its table
    # The verifier checked both kernels; the pass below the target came back to be improved.
    decided = [s["content"] for s in steps if "→" in s["content"]]
    assert any("below the target 80%: engineer improves it → engineer" in d for d in decided)

    # Flow-GRPO samples: one per engineer turn, the task's reward on each, the tool outputs
    # in the next turn's prompt (observations), never in a response (trained on).
    out = tmp_path / "grpo.jsonl"
    exported = run_cli("export", "grpo", "--task", task, "--out", str(out), env=env)
    assert exported.returncode == 0, exported.stderr
    samples = [json.loads(line) for line in out.read_text().splitlines()]
    assert [s["agent"] for s in samples] == ["engineer"] * 6
    assert len({s["reward"] for s in samples}) == 1 and samples[0]["reward"] > 0
    seen = results["roofline"][:60]
    assert seen in json.dumps(samples[1]["prompt"])
    assert all(seen not in s["response"] for s in samples)
