"""Benchmark results of searches over a set of problems, and the card that says how
every number was measured (pure: databases in, plain data out).

Per problem (``ProblemResult``): the best verdict any candidate's kernel got (by its
newest check: a kernel a newer verifier refused no longer counts), the speedup of the best
passing kernel over eager PyTorch and over ``torch.compile`` where a GPU timed them,
attempts and cost. A problem is solved when one of its kernels passed; one whose only
answers were refused as reward hacks is not.

For the run (``run_summary``, KernelBench's definitions over problems, leaving out the
problems whose best verdict is a fault: a broken task or a node that could not check it,
counted apart as ``faults``): correctness (the share solved); ``fast_p``: the share
solved with a speedup above ``p``, where ``p = 0`` needs no timing and ``p > 0`` is None
(not measured, never 0) when no kernel was timed; the geometric mean of the measured
speedups; tokens, dollars and GPU-seconds in all and per correct-and-faster kernel
(solved with a speedup above 1). Only conclusive speedups count in fast_p (p > 0), the
geomeans and the faster kernels (``kernelflow.projections.speedups``): a solved problem
whose best kernel's timing was inconclusive is counted apart (``inconclusive``).

``benchmark_card``: device and driver, timing method, each timed number's 95 % interval,
baselines, verifier versions and strictness policies, the tolerances, the anti-cheat
checks, the kernels that passed with warnings, and every speedup flagged as implausible
(and so re-timed). Numbers are printed with their card or not at all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from kernelflow.events.model import FAULT_VERDICTS, VerificationReport
from kernelflow.projections.search import Candidate, SearchDatabase
from kernelflow.projections.speedups import counted, report_conclusive, speedup_text
from kernelflow.projections.statistics import geomean

BENCH_FAST_P: tuple[float, ...] = (0.0, 1.0, 1.2, 2.0)
# The metadata key of a bench candidate's problem file (its run's: ``BENCH_RUN``, in
# ``kernelflow.offline.sources``).
PROBLEM = "problem"
# Verdicts from best to worst: what "the best verdict" of a problem means.
VERDICT_ORDER = (
    "pass",
    "mismatch",
    "runtime_error",
    "timeout",
    "compile_error",
    "rejected_runtime",
    "rejected_static",
    "unsupported",
    "task_error",
    "fail",
    "error",
)
NO_TIMING = (
    "no kernel was timed (Triton runs in its CPU interpreter here, which has no timing "
    "meaning; the cpp backend's kernels are timed on the CPU): fast_p for p > 0, speedups "
    "and per-faster-kernel costs are not measured"
)


@dataclass(frozen=True)
class ProblemResult:
    problem: str
    search_id: str
    solved: bool
    best_verdict: str | None
    best_task: str | None  # the task of the best kernel
    speedup: float | None  # of the best passing kernel, over eager PyTorch
    speedup_compile: float | None  # over torch.compile of the reference
    candidates: int
    running: int
    verifications: int
    tokens: int
    cost_usd: float | None
    gpu_s: float  # verifying its candidates on a GPU
    flags: tuple[str, ...] = ()
    # Whether each speedup is conclusive (None: no speedup), and the eager one's 95 % range.
    speedup_conclusive: bool | None = None
    speedup_compile_conclusive: bool | None = None
    speedup_ci95: tuple[float, ...] = ()
    # The best kernel's fraction of speed-of-light (docs/verifier.md; None: not counted).
    sol_fraction: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "flags": list(self.flags),
            "speedup_ci95": list(self.speedup_ci95),
        }

    @property
    def counted_speedup(self) -> float | None:
        """The speedup over eager as a figure to count: None when inconclusive."""
        return counted(self.speedup, self.speedup_conclusive)

    @property
    def counted_speedup_compile(self) -> float | None:
        return counted(self.speedup_compile, self.speedup_compile_conclusive)


def _verdict_rank(verdict: str | None) -> int:
    return VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else len(VERDICT_ORDER)


def best_kernel(db: SearchDatabase) -> Candidate | None:
    """The fastest passing kernel (an untimed or inconclusively timed pass counts as
    parity), else the candidate with the best verdict; ties to the earlier candidate."""
    ended = [c for c in db.ordered() if c.ended]
    passed = [c for c in ended if c.passed]
    if passed:
        return max(passed, key=lambda c: (c.ranked_speedup, -c.index))
    judged = [c for c in ended if c.verdict is not None]
    return min(judged, key=lambda c: (_verdict_rank(c.verdict), c.index)) if judged else None


def problem_result(problem: str, db: SearchDatabase) -> ProblemResult:
    candidates = db.ordered()
    best = best_kernel(db)
    costs = [c.cost_usd for c in candidates if c.cost_usd is not None]
    solved = best is not None and best.passed
    report = best.report if best is not None else None
    timing = report.timing if report is not None else None
    speedup = _over(best, "eager") if solved else None
    speedup_compile = _over(best, "compile") if solved else None
    return ProblemResult(
        problem=problem,
        search_id=db.search_id or "",
        solved=solved,
        best_verdict=best.verdict if best is not None else None,
        best_task=best.task_id if best is not None else None,
        speedup=speedup,
        speedup_compile=speedup_compile,
        candidates=len(candidates),
        running=sum(1 for c in candidates if not c.ended),
        verifications=sum(c.verifications for c in candidates),
        tokens=sum(c.tokens for c in candidates),
        cost_usd=math.fsum(costs) if costs else None,
        gpu_s=math.fsum(c.verify_s for c in candidates if c.verify_device == "cuda"),
        flags=tuple(timing.flags) if timing is not None else (),
        speedup_conclusive=_conclusive(report, "eager", speedup),
        speedup_compile_conclusive=_conclusive(report, "compile", speedup_compile),
        speedup_ci95=_interval_over(report, "eager") if speedup is not None else (),
        sol_fraction=report.sol_fraction if solved and report is not None else None,
    )


def _conclusive(
    report: VerificationReport | None, baseline: str, speedup: float | None
) -> bool | None:
    """Whether ``speedup`` (over ``baseline``, from ``report``) counts."""
    if report is None or speedup is None:
        return None
    found = report_conclusive(report, baseline)
    return True if found is None else found


def _interval_over(report: VerificationReport | None, baseline: str) -> tuple[float, ...]:
    timing = report.timing if report is not None else None
    if timing is None:
        return ()
    if baseline == timing.baseline:
        return tuple(timing.speedup_ci95)
    return tuple(timing.speedup_intervals.get(baseline, ()))


def _over(c: Candidate | None, baseline: str) -> float | None:
    if c is None:
        return None
    if baseline in c.speedups:
        return c.speedups[baseline]
    timing = c.report.timing if c.report is not None else None
    if timing is not None and timing.baseline == baseline:
        return c.speedup
    return None


def run_summary(
    results: Sequence[ProblemResult], fast_ps: Sequence[float] = BENCH_FAST_P
) -> dict[str, Any]:
    """The run's numbers over its problems (see the module's docstring)."""
    faults = [r for r in results if r.best_verdict in FAULT_VERDICTS]
    judged = [r for r in results if r.best_verdict not in FAULT_VERDICTS]
    n = len(judged)
    solved = [r for r in judged if r.solved]
    timed = [r for r in solved if r.speedup is not None]
    any_timing = bool(timed)
    counted_speedups = [s for r in timed if (s := r.counted_speedup) is not None]
    faster = [s for s in counted_speedups if s > 1.0]
    tokens = sum(r.tokens for r in results)
    costs = [r.cost_usd for r in results if r.cost_usd is not None]
    dollars = math.fsum(costs) if costs else None
    gpu_s = math.fsum(r.gpu_s for r in results)

    def share(p: float) -> float | None:
        if not n:
            return None
        if p == 0:
            return len(solved) / n
        if not any_timing:
            return None
        return sum(1 for s in counted_speedups if s > p) / n

    def per_faster(total: float | None) -> float | None:
        return total / len(faster) if faster and total is not None else None

    return {
        "problem_count": len(results),
        "faults": [{"problem": r.problem, "verdict": r.best_verdict} for r in faults],
        "solved": len(solved),
        "unfinished": sum(1 for r in results if r.running),
        "correctness": len(solved) / n if n else None,
        "fast_p": {f"{p:g}": share(p) for p in fast_ps},
        "timed": any_timing,
        "note": None if any_timing else NO_TIMING,
        # Solved problems whose best kernel's speedup was inconclusive: not counted in
        # fast_p (p > 0), the geomean and the faster kernels.
        "inconclusive": sum(1 for r in timed if r.speedup_conclusive is False),
        "geomean_speedup": geomean(counted_speedups),
        "geomean_speedup_compile": geomean(
            s for r in timed if (s := r.counted_speedup_compile) is not None
        ),
        "correct_and_faster": len(faster) if any_timing else None,
        "tokens": tokens,
        "dollars": dollars,
        "gpu_seconds": gpu_s,
        "per_correct_and_faster": {
            "tokens": per_faster(tokens),
            "dollars": per_faster(dollars),
            "gpu_seconds": per_faster(gpu_s),
        },
    }


@dataclass
class _CardFacts:
    environments: list[dict[str, str]] = field(default_factory=list)
    versions: set[int] = field(default_factory=set)
    policies: set[str] = field(default_factory=set)
    tolerances: dict[str, list[float]] = field(default_factory=dict)
    warned: list[dict[str, Any]] = field(default_factory=list)
    checks: list[frozenset[str]] = field(default_factory=list)
    methods: dict[str, dict[str, Any]] = field(default_factory=dict)


def benchmark_card(
    databases: Mapping[str, SearchDatabase],
    results: Iterable[ProblemResult] = (),
    *,
    timed: Iterable[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """How the numbers of these databases' kernels were measured, from the reports of
    their newest checks. The timings listed are those of the kernels whose numbers are
    printed: ``timed`` (label, task id) pairs, by default each solved problem's best
    kernel in ``results`` (``databases`` keyed by problem)."""
    facts = _CardFacts()
    found: dict[str, Candidate] = {}
    for db in databases.values():
        for c in db.ordered():
            found[c.task_id] = c
            report = c.report
            if report is None:
                continue
            if report.environment and report.environment not in facts.environments:
                facts.environments.append(dict(report.environment))
            facts.versions.add(report.verifier_version)
            facts.policies.add(report.policy or "strict")
            facts.tolerances.update(report.tolerances)
            if report.passed and report.warnings:
                facts.warned.append({"task": c.task_id, "warnings": list(report.warnings)})
            facts.checks.append(frozenset(report.checks))
            t = report.timing
            if t is not None and t.method:
                method = facts.methods.setdefault(
                    t.method,
                    {
                        "method": t.method,
                        "warmup": t.warmup,
                        "rounds": [t.rounds, t.rounds],  # the fewest and most rounds
                        "reps": [t.reps, t.reps],  # the fewest and most calls of a round
                        "threads": sorted({t.threads} - {0}),
                        "baselines": sorted(t.speedups) or [t.baseline],
                    },
                )
                reps, rounds = method["reps"], method["rounds"]
                method["reps"] = [min(reps[0], t.reps), max(reps[1], t.reps)]
                method["rounds"] = [min(rounds[0], t.rounds), max(rounds[1], t.rounds)]
                if t.threads and t.threads not in method["threads"]:
                    method["threads"] = sorted([*method["threads"], t.threads])
    if timed is None:
        timed = [(r.problem, r.best_task) for r in results if r.solved and r.best_task]
    timings, flagged = [], []
    for label, task_id in timed:
        kernel = found.get(task_id)
        t = kernel.report.timing if kernel is not None and kernel.report is not None else None
        if kernel is None or t is None or not kernel.passed:
            continue
        timings.append(
            {
                "problem": label,
                "task": task_id,
                "candidate_ms": t.candidate_ms.get("median"),
                "candidate_ci95_ms": list(t.candidate_ci_ms),
                "baseline": t.baseline,
                "baseline_ms": t.baseline_ms.get("median"),
                "baseline_ci95_ms": list(t.baseline_ci_ms),
                "speedups": dict(t.speedups)
                or ({t.baseline: kernel.speedup} if kernel.speedup is not None else {}),
                "speedup_ci95": list(t.speedup_ci95),
                "speedup_conclusive": report_conclusive(kernel.report) if kernel.report else None,
                # The roofline it was held against (docs/verifier.md, "Speed-of-light").
                "roofline": msgspec.to_builtins(t.roofline) if t.roofline else None,
            }
        )
        flagged += [{"problem": label, "task": task_id, "flag": f} for f in t.flags]
    every = frozenset.intersection(*facts.checks) if facts.checks else frozenset()
    some = frozenset.union(*facts.checks) if facts.checks else frozenset()
    return {
        "devices": facts.environments,
        "timing": list(facts.methods.values()) or None,
        "timing_note": None if facts.methods else NO_TIMING,
        "timings": timings,
        "verifier_versions": sorted(facts.versions),
        "policies": sorted(facts.policies),
        "tolerances": dict(sorted(facts.tolerances.items())),
        "passed_with_warnings": facts.warned,
        "checks_on_in_every_check": sorted(every),
        "checks_on_in_some_only": sorted(some - every),
        "implausible_speedups": flagged,
    }


def _span(pair: Any) -> str:
    """``[fewest, most]`` as ``6`` or ``6 to 40`` (a card of before ranges: the number)."""
    if not isinstance(pair, list):
        return str(pair)
    fewest, most = pair
    return f"{fewest}" if fewest == most else f"{fewest} to {most}"


def _interval(pair: list[float]) -> str:
    return f"[{pair[0]:.4g}, {pair[1]:.4g}]" if pair else "[]"


def card_lines(card: dict[str, Any]) -> list[str]:
    """The card as lines of text (the terminal's and the report's)."""
    lines = []
    for env in card["devices"] or [{}]:
        lines.append("  device: " + (", ".join(f"{k} {v}" for k, v in env.items()) or "unknown"))
    for t in card["timing"] or ():
        threads = f"; threads {', '.join(map(str, t['threads']))}" if t["threads"] else ""
        lines.append(
            f"  timing: {t['method']}; {t['warmup']} warm-up calls, {_span(t['rounds'])} "
            f"rounds of {_span(t['reps'])} calls (more rounds, within a budget, while a "
            f"speedup is inconclusive); baselines {', '.join(t['baselines'])}{threads}"
        )
    if not card["timing"]:
        lines.append(f"  timing: none: {card['timing_note']}")
    for t in card["timings"]:
        interval = t["speedup_ci95"]
        candidate = f"{t['candidate_ms']:.4g} ms {_interval(t['candidate_ci95_ms'])}"
        baseline = f"{t['baseline_ms']:.4g} ms {_interval(t['baseline_ci95_ms'])}"
        speedup = f"; speedup {interval[0]:.2f}x to {interval[1]:.2f}x" if interval else ""
        if t.get("speedup_conclusive") is False:
            median = t["speedups"].get(t["baseline"])
            speedup = "; speedup " + speedup_text(median, interval, False)
        limit = t.get("roofline")
        sol = (
            f"; {limit['sol_fraction']:.0%} of speed-of-light ({limit['bound']}-bound: "
            f"{limit['attainable_ms']:.3g} ms at {limit['peak_gbs']:.0f} GB/s, "
            f"{limit['peak_gflops']:.0f} GFLOP/s)"
            if limit
            else ""
        )
        lines.append(
            f"  {t['problem']}: candidate {candidate}, {t['baseline']} {baseline} (95 % "
            f"intervals){speedup}{sol}"
        )
    versions = ", ".join(map(str, card["verifier_versions"])) or "-"
    lines.append(f"  verifier version(s): {versions}")
    lines.append(f"  policy: {', '.join(card['policies']) or '-'}")
    if card["tolerances"]:
        tolerances = ", ".join(
            f"{dtype} atol={pair[0]:g} rtol={pair[1]:g}"
            for dtype, pair in card["tolerances"].items()
        )
        lines.append(f"  tolerances: {tolerances}")
    for w in card["passed_with_warnings"]:
        lines.append(f"  passed with warnings: {w['task']}: {'; '.join(w['warnings'])[:200]}")
    lines.append(f"  checks on: {', '.join(card['checks_on_in_every_check']) or '-'}")
    if card["checks_on_in_some_only"]:
        lines.append(
            f"  checks on in some checks only: {', '.join(card['checks_on_in_some_only'])}"
        )
    for f in card["implausible_speedups"]:
        lines.append(f"  flagged: {f['problem']} ({f['task']}): {f['flag']}")
    if not card["implausible_speedups"]:
        lines.append("  flagged speedups: none")
    return lines
