"""What a ``cpp`` verification costs: the first check of a source (it builds the extension)
against the checks after it (the extension cache has it), on the fused C++ GELU of
examples/candidates/cpp/ and examples/kernelbench/level1/12_tanh_gelu.py.

    python bench/cpp_verify_speed.py [--runs 5] [--threads N]

The verifier's warm process is started first (a daemon starts it before its first task),
so each figure is one verification as a daemon's verifier makes it: the gate, the build
(first run only) or the cache's lookup, the trials on three shape sets and the timing.
Also measured on its own: what finding the built extension and handing it to the
candidate costs (the cache's share of a cached check).

Targets: a cached check spends under 2 s on the extension (finding and installing it);
a whole cached check of this small elementwise problem takes under 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kernelflow.verification.backends.extension import wanted_extensions
from kernelflow.verification.engine import VerifierConfig, verify, warm_up
from kernelflow.verification.extensions import install, planned_extensions, toolchain, unbuilt

REPO = Path(__file__).resolve().parent.parent
TASK = (REPO / "examples/kernelbench/level1/12_tanh_gelu.py").read_text()
KERNEL = (REPO / "examples/candidates/cpp/tanh_gelu_fused.py").read_text()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="cached checks after the first")
    p.add_argument("--threads", type=int, help="CPU threads of the timing (default: every core)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-cpp-speed-") as tmp:
        config = VerifierConfig(extension_cache=str(Path(tmp, "cache")), threads=args.threads)
        warm_up(config)
        started = time.perf_counter()
        first = verify(TASK, KERNEL, backend="cpp", config=config)
        cold = time.perf_counter() - started
        if not first.passed:
            sys.exit(f"the first check did not pass: {first.summary}")
        cached = []
        for _ in range(args.runs):
            started = time.perf_counter()
            report = verify(TASK, KERNEL, backend="cpp", config=config)
            cached.append(time.perf_counter() - started)
            if not report.passed:
                sys.exit(f"a cached check did not pass: {report.summary}")
        lookups = []
        for run in range(args.runs):
            started = time.perf_counter()
            extensions = planned_extensions(
                wanted_extensions(KERNEL),
                Path(str(config.extension_cache)),
                toolchain(sys.executable),
            )
            assert not unbuilt(extensions)
            install(extensions, Path(tmp, f"candidate-{run}"))
            lookups.append(time.perf_counter() - started)
    median = statistics.median(cached)
    share = statistics.median(lookups)
    print(
        f"first check (builds the extension): {cold:.1f} s; cached checks: median "
        f"{median:.2f} s (from {min(cached):.2f} to {max(cached):.2f}, {args.runs} runs); "
        f"the build's share of the first: {cold - median:.1f} s"
    )
    print(
        f"the cache's share of a cached check (find, install): {1000 * share:.1f} ms "
        f"(target < 2 s); a cached check: {median:.2f} s (target < 10 s); speedup "
        f"{first.speedup:.2f}x over eager, cached run ratio first/cached {cold / median:.1f}"
    )
    sys.exit(0 if share < 2.0 and median < 10.0 else 1)


if __name__ == "__main__":
    main()
