"""The verifier judged by kernels written elsewhere: how many KernelBench solutions that their
own sources record as correct it refuses, by backend, source, rule and strictness policy,
and how its static gate agrees with KernelBench's own static checker.

The corpus is ``bench/corpus/manifest.json``, fetched into a folder by
``bench/corpus/fetch.py`` (nothing of it is committed): Triton solutions and CUDA ones in
KernelBench's format (``load_inline``), each judged as its backend. For each entry the
static gate (``gate_findings``) judges the kernel against its KernelBench problem under
every policy; ``--baseline REF`` also judges it with the gate of the git revision REF (the
"before" of a change, in the same run); the "KernelBench checker" column is
``validate_kernel_static`` from KernelBench's ``kernel_static_checker.py`` (fetched with the
corpus, run in this process with its default checks and the task's precision), and an
agreement table per backend crosses its verdict with the gate's. ``--run N`` runs the full
verifier, in its sandbox on this machine, on N entries per backend drawn with ``--seed``
from those the ``kernelbench`` policy's gate passes (CUDA entries only where there is a
GPU). Entries the manifest marks ``suspect`` (cheats, or kernels that cannot compile,
whatever their source recorded) are counted apart and listed with the reason: a refusal of
one of them is right.

    .venv/bin/python bench/verifier_precision.py --corpus .corpus [--backend triton|cuda|all]
        [--baseline REF] [--run N]

Target (docs/verifier.md): under ``kernelbench`` no entry but the suspect ones is refused
(at most 5 % of the correct kernels KernelBench's checker accepts); under ``strict`` only
for PyTorch compute and precision downgrades.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.precision_kernelbench import (  # noqa: E402
    KB_COLUMN,
    agreement,
    judge_with_kernelbench,
    load_checker,
)
from bench.revision import run_at_revision  # noqa: E402
from kernelflow.verification.engine import VerifierConfig, verify  # noqa: E402
from kernelflow.verification.gate import gate_findings  # noqa: E402
from kernelflow.verification.policy import CHOICE_RULES, policy_names  # noqa: E402

MANIFEST = ROOT / "bench" / "corpus" / "manifest.json"
BACKENDS = ("triton", "cuda")
TITLES = {"triton": "Triton", "cuda": "CUDA (load_inline)"}
# Judges kernels with an older revision's gate, in a process that imports that revision
# (its check_candidate has no policy: the strictest it had; one without a backend
# parameter, or without the entry's backend, judges nothing of that backend: null).
BASELINE_JUDGE = """
import inspect, json, sys
from kernelflow.verification.gate import check_candidate
takes_backend = "backend" in inspect.signature(check_candidate).parameters
out = {}
for item in json.load(sys.stdin):
    if not takes_backend and item["backend"] != "triton":
        out[item["id"]] = None
        continue
    extra = {"backend": item["backend"]} if takes_backend else {}
    try:
        found = check_candidate(item["kernel"], task_source=item["task"], **extra)
        out[item["id"]] = sorted({v.rule for v in found})
    except Exception as exc:
        unknown = type(exc).__name__ == "UnknownBackend"
        out[item["id"]] = None if unknown else ["error: " + type(exc).__name__]
json.dump(out, sys.stdout)
"""


@dataclass
class Entry:
    id: str
    source: str
    backend: str
    kernel: str
    task: str
    suspect: str | None
    # column -> "rule: message" (None: the column did not judge this entry)
    refused: dict[str, list[str] | None] = field(default_factory=dict)
    warned: dict[str, list[str]] = field(default_factory=dict)

    def rules(self, column: str) -> set[str]:
        return {r.split(":", 1)[0] for r in self.refused.get(column) or []}


def load(corpus: Path, manifest: Path, backends: Iterable[str]) -> list[Entry]:
    index = json.loads((corpus / "index.json").read_text())
    described = {e["id"]: e for e in json.loads(manifest.read_text())["entries"]}
    wanted = set(backends)
    entries = []
    for item in index:
        meta = described.get(item["id"], {})
        backend = item.get("backend", meta.get("backend", "triton"))
        if backend not in wanted:
            continue
        entries.append(
            Entry(
                id=item["id"],
                source=item["source"],
                backend=backend,
                kernel=(corpus / item["kernel"]).read_text(),
                task=(corpus / item["problem_source"]).read_text(),
                suspect=meta.get("suspect"),
            )
        )
    return entries


def prompt_examples(corpus: Path) -> list[Entry]:
    """KernelBench's own CUDA prompt examples (fetched with the corpus): the one-shot
    example every prompt shows a model and the few-shot ones, each with its problem."""
    prompts = corpus / "kernelbench" / "prompts"
    found = []
    for new in sorted(prompts.rglob("model_new_ex_*.py")):
        task = new.with_name(new.name.replace("model_new_ex_", "model_ex_"))
        if task.exists():
            found.append(
                Entry(
                    id=str(new.relative_to(prompts)),
                    source="kernelbench-prompts",
                    backend="cuda",
                    kernel=new.read_text(),
                    task=task.read_text(),
                    suspect=None,
                )
            )
    return found


def examples_report(examples: list[Entry], columns: list[str]) -> None:
    """Each prompt example's verdict in each column."""
    print("\nKernelBench's prompt examples (src/kernelbench/prompts), the gate's verdict")
    width = max(len(c) for c in columns) + 2
    print(f"  {'example':40}" + "".join(f"{c:>{width}}" for c in columns))
    for entry in examples:
        verdicts = []
        for column in columns:
            refused = entry.refused.get(column)
            verdicts.append("-" if refused is None else "refused" if refused else "passes")
        print(f"  {entry.id:40}" + "".join(f"{v:>{width}}" for v in verdicts))
        for column in columns:
            for reason in (entry.refused.get(column) or [])[:1]:
                print(f"      {column}: {reason[:150]}")


