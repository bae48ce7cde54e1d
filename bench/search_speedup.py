"""Search for speed, measured: the best speedup a search has found, generation by generation.

    python bench/search_speedup.py [--strategy evolve] [--generations 3] [--threads N]

``kernelflow bench --backend cpp`` over examples/kernelbench/level1/12_tanh_gelu.py, as a
user runs it (the CLI, the embedded NATS of a fresh data dir), with a scripted model whose
candidates (by their number) are the C++ kernels of examples/candidates/cpp/: a slow one,
a scalar one and a fused, vectorised one, in turn. Every kernel is built, checked and
timed on this machine's CPU by the real verifier. The search's database is then folded
from the exported log, and the best speedup over eager PyTorch found by each generation
printed (the baseline is eager PyTorch timed in the same verification, interleaved).

A search ranks by measured speed: the last generation's best must be the fused kernel
whatever order the model offered them in (the script exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from kernelflow.offline.files import file_events
from kernelflow.projections.search import SearchDatabase

REPO = Path(__file__).resolve().parent.parent
TASK = REPO / "examples/kernelbench/level1/12_tanh_gelu.py"
VARIANTS = ("tanh_gelu_slow", "tanh_gelu_scalar", "tanh_gelu_fused")  # the model's offers
FASTEST = "tanh_gelu_fused"


@dataclass(frozen=True)
class Generation:
    generation: int
    candidates: int
    best_speedup: float | None  # the best passing kernel's so far, over eager PyTorch
    best_kernel: str | None  # its extension's name
    # False: that speedup was inconclusive (the kernel ranks as parity).
    best_conclusive: bool | None = None


def scripted_model(workdir: Path, order: tuple[str, ...] = VARIANTS) -> Path:
    """A model whose coder answers candidate k with variant ``order[k % len(order)]``."""
    answers = [
        {"text": "```python\n" + (REPO / f"examples/candidates/cpp/{name}.py").read_text() + "```"}
        for name in order
    ]
    path = workdir / "model.yaml"
    path.write_text(yaml.safe_dump({"coder": [{"choices": answers}]}))
    return path


def kernel_name(code: str | None) -> str | None:
    found = re.search(r'load_inline\(\s*name="(\w+)"', code or "")
    return found.group(1) if found else None


def run_search(
    workdir: Path,
    *,
    strategy: str,
    generations: int,
    threads: int | None,
    order: tuple[str, ...] = VARIANTS,
    extension_cache: Path | None = None,
) -> tuple[dict[str, object], list[Generation]]:
    """Run the search with the CLI (the model offering ``order``'s variants in turn); its
    ``--json`` summary and the best per generation. ``extension_cache``: where the
    verifier keeps what it builds (default: the fresh data dir's, so every kernel is
    built)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
    env["KF_DATA_DIR"] = str(workdir / "data")
    if extension_cache is not None:
        env["KF_EXTENSION_CACHE"] = str(extension_cache)
    if threads:
        env["KF_VERIFY_THREADS"] = str(threads)
    kernelflow = [sys.executable, "-m", "kernelflow"]
    command = [
        *kernelflow,
        "bench",
        str(TASK),
        "--backend",
        "cpp",
        "--strategy",
        strategy,
        "--islands",
        "1",
        "--samples",
        "1",
        "--generations",
        str(generations),
        "--workflow",
        "coder_only",
        "--no-compile-baseline",  # the search ranks by the speedup over eager
        "--llm",
        f"scripted:{scripted_model(workdir, order)}",
        "--json",
    ]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"kernelflow bench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    summary = json.loads(done.stdout)
    log = workdir / "log.jsonl"
    exported = subprocess.run(
        [*kernelflow, "log", "export", "--out", str(log)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if exported.returncode != 0:
        raise SystemExit(f"kernelflow log export failed:\n{exported.stderr[-3000:]}")
    (problem,) = summary["problems"]  # type: ignore[misc]
    db = SearchDatabase(str(problem["search_id"]))
    for position, event in file_events(log):
        db.apply(position, event)
    return summary, best_by_generation(db)


def best_by_generation(db: SearchDatabase) -> list[Generation]:
    """The best passing kernel among those of generations up to each one."""
    rows = []
    for g in sorted({c.generation for c in db.candidates.values()}):
        so_far = [c for c in db.candidates.values() if c.generation <= g and c.score is not None]
        passed = sorted((c for c in so_far if c.passed), key=lambda c: c.sort_key())
        best = passed[0] if passed else None
        rows.append(
            Generation(
                generation=g,
                candidates=sum(1 for c in db.candidates.values() if c.generation == g),
                best_speedup=best.speedup if best is not None else None,
                best_kernel=kernel_name(best.code) if best is not None else None,
                best_conclusive=best.speedup_conclusive if best is not None else None,
            )
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="evolve", choices=["evolve", "tree"])
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--threads", type=int, help="CPU threads of the timing (default: every core)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-search-speed-") as tmp:
        summary, rows = run_search(
            Path(tmp), strategy=args.strategy, generations=args.generations, threads=args.threads
        )
    for row in rows:
        speed = f"{row.best_speedup:.2f}x" if row.best_speedup is not None else "-"
        if row.best_conclusive is False:
            speed = f"inconclusive ({speed}, ranked as parity)"
        print(
            f"generation {row.generation}: {row.candidates} candidate(s); best so far "
            f"{speed} over eager ({row.best_kernel or 'none passed'})"
        )
    print(
        f"fast_p: {summary['fast_p']}; geomean speedup {summary['geomean_speedup']}; "
        f"card: {summary['card']['timing']}"  # type: ignore[index]
    )
    sys.exit(0 if rows and rows[-1].best_kernel == FASTEST else 1)


if __name__ == "__main__":
    main()
