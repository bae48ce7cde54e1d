"""The verifier judged by kernels written elsewhere: how many KernelBench solutions that their
own sources record as correct it refuses, by source, rule and strictness policy.

The corpus is ``bench/corpus/manifest.json``, fetched into a folder by
``bench/corpus/fetch.py`` (nothing of it is committed). For each entry the static gate
(``gate_findings``) judges the kernel against its KernelBench problem under every policy;
``--baseline REF`` also judges it with the gate of the git revision REF (the "before" of a
change, in the same run); ``--run N`` runs the full verifier, in its sandbox on this
machine, on N entries drawn with ``--seed`` from those the ``kernelbench`` policy's gate
passes. Entries the manifest marks ``suspect`` (cheats, or kernels that cannot compile,
whatever their source recorded) are counted apart and listed with the reason: a refusal of
one of them is right.

    .venv/bin/python bench/verifier_precision.py --corpus .corpus [--baseline REF] [--run N]

Target (docs/verifier.md): under ``kernelbench`` no entry but the suspect ones is refused;
under ``strict`` only for PyTorch compute and precision downgrades.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelflow.verification.engine import VerifierConfig, verify  # noqa: E402
from kernelflow.verification.gate import gate_findings  # noqa: E402
from kernelflow.verification.policy import CHOICE_RULES, policy_names  # noqa: E402

MANIFEST = ROOT / "bench" / "corpus" / "manifest.json"
# Judges kernels with an older revision's gate, in a process that imports that revision
# (its check_candidate has no policy: the strictest it had).
BASELINE_JUDGE = """
import json, sys
from kernelflow.verification.gate import check_candidate
out = {}
for item in json.load(sys.stdin):
    try:
        found = check_candidate(item["kernel"], task_source=item["task"])
        out[item["id"]] = sorted({v.rule for v in found})
    except Exception as exc:
        out[item["id"]] = ["error: " + type(exc).__name__]
json.dump(out, sys.stdout)
"""


@dataclass
class Entry:
    id: str
    source: str
    kernel: str
    task: str
    suspect: str | None
    refused: dict[str, list[str]] = field(default_factory=dict)  # policy -> "rule: message"
    warned: dict[str, list[str]] = field(default_factory=dict)

    def rules(self, policy: str) -> set[str]:
        return {r.split(":", 1)[0] for r in self.refused.get(policy, [])}


def load(corpus: Path, manifest: Path) -> list[Entry]:
    index = json.loads((corpus / "index.json").read_text())
    described = {e["id"]: e for e in json.loads(manifest.read_text())["entries"]}
    entries = []
    for item in index:
        meta = described.get(item["id"], {})
        entries.append(
            Entry(
                id=item["id"],
                source=item["source"],
                kernel=(corpus / item["kernel"]).read_text(),
                task=(corpus / item["problem_source"]).read_text(),
                suspect=meta.get("suspect"),
            )
        )
    return entries


def judge_statically(entries: list[Entry], policies: list[str]) -> None:
    for entry in entries:
        for name in policies:
            try:
                refused, warned = gate_findings(entry.kernel, task_source=entry.task, policy=name)
            except SyntaxError as exc:
                entry.refused[name] = [f"syntax: {exc}"]
                continue
            entry.refused[name] = [v.text() for v in refused]
            entry.warned[name] = [v.text() for v in warned]


def judge_with_baseline(entries: list[Entry], ref: str) -> str:
    """Judge every entry with REF's gate; the label of that column."""
    label = f"baseline {ref}"
    with tempfile.TemporaryDirectory(prefix="kf-baseline-") as tmp:
        tree = Path(tmp, "tree")
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        layout = Path(tmp, "layout")
        package_dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ]
        for package, folder in sorted(package_dirs.items()):
            target = layout.joinpath(*package.split("."))
            if package == "kernelflow":
                target.mkdir(parents=True)
                for item in (tree / folder).iterdir():
                    target.joinpath(item.name).symlink_to(item)
            else:
                target.symlink_to(tree / folder)
        items = [{"id": e.id, "kernel": e.kernel, "task": e.task} for e in entries]
        found = subprocess.run(
            [sys.executable, "-c", BASELINE_JUDGE],
            input=json.dumps(items),
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(layout), "PATH": "/usr/bin:/bin"},
            cwd=tmp,  # not this checkout: `-c` puts the working directory first on the path
        ).stdout
    for entry in entries:
        entry.refused[label] = list(json.loads(found)[entry.id])
    return label


def share(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.0f} %)" if total else "0"


