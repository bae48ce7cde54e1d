"""How long the CLI takes to answer ``--version`` and ``--help``, against ``python -c
pass`` (the interpreter's own start) in the same run: the best of ``--runs`` each.

    .venv/bin/python bench/cli_start.py [--runs 7]

Target (issue 48): at most 0.3 s here; a command's modules are imported only when it runs
(kernelflow/cli/main.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "kernelflow --version": [sys.executable, "-m", "kernelflow", "--version"],
    "kernelflow --help": [sys.executable, "-m", "kernelflow", "--help"],
    "kernelflow schema --help": [sys.executable, "-m", "kernelflow", "schema", "--help"],
}


def best_of(command: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    results = {name: best_of(command, args.runs) for name, command in CASES.items()}
    base = results["python -c pass"]
    for name, seconds in results.items():
        print(f"{name:28} {seconds:6.3f} s  ({seconds / base:4.1f}x python -c pass)")
    slowest = max(results["kernelflow --version"], results["kernelflow --help"])
    print(f"--version and --help: at most {slowest:.3f} s (target 0.3 s)")
    return 0 if slowest <= 0.3 else 1


if __name__ == "__main__":
    sys.exit(main())
