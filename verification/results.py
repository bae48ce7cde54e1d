"""The parent's side of a sandbox's result: what the sandbox left behind (its exit, its
output, the result its judge wrote on the result pipe) turned into a
``VerificationReport``, and the texts a coder and a user read of it: the bounded
feedback, why a pass has no speedup, how far it is from speed-of-light.

The judge writes the result in :func:`kernelflow.verification.child.report.write_result`
on a pipe the candidate's process never holds; a result that is missing or malformed is
never trusted.
"""

from __future__ import annotations

import signal

import msgspec

from kernelflow.events.model import Roofline, VerificationReport
from kernelflow.sandbox import ProcessOutcome
from kernelflow.verification.backends import UnknownBackend
from kernelflow.verification.backends import backend as find_backend

__all__ = ["cut_at_line", "feedback_text", "interpret", "roofline_text", "untimed_reason"]

_FEEDBACK_LINES = 30


_VERDICT_ADVICE = {
    "compile_error": "The module or a kernel does not compile; fix the error below.",
    "runtime_error": "The candidate crashed while running; fix the error below.",
    "timeout": "The candidate did not finish in time (endless loop, or far too slow).",
    "mismatch": "The kernel runs but its results differ from the reference.",
    "rejected_static": "The code breaks a verifier rule; the kernel itself must do the work.",
    "rejected_runtime": "The candidate broke a rule while running; see the reason below.",
    "unsupported": "This node cannot run this check (not the candidate's fault).",
    "task_error": "The task itself is broken (not the candidate's fault).",
}


def feedback_text(report: VerificationReport, limit: int = 2000, *, headline: bool = True) -> str:
    """A concise text for the coder: verdict, rule(s) broken, key error lines, mismatches,
    each said once; without ``headline`` (a command that prints the verdict and summary
    on a line of its own), what follows them."""
    if report.passed:
        text = f"pass: {report.summary}"
        if report.warnings:
            text += "\nPassed with warnings (the task's policy allows them):\n" + "\n".join(
                f"- {w}" for w in report.warnings[:8]
            )
        return text[:limit]
    advice = _VERDICT_ADVICE.get(report.verdict, "")
    rules = bool(report.reasons) and report.verdict.startswith("rejected")
    # A summary quoting the first rule broken is said by the list below.
    quoted = rules and report.reasons[0] in report.summary
    summary = "" if quoted else report.summary
    parts = [f"Verdict: {report.verdict}. {advice}", summary] if headline else [advice]
    if rules:
        parts.append(_rules_broken(report.reasons, limit - sum(len(p) + 1 for p in parts)))
    if report.mismatches:
        parts.append("First mismatching positions:\n" + "\n".join(report.mismatches[:5]))
    body = "\n".join(e for e in report.errors if e and not _said(e, report))
    if body:
        lines = body.splitlines()
        if len(lines) > 20:
            lines = ["...", *lines[-20:]]
        parts.append("\n".join(lines))
    text = "\n".join(p for p in parts if p)
    return text if len(text) <= limit else text[: limit - 15] + "\n[... trimmed]"


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


def roofline_text(limit: Roofline) -> str:
    """A timed kernel against the machine's limit, in one line (docs/verifier.md,
    "Speed-of-light")."""
    return (
        f"speed-of-light: {limit.sol_fraction:.0%} ({limit.bound}-bound: "
        f"{limit.attainable_ms:.3g} ms attainable for {limit.flops:.3g} FLOP and "
        f"{limit.bytes / 1e6:.3g} MB at {limit.peak_gflops:.0f} GFLOP/s and "
        f"{limit.peak_gbs:.0f} GB/s)"
    )


def cut_at_line(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, cut only between lines (a rule broken is one
    line: never half of one), saying how many lines were left out."""
    if len(text) <= limit:
        return text
    kept: list[str] = []
    lines = text.splitlines()
    used = 0
    for index, line in enumerate(lines):
        note = f"[... {len(lines) - index} more lines]"
        if used + len(line) + 1 + len(note) > limit:
            return "\n".join([*kept, note])
        kept.append(line)
        used += len(line) + 1
    return "\n".join(kept)


def _rules_broken(reasons: list[str], room: int) -> str:
    """The rules broken, each whole (the gate's three-part findings are never cut: the
    coder's prompt, ``verify``'s output and the trajectory read the same words), as many
    as fit in ``room`` characters (at least the first), then how many more."""
    lines = ["Rules broken:"]
    used = len(lines[0])
    for index, reason in enumerate(reasons):
        more = len(reasons) - index
        if index and used + len(reason) + 3 + 40 > room:
            lines.append(f"({more} more rule{'s' * (more > 1)} broken)")
            break
        lines.append(f"- {reason}")
        used += len(reason) + 3
    return "\n".join(lines)


def _said(error: str, report: VerificationReport) -> bool:
    """Whether an error line says what the feedback says already: the summary (which may
    quote it: ``trial 1/3: <error>``), a rule broken, or the mismatching positions."""
    if any(error in said for said in (report.summary, *report.reasons)):
        return True
    listed = error.partition(": ")[2].split("; ")
    return bool(report.mismatches) and all(m in report.mismatches for m in listed)


def _tail(text: str, workdir: str, lines: int = _FEEDBACK_LINES) -> str:
    """Last lines of the child's output, with sandbox paths shortened to ``candidate.py``."""
    text = text.replace(workdir.rstrip("/") + "/", "")
    kept = [ln[:400] for ln in text.strip().splitlines()[-lines:]]
    return "\n".join(kept)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"the sandbox process was killed by {name}"
    return f"the sandbox process exited with status {returncode} before reporting a result"


def interpret(
    outcome: ProcessOutcome, workdir: str, timeout_s: float, candidate_output: str = ""
) -> VerificationReport:
    """Turn what the sandbox left behind (its exit, its output, its judge's result, what
    the candidate printed) into a report: the result, if the sandbox exited cleanly with
    one; otherwise a verdict on how it ended."""
    if outcome.returncode is None:
        summary = f"timeout: verification exceeded the {timeout_s:g} s limit and was killed"
        errors = [
            summary + " (an endless loop in forward() or in the kernel, or a kernel far "
            "too slow for the input size?)"
        ]
        for said in (candidate_output, outcome.output):
            if said.strip():
                errors.append("last output:\n" + _tail(said, workdir, 10))
        return VerificationReport(
            verdict="timeout", summary=summary, errors=errors, reasons=[f"timeout: {summary}"]
        )
    parsed: VerificationReport | None = None
    if outcome.result:
        try:
            parsed = msgspec.json.decode(outcome.result, type=VerificationReport)
        except msgspec.DecodeError:
            parsed = None
    if parsed is not None and outcome.returncode == 0:
        return parsed
    tail = (
        ["output of the sandbox (tail):\n" + _tail(outcome.output, workdir)]
        if outcome.output.strip()
        else []
    )
    if outcome.result and parsed is None:
        summary = "verifier internal error: the judge's result could not be read"
        return VerificationReport(
            verdict="runtime_error",
            summary=summary,
            errors=[summary, *tail],
            reasons=[f"internal: {summary}"],
        )
    if outcome.supervisor_lost:
        summary = (
            "the candidate killed the process supervising it (os.kill of its parent or its "
            "process group?)"
        )
        return VerificationReport(
            verdict="rejected_runtime",
            summary=summary,
            errors=[summary, *tail],
            reasons=[f"hostile: {summary}"],
        )
    summary = _describe_exit(outcome.returncode)
    return VerificationReport(
        verdict="runtime_error",
        summary=summary,
        errors=[summary, *tail],
        reasons=[f"crash: {summary}"],
    )
