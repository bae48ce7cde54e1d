"""The timing's own noise: a kernel timed against itself by the real verifier.

    python bench/timing_noise.py [--runs 3] [--threads N]

The reference of the task is the fused C++ GELU of examples/candidates/cpp/ (its module,
with ``ModelNew`` renamed ``Model``), the candidate is the same module: the verifier
builds and times the same code in the judge's process (the baseline) and in the
candidate's (``kernelflow verify --backend cpp``'s path, interleaved rounds and all). The
true ratio is 1; what each run measures, its 95 % interval, and the spread across runs
are the noise any speedup on this machine carries. The judge compiles its copy in each
run (its sandbox starts empty): a run takes about a compile's time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from kernelflow.verification.engine import VerifierConfig, verify

REPO = Path(__file__).resolve().parent.parent
KERNEL = REPO / "examples/candidates/cpp/tanh_gelu_fused.py"
SIZES = """

batch_size = 512
dim = 512


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""


def self_task() -> str:
    """The kernel's module as a task: its ``ModelNew`` as the reference ``Model``."""
    return KERNEL.read_text().replace("class ModelNew(", "class Model(") + SIZES


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, help="CPU threads of the timing (default: every core)")
    args = p.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory(prefix="kf-noise-") as cache:
        config = VerifierConfig(extension_cache=cache, trials=1, shapes=({},), threads=args.threads)
        for run in range(1, args.runs + 1):
            report = verify(self_task(), KERNEL.read_text(), backend="cpp", config=config)
            timing = report.timing
            if report.speedup is None or timing is None:
                sys.exit(f"run {run}: {report.verdict}: {report.summary} {report.errors}")
            low, high = timing.speedup_ci95
            ratios.append(report.speedup)
            print(
                f"run {run}: the kernel against itself: ratio {report.speedup:.3f} (95 % "
                f"interval {low:.3f} to {high:.3f}); candidate "
                f"{timing.candidate_ms['median']:.4g} ms, baseline "
                f"{timing.baseline_ms['median']:.4g} ms; {timing.reps} calls x "
                f"{timing.rounds} rounds, {timing.threads} thread(s)"
            )
    spread = max(ratios) / min(ratios)
    print(
        f"over {len(ratios)} runs: median ratio {statistics.median(ratios):.3f} (true: 1), "
        f"from {min(ratios):.3f} to {max(ratios):.3f}; max/min {spread:.3f}"
    )


if __name__ == "__main__":
    main()
