"""The parent's side of a sandbox's result: what the sandbox left behind (its exit, its
output, the ``result.json`` it signed with the job's nonce) turned into a
``VerificationReport``, and the bounded feedback text a coder reads.

The child writes the result in :func:`kernelflow.actors.verifier.child.report.write_result`;
a result that is missing, unsigned or malformed is never trusted.
"""

from __future__ import annotations

import signal
from pathlib import Path

import msgspec

from kernelflow.actors.sandbox import ProcessOutcome
from kernelflow.actors.verifier.child.report import RESULT_FILE
from kernelflow.events.model import VerificationReport

__all__ = ["feedback_text", "interpret"]

_FEEDBACK_LINES = 30


class _Signed(msgspec.Struct):
    nonce: str = ""


_VERDICT_ADVICE = {
    "compile_error": "The module or a kernel does not compile; fix the error below.",
    "runtime_error": "The candidate crashed while running; fix the error below.",
    "timeout": "The candidate did not finish in time (endless loop, or far too slow).",
    "mismatch": "The kernel runs but its results differ from the reference.",
    "rejected_static": "The code breaks a verifier rule; the kernel itself must do the work.",
    "rejected_runtime": "The candidate broke a rule while running; see the reason below.",
    "unsupported": "This backend cannot run on this device.",
}


def feedback_text(report: VerificationReport, limit: int = 2000) -> str:
    """A concise text for the coder: verdict, rule(s) broken, key error lines, mismatches."""
    if report.passed:
        return f"pass: {report.summary}"[:limit]
    parts = [f"Verdict: {report.verdict}. {_VERDICT_ADVICE.get(report.verdict, '')}"]
    parts.append(report.summary)
    if report.reasons and report.verdict.startswith("rejected"):
        parts.append("Rules broken:\n" + "\n".join(f"- {r}" for r in report.reasons[:8]))
    if report.mismatches:
        parts.append("First mismatching positions:\n" + "\n".join(report.mismatches[:5]))
    shown = set(report.reasons) | {report.summary}
    body = "\n".join(e for e in report.errors if e and e not in shown)
    if body:
        lines = body.splitlines()
        if len(lines) > 20:
            lines = ["...", *lines[-20:]]
        parts.append("\n".join(lines))
    text = "\n".join(p for p in parts if p)
    return text if len(text) <= limit else text[: limit - 15] + "\n[... trimmed]"


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
    outcome: ProcessOutcome, workdir: str, nonce: str, timeout_s: float
) -> VerificationReport:
    """Turn what the sandbox left behind (its exit, its output, ``result.json``) into a
    report: the result it wrote, if it is signed with ``nonce`` and the sandbox exited
    cleanly; otherwise a verdict on how it ended."""
    if outcome.returncode is None:
        summary = f"timeout: verification exceeded the {timeout_s:g} s limit and was killed"
        errors = [
            summary + " (an endless loop in forward() or in the kernel, or a kernel far "
            "too slow for the input size?)"
        ]
        if outcome.output.strip():
            errors.append("last output:\n" + _tail(outcome.output, workdir, 10))
        return VerificationReport(
            verdict="timeout", summary=summary, errors=errors, reasons=[f"timeout: {summary}"]
        )
    result_path = Path(workdir, RESULT_FILE)
    try:
        raw = result_path.read_bytes() if result_path.is_file() else b""
    except OSError:
        raw = b""
    parsed: VerificationReport | None = None
    if raw:
        try:
            if msgspec.json.decode(raw, type=_Signed).nonce == nonce:
                parsed = msgspec.json.decode(raw, type=VerificationReport)
        except msgspec.DecodeError:
            parsed = None
    if parsed is not None and outcome.returncode == 0:
        return parsed
    tail = (
        ["output of the sandbox (tail):\n" + _tail(outcome.output, workdir)]
        if outcome.output.strip()
        else []
    )
    if raw and parsed is None:
        summary = "the sandbox wrote an invalid or unsigned result (candidate tampering?)"
        return VerificationReport(
            verdict="rejected_runtime",
            summary=summary,
            errors=[summary, *tail],
            reasons=[f"tampering: {summary}"],
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