def report(entries: list[Entry], columns: list[str]) -> None:
    legit = [e for e in entries if not e.suspect]
    sources = Counter(e.source for e in entries)
    print(
        f"verifier precision over {len(entries)} third-party KernelBench Triton kernels "
        f"({len(legit)} correct by their sources' records, {len(entries) - len(legit)} "
        "suspect: cheats or not compilable)"
    )
    print("  sources: " + ", ".join(f"{s} {n}" for s, n in sorted(sources.items())))
    print("\nstatic gate: kernels refused")
    width = max(len(c) for c in columns) + 2
    print(f"  {'':{width}}{'correct ones refused':>24}{'suspect ones refused':>24}")
    for column in columns:
        bad = sum(1 for e in legit if e.refused.get(column))
        caught = sum(1 for e in entries if e.suspect and e.refused.get(column))
        print(
            f"  {column:{width}}{share(bad, len(legit)):>24}"
            f"{share(caught, len(entries) - len(legit)):>24}"
        )
    print("\ncorrect kernels refused, by rule (a kernel counts once per rule)")
    rules = sorted({r for e in legit for c in columns for r in e.rules(c)})
    print(f"  {'rule':24}" + "".join(f"{c:>{width}}" for c in columns))
    for rule in rules:
        counts = [sum(1 for e in legit if rule in e.rules(c)) for c in columns]
        print(f"  {rule:24}" + "".join(f"{n:>{width}}" for n in counts))
    print("\ncorrect kernels refused, by source")
    print(f"  {'source':24}" + "".join(f"{c:>{width}}" for c in columns))
    for source in sorted(sources):
        mine = [e for e in legit if e.source == source]
        counts = [sum(1 for e in mine if e.refused.get(c)) for c in columns]
        print(f"  {source + f' ({len(mine)})':24}" + "".join(f"{n:>{width}}" for n in counts))
    if "kernelbench" in columns:
        listing("refused under kernelbench (each, with its first reason)", entries, "kernelbench")
    if "strict" in columns:
        beyond = [e for e in legit if e.rules("strict") - CHOICE_RULES]
        print(
            f"\nunder strict, correct kernels refused for more than PyTorch compute or "
            f"precision: {len(beyond)}"
        )
        for entry in beyond:
            first = next(r for r in entry.refused["strict"] if r.split(":")[0] not in CHOICE_RULES)
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
        print(f"  {entry.id} [{why}]\n      {entry.refused[column][0][:170]}")


def run_full(entries: list[Entry], count: int, seed: int, timeout_s: float) -> None:
    """The full verifier (sandbox, interpreted Triton on the CPU) on ``count`` entries the
    kernelbench gate passes."""
    passable = [e for e in entries if not e.suspect and not e.refused.get("kernelbench")]
    chosen = random.Random(seed).sample(passable, min(count, len(passable)))
    print(f"\nfull verifier, policy kernelbench, on {len(chosen)} of them (seed {seed}):")
    verdicts: Counter[str] = Counter()
    config = VerifierConfig(timeout_s=timeout_s, trials=1)
    started = time.perf_counter()
    for entry in chosen:
        report = verify(entry.task, entry.kernel, policy="kernelbench", config=config)
        verdicts[report.verdict] += 1
        print(f"  {entry.id}: {report.verdict} in {report.duration_s:.1f}s: {report.summary[:130]}")
    took = time.perf_counter() - started
    print("  verdicts: " + ", ".join(f"{v} {n}" for v, n in verdicts.most_common()))
    print(f"  ({took:.0f} s; the interpreter runs no bf16, no block pointers since Triton 3.5)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="fetch.py's output folder")
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--baseline", metavar="REF", help="also judge with REF's gate")
    parser.add_argument("--run", type=int, default=0, metavar="N", help="full verifier on N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per --run check")
    parser.add_argument("--json", type=Path, help="also write every entry's findings here")
    args = parser.parse_args(argv)
    if not (args.corpus / "index.json").exists():
        print(f"{args.corpus}: no index.json (run bench/corpus/fetch.py)", file=sys.stderr)
        return 2
    entries = load(args.corpus, args.manifest)
    columns: list[str] = []
    if args.baseline:
        columns.append(judge_with_baseline(entries, args.baseline))
    policies = policy_names()
    judge_statically(entries, policies)
    columns += sorted(policies, key=lambda p: p != "strict")
    report(entries, columns)
    if args.run:
        run_full(entries, args.run, args.seed, args.timeout)
    if args.json:
        rows: list[dict[str, Any]] = [
            {"id": e.id, "suspect": e.suspect, "refused": e.refused, "warned": e.warned}
            for e in entries
        ]
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
