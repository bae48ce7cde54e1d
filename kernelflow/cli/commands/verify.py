"""``kernelflow verify``: check one candidate against one task, no NATS involved.

Exit codes: 0 the verdict is ``pass``; 1 any other verdict; 2 unusable input (unreadable
file, not Python, no ``Model``/``ModelNew``, bad ``--shapes``, a task whose reference fails).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from kernelflow.cli.commands.options import add_policy_option
from kernelflow.events.model import TimingStats, VerificationReport
from kernelflow.host.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from kernelflow.host.settings import Settings
from kernelflow.projections.speedups import interval_conclusive, report_conclusive, speedup_text
from kernelflow.verification.backends import (
    DEFAULT_BACKEND,
    UnknownBackend,
    backend_names,
)
from kernelflow.verification.backends import backend as find_backend
from kernelflow.verification.engine import verify
from kernelflow.verification.results import feedback_text
from kernelflow.verification.taskfile import (
    CandidateError,
    TaskFileError,
    check_candidate_source,
    check_task_source,
)

__all__ = [
    "cmd_verify",
    "parse_shapes",
    "register",
    "say_building",
    "timing_line",
    "verdict_text",
]


class _BadInput(Exception):
    pass


def register(subparsers: Any) -> None:
    """Add the ``verify`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "verify",
        help="verify a candidate kernel against a task (sandboxed; no NATS)",
        description="Check CANDIDATE.py (class ModelNew) against TASK.py (KernelBench "
        "format). Exit 0 on pass, 1 on any other verdict, 2 on unusable input.",
    )
    p.add_argument("--task", required=True, help="task file (class Model, get_inputs, ...)")
    p.add_argument("--candidate", required=True, help="candidate file (class ModelNew)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--backend", choices=backend_names(), default=DEFAULT_BACKEND)
    add_policy_option(p)
    p.add_argument(
        "--shapes",
        action="append",
        default=None,
        metavar="NAME=INT,...",
        help="one shape set: overrides of the task's module-level int constants "
        "(repeat the flag, or separate sets with ';'); default: automatic",
    )
    p.add_argument("--trials", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per verification")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads candidate and baseline compute with where timed on the CPU "
        "(the cpp backend; env KF_VERIFY_THREADS; default: every core)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_verify)


def parse_shapes(values: list[str] | None) -> tuple[dict[str, int], ...] | None:
    if not values:
        return None
    sets: list[dict[str, int]] = []
    for value in values:
        for chunk in value.split(";"):
            chunk = chunk.strip()
            if not chunk:
                continue
            shape: dict[str, int] = {}
            for item in chunk.split(","):
                name, sep, number = item.partition("=")
                name = name.strip()
                if not sep or not name.isidentifier():
                    raise _BadInput(f"--shapes {value!r}: expected NAME=INT[,NAME=INT...]")
                try:
                    shape[name] = int(number)
                except ValueError:
                    raise _BadInput(
                        f"--shapes {value!r}: {number.strip()!r} is not an int"
                    ) from None
            sets.append(shape)
    return tuple(sets) or None


def _read(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise _BadInput(f"{what} file {path}: cannot read it ({reason})") from None


def timing_line(timing: TimingStats, conclusive: bool | None = None) -> str:
    """How the timing came out, in one line: medians, their intervals, the speedup over
    each baseline (inconclusive ones in words: ``kernelflow.projections.speedups``), the
    rounds; flags under it. ``conclusive``: the report's flag for its own baseline (None:
    decided here from the interval)."""

    def ms(side: dict[str, float], interval: list[float]) -> str:
        around = f" [{interval[0]:.3g}, {interval[1]:.3g}]" if interval else ""
        return f"{side.get('median', 0.0):.3g} ms{around}"

    def over(kind: str, value: float) -> str:
        interval = timing.speedup_intervals.get(kind) or (
            timing.speedup_ci95 if kind == timing.baseline else []
        )
        known = conclusive if kind == timing.baseline and conclusive is not None else None
        if known is None and interval:
            known = interval_conclusive(interval)
        if known is False:
            return f"{kind} {speedup_text(value, interval, False)}"
        between = f" (between {interval[0]:.2f}x and {interval[1]:.2f}x)" if interval else ""
        return f"{kind} {value:.2f}x{between}"

    speedups = "; ".join(over(kind, value) for kind, value in timing.speedups.items())
    line = (
        f"  timing: candidate {ms(timing.candidate_ms, timing.candidate_ci_ms)}, "
        f"{timing.baseline} {ms(timing.baseline_ms, timing.baseline_ci_ms)} (medians, 95 % "
        f"intervals); speedup {speedups}"
    )
    if timing.rounds:
        line += f"; {timing.rounds} rounds of {timing.reps} calls"
    if timing.threads:
        line += f"; {timing.threads} thread" + ("s" if timing.threads != 1 else "")
    if timing.queued_s >= 0.5:
        line += f"; waited {timing.queued_s:.1f} s for the node's timing slot"
    if (limit := timing.roofline) is not None:
        line += (
            f"\n  speed-of-light: {limit.sol_fraction:.0%} ({limit.bound}-bound: "
            f"{limit.attainable_ms:.3g} ms attainable for {limit.flops:.3g} FLOP and "
            f"{limit.bytes / 1e6:.3g} MB at {limit.peak_gflops:.0f} GFLOP/s and "
            f"{limit.peak_gbs:.0f} GB/s)"
        )
    return line + "".join(f"\n  flag: {flag}" for flag in timing.flags)


def untimed_reason(report: VerificationReport, timing_on: bool = True) -> str | None:
    """Why a passing check has no speedup, in one line (None: it has one, or it did not
    pass)."""
    if not report.passed or report.speedup is not None:
        return None
    if not timing_on:
        return "not timed: timing is off"
    try:
        timed_on = find_backend(report.backend).timed_on
    except UnknownBackend:
        timed_on = frozenset()
    if report.device not in timed_on:
        if report.backend == "triton" and report.device == "cpu":
            return "not timed: Triton runs interpreted on the CPU"
        where = " and ".join(sorted(timed_on)) or "no device"
        return f"not timed: {report.backend} kernels are timed on {where} only"
    return "not timed: the timing failed (see the notes below)"


def verdict_text(report: VerificationReport, timing_on: bool = True) -> str:
    """``kernelflow verify``'s text (the coder's feedback of a check that did not pass
    follows it): the verdict line with the policy it was judged under, then every
    warning that policy let through, the timing (or why there is none) and, for a pass,
    the check's notes."""
    policy = report.policy or "strict"
    lines = [
        f"{report.verdict.upper()} on {report.device} ({report.backend}) in "
        f"{report.duration_s:.1f}s under policy {policy}: {report.summary}"
    ]
    lines += [f"  warning: {w}" for w in report.warnings]
    if report.timing is not None:
        lines.append(timing_line(report.timing, report.speedup_conclusive))
    elif (why := untimed_reason(report, timing_on)) is not None:
        lines.append(f"  {why}")
    if report.passed:  # a pass's errors are the check's notes (shapes skipped, timing)
        lines += [f"  note: {note}" for note in report.errors]
    return "\n".join(lines)


def say_building(names: list[str], last_s: float | None) -> None:
    """Why ``verify`` is quiet for a while: the candidate's extensions are compiled here
    first (found built, the next check of the same source builds nothing)."""
    took = (
        f"the last build here took {last_s:.0f}s"
        if last_s is not None
        else "the first build here: 30 to 60 s of compiling torch's headers"
    )
    print(
        f"kernelflow verify: building the extension{'s' * (len(names) > 1)} "
        f"{', '.join(names)} ({took}; a source built once is not built again)…",
        file=sys.stderr,
        flush=True,
    )


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    try:
        task = _read(args.task, "task")
        candidate = _read(args.candidate, "candidate")
        try:
            check_task_source(task, args.task)
        except TaskFileError as exc:
            raise _BadInput(str(exc)) from None
        try:
            check_candidate_source(candidate)
        except CandidateError as exc:
            # Not Python or no ModelNew: the candidate file cannot be verified at all.
            raise _BadInput(f"candidate file {args.candidate}: {exc}") from None
        shapes = parse_shapes(args.shapes)
        if args.trials < 1 or args.timeout <= 0:
            raise _BadInput("--trials must be >= 1 and --timeout > 0")
        if args.threads is not None and args.threads < 1:
            raise _BadInput("--threads must be >= 1")
    except _BadInput as exc:
        print(f"kernelflow verify: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    config = settings.verifier_config(
        trials=args.trials,
        timeout_s=args.timeout,
        shapes=shapes,
        device=args.device,
        threads=args.threads or settings.verify_threads,
        on_build=say_building,
    )
    report = verify(task, candidate, backend=args.backend, policy=args.policy, config=config)
    task_broken = report.verdict == "task_error"
    if args.json:
        timing = msgspec.to_builtins(report.timing) if report.timing is not None else None
        out = {
            "correct": report.passed,
            "verdict": report.verdict,
            "reasons": list(report.reasons),
            "summary": report.summary,
            "max_abs_error": report.max_abs_err,
            "max_rel_error": report.max_rel_err,
            "mismatches": list(report.mismatches),
            "timing": timing,
            "speedup": report.speedup,
            # The speedup's 95 % range, and whether it says anything: false when the range
            # holds 1 or spans more than 2x (the machine was busy); null when not timed.
            "speedup_ci95": list(report.timing.speedup_ci95) if report.timing else None,
            "speedup_conclusive": report_conclusive(report),
            # The fraction of speed-of-light, what bounds the op, and the time the
            # machine's peaks allow (docs/verifier.md, "Speed-of-light"); null: not counted.
            "sol_fraction": report.sol_fraction,
            "bound": limit.bound if (limit := report.roofline) else None,
            "attainable_ms": limit.attainable_ms if limit else None,
            "device": report.device,
            "backend": report.backend,
            "shapes": report.shapes,
            "trials": report.trials,
            "duration_s": round(report.duration_s, 3),
            "feedback": report.feedback,
            "verifier_version": report.verifier_version,
            "policy": report.policy,
            "warnings": list(report.warnings),
            "tolerances": dict(report.tolerances),
            "checks": list(report.checks),
            "environment": dict(report.environment),
        }
        print(json.dumps(out, indent=2))
    else:
        print(verdict_text(report, config.timing))
        if not report.passed:  # what the coder would read, past the line above
            print(feedback_text(report, config.feedback_chars, headline=False))
    if task_broken:
        print(
            f"kernelflow verify: task file {args.task}: the reference fails: {report.summary}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return EXIT_OK if report.passed else EXIT_FAILED
