"""The golden logs (tests/data/golden/*.jsonl): logs this version wrote, for a success, a
failure, a search, a rollout and agentflow tasks, kept so that later versions are held
to them (tests/unit/test_golden_logs.py folds each and re-decides every recorded
decision).

Written once, by the CLI on the embedded default with scripted LLMs, and committed;
written again only on purpose (a new kind of run worth holding to)::

    .venv/bin/python -m tests.golden_logs            # writes tests/data/golden/<name>.jsonl
    .venv/bin/python -m tests.golden_logs NAME ...   # writes only those

A log that later code decides otherwise is not rewritten to make the test pass: the
change needs an upcaster or a versioned rule (docs/extending.md).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "golden"
EXAMPLES = REPO / "examples"
KERNELFLOW = [sys.executable, "-m", "kernelflow"]
RELU = str(EXAMPLES / "tasks" / "relu.py")
RELU_SCRIPT = f"scripted:{EXAMPLES / 'scripted' / 'relu.yaml'}"
ARITHMETIC = str(EXAMPLES / "datasets" / "arithmetic.jsonl")

# name -> the command that makes its log (run in a data dir of its own)
RUNS: dict[str, list[str]] = {
    "success": ["run", RELU, "--llm", RELU_SCRIPT],
    "failure": [
        "run", RELU, "--workflow", str(GOLDEN / "fail_workflow.yaml"), "--llm", RELU_SCRIPT,
    ],
    "search": [
        "bench", RELU, "--samples", "2", "--workflow", "coder_only", "--llm", RELU_SCRIPT,
    ],
    "rollout": [
        "rollout", "--dataset", ARITHMETIC, "--limit", "1", "--agent", "react",
        "--tools", "calculator", "--llm",
        f"scripted:{EXAMPLES / 'scripted' / 'arithmetic_react.yaml'}",
    ],
    "agentflow": [
        "rollout", "--workflow", "agentflow", "--dataset", ARITHMETIC, "--limit", "1",
        "--tools", "calculator", "--llm", f"scripted:{GOLDEN / 'agentflow.yaml'}",
    ],
    # Routing version 2 (issue 54): retries within the turns, a MAYBE that does not parse.
    "agentflow_retries": [
        "rollout", "--workflow", "agentflow", "--dataset", ARITHMETIC, "--limit", "1",
        "--tools", "calculator", "--llm", f"scripted:{GOLDEN / 'agentflow_retries.yaml'}",
    ],
}  # fmt: skip


def write(name: str, command: list[str]) -> Path:
    """Run ``command`` on a fresh embedded default and export its whole log."""
    with tempfile.TemporaryDirectory(prefix="kf-golden-") as tmp:
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "KF_DATA_DIR": f"{tmp}/data"}
        run = subprocess.run(
            [*KERNELFLOW, *command, "--out", f"{tmp}/out"] if command[0] == "run" else
            [*KERNELFLOW, *command],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if run.returncode not in (0, 1):  # a failed task exits 1: the failure is the point
            raise SystemExit(f"{name}: {' '.join(command)} exited {run.returncode}\n{run.stderr}")
        target = GOLDEN / f"{name}.jsonl"
        export = subprocess.run(
            [*KERNELFLOW, "log", "export", "--out", str(target)],
            cwd=tmp, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if export.returncode != 0:
            raise SystemExit(f"{name}: log export failed\n{export.stderr}")
    return target


def main(names: list[str]) -> int:
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise SystemExit(f"no golden run {unknown[0]!r}; there are: {', '.join(RUNS)}")
    for name in names or RUNS:
        print(f"{name}: {write(name, RUNS[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