def judge_statically(entries: list[Entry], policies: list[str]) -> None:
    for entry in entries:
        for name in policies:
            try:
                refused, warned = gate_findings(
                    entry.kernel, backend=entry.backend, task_source=entry.task, policy=name
                )
            except SyntaxError as exc:
                entry.refused[name] = [f"syntax: {exc}"]
                continue
            entry.refused[name] = [v.text() for v in refused]
            entry.warned[name] = [v.text() for v in warned]


def judge_with_baseline(entries: list[Entry], ref: str) -> str:
    """Judge every entry with REF's gate; the label of that column."""
    label = f"baseline {ref}"
    items = [
        {"id": e.id, "backend": e.backend, "kernel": e.kernel, "task": e.task} for e in entries
    ]
    judged = json.loads(run_at_revision(ref, BASELINE_JUDGE, json.dumps(items)))
    for entry in entries:
        rules = judged[entry.id]
        entry.refused[label] = None if rules is None else list(rules)
    return label


def share(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.0f} %)" if total else "0"


def judged(entries: Iterable[Entry], column: str) -> list[Entry]:
    return [e for e in entries if e.refused.get(column, []) is not None]


def report(entries: list[Entry], columns: list[str], backend: str) -> None:
    """One backend's report; ``columns`` are the gate's (baseline first), and the
    KernelBench checker's column is added where it judged."""
    legit = [e for e in entries if not e.suspect]
    sources = Counter(e.source for e in entries)
    shown = columns + ([KB_COLUMN] if any(KB_COLUMN in e.refused for e in entries) else [])
    print(
        f"verifier precision over {len(entries)} third-party KernelBench {TITLES[backend]} "
        f"kernels ({len(legit)} correct by their sources' records, {len(entries) - len(legit)} "
        "suspect: cheats or not compilable)"
    )
    print("  sources: " + ", ".join(f"{s} {n}" for s, n in sorted(sources.items())))
    print("\nstatic checks: kernels refused")
    width = max(len(c) for c in shown) + 2
    print(f"  {'':{width}}{'correct ones refused':>24}{'suspect ones refused':>24}")
    for column in shown:
        mine = judged(entries, column)
        good = [e for e in mine if not e.suspect]
        bad = sum(1 for e in good if e.refused.get(column))
        caught = sum(1 for e in mine if e.suspect and e.refused.get(column))
        note = "" if len(mine) == len(entries) else f"   (judged {len(mine)} of {len(entries)})"
        print(
            f"  {column:{width}}{share(bad, len(good)):>24}"
            f"{share(caught, len(mine) - len(good)):>24}{note}"
        )
    print("\ncorrect kernels refused by the gate, by rule (a kernel counts once per rule)")
    rules = sorted({r for e in legit for c in columns for r in e.rules(c)})
    print(f"  {'rule':24}" + "".join(f"{c:>{width}}" for c in columns))
    for rule in rules:
        counts = [sum(1 for e in legit if rule in e.rules(c)) for c in columns]
        print(f"  {rule:24}" + "".join(f"{n:>{width}}" for n in counts))
    print("\ncorrect kernels refused, by source")
    print(f"  {'source':24}" + "".join(f"{c:>{width}}" for c in shown))
    for source in sorted(sources):
        mine = [e for e in legit if e.source == source]
        counts = [sum(1 for e in mine if e.refused.get(c)) for c in shown]
        print(f"  {source + f' ({len(mine)})':24}" + "".join(f"{n:>{width}}" for n in counts))
    if KB_COLUMN in shown:
        agreement(entries, columns, "kernelbench" if "kernelbench" in columns else None)
    elif "kernelbench" in columns:
        listing("refused under kernelbench (each, with its first reason)", entries, "kernelbench")
    if "strict" in columns:
        beyond = [e for e in legit if e.rules("strict") - CHOICE_RULES]
        print(
            f"\nunder strict, correct kernels refused for more than PyTorch compute or "
            f"precision: {len(beyond)}"
        )
        for entry in beyond:
            first = next(
                r for r in entry.refused["strict"] or [] if r.split(":")[0] not in CHOICE_RULES
            )
            print(f"  {entry.id}: {first[:160]}")
        warned = sum(
            1 for e in legit if e.warned.get("kernelbench") and not e.refused.get("kernelbench")
        )
        print(f"passed under kernelbench with warnings: {warned}")


