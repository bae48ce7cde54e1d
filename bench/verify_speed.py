"""Steady-state cost of verifying one small correct candidate.

Warm path: ``verify()`` with the default warm process (torch and triton imported once; a
fresh sandbox forked per candidate). Baseline, measured in the same run: the same check in
a naive fresh ``python -I -m kernelflow.verification.child`` subprocess per candidate,
which imports torch and triton every time (``VerifierConfig(warm=False)``). Same task,
candidate, trials and shape sets for both. Prints both, their ratio (target <= 0.3) and
candidates per minute.

    .venv/bin/python bench/verify_speed.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelflow.verification.engine import VerifierConfig, shutdown_warm_processes, verify  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    task = (ROOT / "examples" / "tasks" / "relu.py").read_text()
    cand = (ROOT / "examples" / "candidates" / "solutions" / "relu.py").read_text()
    common = {"trials": 1, "shapes": ({"batch_size": 4, "dim": 250},), "timeout_s": 120.0}
    warm, fresh = VerifierConfig(**common, warm=True), VerifierConfig(**common, warm=False)  # type: ignore[arg-type]
    for config in (warm, fresh):  # start the worker, probe the sandbox: not steady state
        assert verify(task, cand, config=config).passed
    warm_s: list[float] = []
    fresh_s: list[float] = []
    for _ in range(args.rounds):  # interleaved, so machine noise hits both
        for config, sink in ((warm, warm_s), (fresh, fresh_s)):
            started = time.perf_counter()
            report = verify(task, cand, config=config)
            sink.append(time.perf_counter() - started)
            assert report.passed, report.summary
    shutdown_warm_processes()
    w, f = statistics.median(warm_s), statistics.median(fresh_s)
    print(f"warm process (fork per candidate): median {w * 1000:.0f} ms per candidate")
    print(f"fresh subprocess (naive baseline): median {f * 1000:.0f} ms per candidate")
    print(f"ratio warm/fresh: {w / f:.3f} (target <= 0.3)")
    print(f"candidates per minute: warm {60 / w:.0f}, fresh {60 / f:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
