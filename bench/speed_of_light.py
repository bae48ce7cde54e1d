"""How good a kernel is beyond its speedup: each C++ kernel of examples/candidates/cpp/
checked on its level-1 problem as the verifier checks it, with its speedup over eager
PyTorch (the baseline, timed in the same check) and its fraction of this machine's
speed-of-light (docs/verifier.md, "Speed-of-light").

    python bench/speed_of_light.py [--threads N] [--cache DIR]

Expected: a fused elementwise kernel reaches a sane fraction of the measured memory
bandwidth, a deliberately slow one far less; the problems are memory-bound (an
elementwise op counts no FLOPs). A figure over 1 would mean the counts missed work.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from kernelflow.projections.speedups import report_conclusive, report_interval, speedup_text
from kernelflow.verification.engine import VerifierConfig, verify, warm_up

REPO = Path(__file__).resolve().parent.parent
LEVEL1 = REPO / "examples/kernelbench/level1"
KERNELS = REPO / "examples/candidates/cpp"
# (problem, kernel): the fused kernel of three problems, and two slower ones of the first.
TABLE = [
    ("12_tanh_gelu", "tanh_gelu_fused"),
    ("12_tanh_gelu", "tanh_gelu_scalar"),
    ("12_tanh_gelu", "tanh_gelu_slow"),
    ("3_hardswish", "hardswish_fused"),
    ("5_row_softmax", "row_softmax_fused"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, help="CPU threads of the timing (default: every core)")
    p.add_argument("--cache", help="the extension cache (default: a fresh one: every build)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-sol-") as tmp:
        config = VerifierConfig(
            extension_cache=args.cache or str(Path(tmp, "cache")), threads=args.threads
        )
        warm_up(config)
        rows = []
        for problem, kernel in TABLE:
            task = (LEVEL1 / f"{problem}.py").read_text()
            code = (KERNELS / f"{kernel}.py").read_text()
            report = verify(task, code, backend="cpp", config=config)
            if not report.passed:
                sys.exit(f"{kernel} did not pass on {problem}: {report.summary}")
            speedup = speedup_text(
                report.speedup, report_interval(report), report_conclusive(report)
            )
            limit = report.roofline
            sol = "-" if limit is None else f"{limit.sol_fraction:.1%}"
            bound = "-" if limit is None else f"{limit.bound} ({limit.attainable_ms:.3g} ms)"
            peaks = (
                ""
                if limit is None
                else f"{limit.peak_gbs:.0f} GB/s, {limit.peak_gflops:.0f} GFLOP/s"
            )
            rows.append((problem, kernel, speedup, sol, bound, peaks))
            print(f"{problem} / {kernel}: speedup {speedup}; speed-of-light {sol}", flush=True)
    print()
    headers = ["problem", "kernel", "speedup over eager (95 % interval)", "speed-of-light"]
    print("| " + " | ".join([*headers, "bound (attainable)", "peaks"]) + " |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
