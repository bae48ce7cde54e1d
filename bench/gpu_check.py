"""The GPU acceptance run: real KernelBench problems, one candidate per backend (Triton,
KernelBench's load_inline CUDA, CuPy), checked and timed by the real verifier on this
machine's CUDA GPU against eager PyTorch and torch.compile; then the benchmark card.

    python bench/gpu_check.py [--problems DIR] [--json]      (make gpu-check)

``--problems``: a KernelBench ``KernelBench/`` folder (``level1/19_ReLU.py`` ...); by
default the fetched corpus's (``bench/corpus/fetch.py`` puts them in
``.corpus/problems``), else this repository's own problems of the same operators. The
candidates are this repository's (examples/candidates/, examples/kernelbench/solutions/).
Exit 0 when every check passed; 1 otherwise (on a machine without a CUDA GPU every check
answers ``unsupported``, saying so, and the card says what ran).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelflow.projections.benchmark import benchmark_card, card_lines
from kernelflow.projections.search import Candidate, SearchDatabase
from kernelflow.verification.engine import VerifierConfig, verify

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CORPUS_PROBLEMS = REPO / ".corpus" / "problems"


@dataclass(frozen=True)
class Problem:
    kernelbench: str  # its file in KernelBench's KernelBench/ folder
    own: Path  # this repository's problem of the same operator, when KernelBench's is absent
    candidates: dict[str, Path]  # by backend


PROBLEMS = (
    Problem(
        "level1/19_ReLU.py",
        EXAMPLES / "tasks/relu.py",
        {
            "triton": EXAMPLES / "candidates/solutions/relu.py",
            "cuda": EXAMPLES / "candidates/cuda/relu.py",
            "cupy": EXAMPLES / "candidates/cupy/relu.py",
        },
    ),
    Problem(
        "level1/88_MinGPTNewGelu.py",
        EXAMPLES / "kernelbench/level1/12_tanh_gelu.py",
        {
            "triton": EXAMPLES / "kernelbench/solutions/12_tanh_gelu.py",
            "cuda": EXAMPLES / "candidates/cuda/tanh_gelu.py",
        },
    ),
)


def problem_file(problem: Problem, folder: Path | None) -> Path:
    """KernelBench's file of ``problem`` in ``folder``, else this repository's own."""
    if folder is not None and (folder / problem.kernelbench).is_file():
        return folder / problem.kernelbench
    return problem.own


def _shown(path: Path, folder: Path | None) -> str:
    if folder is not None and path.is_relative_to(folder):
        return f"KernelBench {path.relative_to(folder)}"
    return str(path.relative_to(REPO))


def run(folder: Path | None, config: VerifierConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every candidate checked; one row each, and the card of them all."""
    rows: list[dict[str, Any]] = []
    databases: dict[str, SearchDatabase] = {}
    timed: list[tuple[str, str]] = []
    for problem in PROBLEMS:
        path = problem_file(problem, folder)
        db = databases.setdefault(path.name, SearchDatabase(path.name))
        for index, (backend, candidate) in enumerate(problem.candidates.items()):
            source = candidate.read_text()
            report = verify(path.read_text(), source, backend=backend, config=config)
            task_id = f"{path.stem}-{backend}"
            db.candidates[task_id] = Candidate(
                task_id=task_id,
                index=index,
                generation=0,
                status="done",
                code=source,
                verdict=report.verdict,
                speedup=report.speedup,
                report=report,
            )
            timed.append((f"{path.name} ({backend})", task_id))
            speedups = dict(report.timing.speedups) if report.timing is not None else {}
            rows.append(
                {
                    "problem": _shown(path, folder),
                    "backend": backend,
                    "candidate": str(candidate.relative_to(REPO)),
                    "verdict": report.verdict,
                    "summary": report.summary,
                    "speedups": speedups,
                    "speedup_ci95": list(report.timing.speedup_ci95) if report.timing else [],
                    "duration_s": round(report.duration_s, 1),
                }
            )
    return rows, benchmark_card(databases, timed=timed)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--problems", type=Path, help="KernelBench's KernelBench/ folder")
    p.add_argument(
        "--device",
        choices=["cuda", "cpu"],
        default="cuda",
        help="cpu: what runs without a GPU (Triton interpreted and untimed; the GPU "
        "backends answer unsupported), to check the script and its pairs anywhere",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    folder = args.problems or (CORPUS_PROBLEMS if CORPUS_PROBLEMS.is_dir() else None)
    if folder is not None and not folder.is_dir():
        sys.exit(f"gpu_check: --problems {folder}: not a folder")
    with tempfile.TemporaryDirectory(prefix="kf-gpu-check-") as cache:
        config = VerifierConfig(device=args.device, compare_compile=True, extension_cache=cache)
        rows, card = run(folder, config)
    if args.json:
        print(json.dumps({"checks": rows, "card": card}, indent=2))
    else:
        for row in rows:
            speed = ", ".join(f"{k} {v:.2f}x" for k, v in row["speedups"].items()) or "untimed"
            print(
                f"{row['problem']} [{row['backend']}]: {row['verdict']} in "
                f"{row['duration_s']}s; {speed}: {row['summary']}"
            )
        print("card:")
        print("\n".join(card_lines(card)))
    sys.exit(0 if all(row["verdict"] == "pass" for row in rows) else 1)


if __name__ == "__main__":
    main()