def listing(title: str, entries: Iterable[Entry], column: str) -> None:
    refused = [e for e in entries if e.refused.get(column)]
    print(f"\n{title}: {len(refused)}")
    for entry in refused:
        why = f"suspect: {entry.suspect}" if entry.suspect else "FALSE REFUSAL"
        print(f"  {entry.id} [{why}]\n      {(entry.refused[column] or [''])[0][:170]}")


def gpu_here() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def run_full(entries: list[Entry], backend: str, count: int, seed: int, timeout_s: float) -> None:
    """The full verifier on ``count`` entries of ``backend`` the kernelbench gate passes
    (Triton in the CPU interpreter where there is no GPU; CUDA only on a GPU)."""
    passable = [e for e in entries if not e.suspect and not e.refused.get("kernelbench")]
    if backend == "cuda" and not gpu_here():
        print(
            f"\nfull verifier (--run {count}): skipped for the {len(passable)} CUDA kernels "
            "the gate passes: this machine has no GPU (CUDA candidates build and run on one)"
        )
        return
    chosen = random.Random(seed).sample(passable, min(count, len(passable)))
    print(f"\nfull verifier, policy kernelbench, on {len(chosen)} of them (seed {seed}):")
    verdicts: Counter[str] = Counter()
    config = VerifierConfig(timeout_s=timeout_s, trials=1)
    started = time.perf_counter()
    for entry in chosen:
        found = verify(
            entry.task, entry.kernel, backend=backend, policy="kernelbench", config=config
        )
        verdicts[found.verdict] += 1
        print(f"  {entry.id}: {found.verdict} in {found.duration_s:.1f}s: {found.summary[:130]}")
    took = time.perf_counter() - started
    print("  verdicts: " + ", ".join(f"{v} {n}" for v, n in verdicts.most_common()))
    if backend == "triton":
        print(f"  ({took:.0f} s; the interpreter runs no bf16, no block pointers since Triton 3.5)")
    else:
        print(f"  ({took:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="fetch.py's output folder")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument(
        "--backend", choices=[*BACKENDS, "all"], default="all", help="which entries to judge"
    )
    parser.add_argument("--baseline", metavar="REF", help="also judge with REF's gate")
    parser.add_argument(
        "--run", type=int, default=0, metavar="N", help="full verifier on N per backend"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per --run check")
    parser.add_argument("--json", type=Path, help="also write every entry's findings here")
    args = parser.parse_args(argv)
    if not (args.corpus / "index.json").exists():
        print(f"{args.corpus}: no index.json (run bench/corpus/fetch.py)", file=sys.stderr)
        return 2
    backends = BACKENDS if args.backend == "all" else (args.backend,)
    entries = load(args.corpus, args.manifest, backends)
    if not entries:
        print(f"{args.corpus}: no {args.backend} entries in index.json", file=sys.stderr)
        return 2
    examples = prompt_examples(args.corpus) if "cuda" in backends else []
    columns: list[str] = []
    if args.baseline:
        columns.append(judge_with_baseline(entries + examples, args.baseline))
    policies = policy_names()
    judge_statically(entries + examples, policies)
    columns += sorted(policies, key=lambda p: p != "strict")
    checker = load_checker(args.corpus)
    if checker is None:
        print(
            f"(no {args.corpus}/kernelbench/kernel_static_checker.py: run bench/corpus/fetch.py "
            "again for the KernelBench checker's column)"
        )
    else:
        judge_with_kernelbench(entries, checker)
    for number, backend in enumerate(b for b in backends if any(e.backend == b for e in entries)):
        mine = [e for e in entries if e.backend == backend]
        if number:
            print("\n" + "=" * 96 + "\n")
        report(mine, columns, backend)
        if backend == "cuda" and examples:
            examples_report(examples, columns)
        if args.run:
            run_full(mine, backend, args.run, args.seed, args.timeout)
    if args.json:
        rows: list[dict[str, Any]] = [
            {
                "id": e.id,
                "backend": e.backend,
                "suspect": e.suspect,
                "refused": e.refused,
                "warned": e.warned,
            }
            for e in entries
        ]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
