"""The GPU acceptance run: real KernelBench problems, one candidate per backend (Triton,
KernelBench's load_inline CUDA, CuPy), checked and timed by the real verifier on this
machine's CUDA GPU against eager PyTorch and torch.compile; then the benchmark card.

    python bench/gpu_check.py [--problems DIR] [--json]      (make gpu-check)

``--problems``: a KernelBench ``KernelBench/`` folder (``level1/19_ReLU.py`` ...); by
default the fetched corpus's (``bench/corpus/fetch.py`` puts them in
``.corpus/problems``), else this repository's own problems of the same operators. The
candidates are this repository's (examples/candidates/, examples/kernelbench/solutions/).
Where the corpus is fetched (``--corpus``, ``.corpus`` by default), the world's code is
checked too: KernelBench's one-shot prompt example (``model_new_ex_add.py``, the kernel
every KernelBench prompt shows a model) and five CUDA kernels of the corpus (correct by
their sources' records, the gate passes them; one per source in turn, by id), under the
``kernelbench`` policy.
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
from kernelflow.verification.gate import gate_findings

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
CORPUS = REPO / ".corpus"
CORPUS_PROBLEMS = CORPUS / "problems"
MANIFEST = REPO / "bench" / "corpus" / "manifest.json"
CORPUS_KERNELS = 5


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


def corpus_pairs(corpus: Path, count: int = CORPUS_KERNELS) -> list[tuple[str, Path, Path]]:
    """(label, problem, kernel) of KernelBench's one-shot example and ``count`` CUDA kernels
    of the fetched corpus: correct by their sources' records, passed by the gate, one per
    source in turn, by id (empty where nothing is fetched)."""
    pairs: list[tuple[str, Path, Path]] = []
    prompts = corpus / "kernelbench" / "prompts"
    if (prompts / "model_new_ex_add.py").is_file():
        pairs.append(
            (
                "KernelBench prompts/model_new_ex_add.py",
                prompts / "model_ex_add.py",
                prompts / "model_new_ex_add.py",
            )
        )
    index = corpus / "index.json"
    if not index.is_file():
        return pairs
    suspect = {e["id"] for e in json.loads(MANIFEST.read_text())["entries"] if e.get("suspect")}
    by_source: dict[str, list[dict[str, Any]]] = {}
    for item in sorted(json.loads(index.read_text()), key=lambda i: i["id"]):
        if item.get("backend") == "cuda" and item["id"] not in suspect:
            by_source.setdefault(item["source"], []).append(item)
    chosen: list[dict[str, Any]] = []
    while len(chosen) < count and any(by_source.values()):
        for items in by_source.values():
            while items and len(chosen) < count:
                item = items.pop(0)
                kernel, problem = corpus / item["kernel"], corpus / item["problem_source"]
                refused, _ = gate_findings(
                    kernel.read_text(),
                    backend="cuda",
                    task_source=problem.read_text(),
                    policy="kernelbench",
                )
                if not refused:
                    chosen.append(item)
                    break
    return pairs + [
        (f"corpus {i['id']}", corpus / i["problem_source"], corpus / i["kernel"]) for i in chosen
    ]


def run_corpus(corpus: Path, config: VerifierConfig) -> list[dict[str, Any]]:
    """KernelBench's prompt example and the corpus kernels, verified as ``cuda``."""
    rows = []
    for label, problem, kernel in corpus_pairs(corpus):
        report = verify(
            problem.read_text(),
            kernel.read_text(),
            backend="cuda",
            policy="kernelbench",
            config=config,
        )
        rows.append(
            {
                "problem": label,
                "backend": "cuda",
                "candidate": str(kernel),
                "verdict": report.verdict,
                "summary": report.summary,
                "speedups": dict(report.timing.speedups) if report.timing is not None else {},
                "speedup_ci95": list(report.timing.speedup_ci95) if report.timing else [],
                "duration_s": round(report.duration_s, 1),
            }
        )
    return rows


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
    p.add_argument(
        "--corpus",
        type=Path,
        default=CORPUS,
        help="the fetched precision corpus (bench/corpus/fetch.py), for KernelBench's prompt "
        "example and five of its CUDA kernels (skipped where absent)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args()
    folder = args.problems or (CORPUS_PROBLEMS if CORPUS_PROBLEMS.is_dir() else None)
    if folder is not None and not folder.is_dir():
        sys.exit(f"gpu_check: --problems {folder}: not a folder")
    with tempfile.TemporaryDirectory(prefix="kf-gpu-check-") as cache:
        config = VerifierConfig(device=args.device, compare_compile=True, extension_cache=cache)
        rows, card = run(folder, config)
        rows += run_corpus(args.corpus, config)
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
