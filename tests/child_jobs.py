"""Run one verifier job in a fresh sandbox child, for tests that must put something of
their own on its import path (a plugin backend, a stand-in CuPy): hence no ``-I``, and
PYTHONPATH naming what they add."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernelflow.verification.child.remote import CANDIDATE_DIR
from kernelflow.verification.engine import CHILD_MODULE
from tests.conftest import EXAMPLES

RELU_TASK = (EXAMPLES / "tasks" / "relu.py").read_text()


def run_child_job(work: Path, candidate: str, import_path: Path, **job: Any) -> dict[str, object]:
    """Check ``candidate`` against the ReLU task in ``work`` (created), the job's fields
    defaulting to one CPU trial of the Triton backend, and return its result."""
    (work / CANDIDATE_DIR).mkdir(parents=True)
    (work / "task.py").write_text(RELU_TASK)
    (work / CANDIDATE_DIR / "candidate.py").write_text(candidate)
    fields = {
        "task_file": "task.py",
        "candidate_file": "candidate.py",
        "trials": 1,
        "device": "cpu",
        "backend": "triton",
        "shapes": [{}],
        "memory_kind": "none",
        "fs_isolation": False,
        **job,
    }
    (work / "job.json").write_text(json.dumps(fields))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(import_path),
        "TRITON_INTERPRET": "1",
        "OMP_NUM_THREADS": "2",
    }
    result_r, result_w = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-m", CHILD_MODULE, str(work), "--result-fd", str(result_w)],
            env=env,
            capture_output=True,
            timeout=180,
            check=False,
            pass_fds=(result_w,),
        )
    finally:
        os.close(result_w)
    with os.fdopen(result_r, "rb") as pipe:
        said = pipe.read()
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    result: dict[str, object] = json.loads(said)
    return result
