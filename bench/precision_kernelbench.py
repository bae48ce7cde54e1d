"""KernelBench's own static checker beside the gate, for bench/verifier_precision.py.

``kernel_static_checker.py`` comes with the corpus (bench/corpus/fetch.py writes it to
``<corpus>/kernelbench/``; it is KernelBench's code, never committed here) and is imported
from there by path. Its ``validate_kernel_static(code, backend, precision)`` runs its
default checks: the strict ones (try/except or ``pass``, timing patches, threads, lazy
tensor subclasses, and the backend's own "is it a kernel" check) refuse, the rest
(PyTorch layers and ops, streams, precision downgrades) are warnings. The agreement table
crosses its verdict with each gate column's.

Entries are duck-typed: ``id``, ``backend``, ``kernel``, ``task``, ``suspect`` and the
``refused`` / ``warned`` dicts of verifier_precision's ``Entry``.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

KB_COLUMN = "KernelBench checker"
CHECKER = Path("kernelbench") / "kernel_static_checker.py"

Validate = Callable[..., tuple[bool, list[str], list[str]]]


def load_checker(corpus: Path) -> Validate | None:
    """``validate_kernel_static`` of the corpus's copy of the checker (None: not fetched)."""
    path = corpus / CHECKER
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("kernelbench_static_checker", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.validate_kernel_static


def precision_of(task: str) -> str:
    """The precision KernelBench would be told the task computes in."""
    if "bfloat16" in task:
        return "bf16"
    if "float16" in task or ".half()" in task:
        return "fp16"
    return "fp32"


def judge_with_kernelbench(entries: Iterable[Any], validate: Validate) -> None:
    """Fill every entry's ``KB_COLUMN``: the checker's errors (empty: it accepts)."""
    for entry in entries:
        try:
            _, errors, warnings = validate(
                entry.kernel, backend=entry.backend, precision=precision_of(entry.task)
            )
        except Exception as exc:  # its regexes on someone else's code: report, go on
            errors, warnings = [f"checker error: {type(exc).__name__}: {exc}"], []
        entry.refused[KB_COLUMN] = list(errors)
        entry.warned[KB_COLUMN] = list(warnings)


def agreement(entries: list[Any], columns: list[str], listed: str | None) -> None:
    """The agreement table of KernelBench's checker with each gate column, the share of
    correct kernels the checker accepts that the gate refuses, and (for ``listed``) those
    kernels one by one."""
    kb_ok = [e for e in entries if not e.refused.get(KB_COLUMN)]
    refused = len(entries) - len(kb_ok)
    print(f"\nKernelBench checker: refuses {refused} of {len(entries)}, by reason")
    reasons = Counter(r for e in entries for r in e.refused.get(KB_COLUMN) or [])
    for reason, n in reasons.most_common():
        suspect = sum(1 for e in entries if e.suspect and reason in e.refused[KB_COLUMN])
        print(f"  {n:5} ({suspect} suspect)  {reason}")
    print(
        "\nagreement with KernelBench's checker: kernels (correct by their sources' records;"
        " suspect ones in brackets)"
    )
    width = max(len(c) for c in columns) + 2
    heads = ("gate accepts", "gate refuses")
    print(
        f"  {'':{width}}{'KernelBench accepts':^34}|{'KernelBench refuses':^34}\n"
        f"  {'':{width}}" + ("".join(f"{h:>17}" for h in heads) + "|") * 2
    )
    lines = []
    for column in columns:
        judged = [e for e in entries if e.refused.get(column, []) is not None]
        cells = []
        for kb_accepts in (True, False):
            for gate_accepts in (True, False):
                mine = [
                    e
                    for e in judged
                    if (not e.refused.get(KB_COLUMN)) == kb_accepts
                    and (not e.refused.get(column)) == gate_accepts
                ]
                suspect = sum(1 for e in mine if e.suspect)
                cells.append(f"{len(mine) - suspect} [{suspect}]")
        row = "".join(f"{c:>17}" for c in cells[:2]) + "|" + "".join(f"{c:>17}" for c in cells[2:])
        print(f"  {column:{width}}{row}|")
        accepted = [e for e in judged if not e.suspect and not e.refused.get(KB_COLUMN)]
        refused = sum(1 for e in accepted if e.refused.get(column))
        pct = f"{100 * refused / len(accepted):.1f}" if accepted else "0"
        lines.append(
            f"  {column}: gate refuses {refused} of {len(accepted)} ({pct} %) of the kernels "
            "KernelBench accepts and their sources call correct"
        )
    print("\n".join(lines))
    if listed is None:
        return
    chosen = [e for e in kb_ok if e.refused.get(listed)]
    print(f"\nKernelBench accepts, the gate refuses under {listed}: {len(chosen)}")
    by_rule = Counter(
        (e.refused[listed] or ["?"])[0].split(":", 1)[0] for e in chosen if not e.suspect
    )
    rules = ", ".join(f"{r} {n}" for r, n in by_rule.most_common())
    print(f"  correct ones by first rule: {rules or 'none'}")
    for entry in chosen:
        why = f"suspect: {entry.suspect}" if entry.suspect else "FALSE REFUSAL"
        print(f"  {entry.id} [{why[:120]}]\n      {(entry.refused[listed] or [''])[0][:170]}")
    both = [e for e in entries if e.refused.get(KB_COLUMN) and e.refused.get(listed)]
    correct = [e for e in both if not e.suspect]
    print(
        f"\nKernelBench refuses too, the gate refuses under {listed}: {len(both)} "
        f"({len(both) - len(correct)} suspect)"
    )
    for entry in correct:
        print(
            f"  {entry.id} [correct by its source]\n      KernelBench: "
            f"{entry.refused[KB_COLUMN][0][:80]}; gate: {(entry.refused[listed] or [''])[0][:120]}"
        )
