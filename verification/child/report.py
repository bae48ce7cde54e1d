"""What a check tells the parent: failures and their rules, exceptions made readable for
an LLM coder, the result dicts (the fields of ``VerificationReport``), and
:func:`write_result`, the one place where a result leaves the sandbox.

Child side: stdlib only.
"""

from __future__ import annotations

import errno
import json
import math
import os
import traceback
from pathlib import Path
from typing import Any

from kernelflow.verification.child.speedup import speedup_words

__all__ = [
    "WROTE_OUTSIDE",
    "CheckEnded",
    "Reports",
    "VerificationFailure",
    "classify_exception",
    "exception_chain",
    "finite",
    "fmt",
    "format_exception",
    "internal_error",
    "rejected",
    "write_result",
    "wrote_outside",
]

MAX_TRACEBACK_LINES = 30
MAX_LINE_CHARS = 400
WROTE_OUTSIDE = "filesystem: the candidate tried to write outside its sandbox work dir: "


class VerificationFailure(Exception):
    """The candidate ran but its results (or behaviour) are not acceptable."""

    def __init__(
        self,
        summary: str,
        errors: list[str],
        *,
        verdict: str = "mismatch",
        rule: str = "mismatch",
        **fields: Any,
    ) -> None:
        super().__init__(summary)
        self.summary = summary
        self.errors = errors
        self.verdict = verdict
        self.rule = rule
        self.fields = fields


def rejected(rule: str, message: str) -> VerificationFailure:
    return VerificationFailure(message, [message], verdict="rejected_runtime", rule=rule)


class CheckEnded(Exception):
    """A check that ended before it passed, with its result (raise it from any phase)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("summary", ""))
        self.result = result


class Reports:
    """The result dicts of one job on ``device``."""

    def __init__(self, device: str, environment: dict[str, str] | None = None) -> None:
        self.base: dict[str, Any] = {
            "device": device,
            "trials": 0,
            "shapes": [],
            "environment": environment or {},
        }

    def failed(
        self, verdict: str, summary: str, lines: list[str], reason: str, trials_done: int = 0
    ) -> CheckEnded:
        # One feedback entry: the (trimmed) traceback reads best as a single block.
        return CheckEnded(
            {
                **self.base,
                "verdict": verdict,
                "summary": summary,
                "errors": ["\n".join(lines)],
                "reasons": [reason],
                "trials": trials_done,
            }
        )

    def refused(
        self, failure: VerificationFailure, trial: int, label: str, shapes: list[dict[str, int]]
    ) -> CheckEnded:
        """A check the candidate failed on trial ``trial``, with what it measured."""
        return CheckEnded(
            {
                **self.base,
                "verdict": failure.verdict,
                "max_abs_err": finite(failure.fields.get("max_abs_err")),
                "max_rel_err": finite(failure.fields.get("max_rel_err")),
                "mismatches": failure.fields.get("mismatches", []),
                "trials": trial + 1,
                "summary": f"{label}: {failure.summary}",
                "errors": failure.errors,
                "reasons": [f"{failure.rule}: {failure.summary}"],
                "shapes": shapes,
            }
        )

    def built(self, count: int, seconds: float) -> dict[str, Any]:
        """A build job that built its ``count`` extensions."""
        summary = f"built {count} extension(s) in {seconds:.1f} s"
        return {**self.base, "verdict": "pass", "summary": summary, "errors": [], "reasons": []}

    def passed(
        self,
        *,
        trials: int,
        shapes: list[dict[str, int]],
        max_abs: float,
        max_rel: float,
        speedup: float | None,
        timing: dict[str, Any] | None,
        notes: list[str],
        warnings: list[str],
    ) -> dict[str, Any]:
        summary = f"all {trials} trial(s) match the reference (max abs err {fmt(max_abs)})"
        if len(shapes) > 1:
            summary += f" on {len(shapes)} shape sets"
        timing = dict(timing) if timing is not None else None
        conclusive = timing.pop("conclusive", None) if timing is not None else None
        if speedup is not None:
            interval = (timing or {}).get("speedup_ci95")
            summary += f"; speedup {speedup_words(speedup, interval, conclusive)}"
        return {
            **self.base,
            "verdict": "pass",
            "summary": summary,
            "errors": notes,
            "reasons": [f"flag: {f}" for f in (timing or {}).get("flags", [])],
            "max_abs_err": finite(max_abs),
            "max_rel_err": finite(max_rel),
            "trials": trials,
            "speedup": speedup,
            "speedup_conclusive": conclusive if speedup is not None else None,
            "timing": timing,
            "shapes": shapes,
            "warnings": warnings,
        }

    def reference_runs(self, shapes: list[dict[str, int]], notes: list[str]) -> dict[str, Any]:
        """The result of a reference-only job whose reference ran on ``shapes``."""
        sets = f"{len(shapes)} shape set(s)" if shapes != [{}] else "the task's own sizes"
        return {
            **self.base,
            "verdict": "pass",
            "summary": f"the task's reference runs on {sets}",
            "errors": notes,
            "shapes": shapes,
        }


def internal_error(exc: BaseException, workdir: Path, device: str) -> dict[str, Any]:
    """The result of a job the verifier itself failed: a bug must still read as a verdict."""
    return {
        "verdict": "runtime_error",
        "summary": f"verifier internal error: {exc!r}",
        "errors": ["\n".join(format_exception(exc, str(workdir)))],
        "reasons": [f"internal: {exc!r}"],
        "device": device,
    }


def write_result(result_fd: int, result: dict[str, Any]) -> None:
    """Hand ``result`` to the parent on ``result_fd``, a pipe only the judge's process
    holds: the only way a result leaves the sandbox. Bounded to fit the pipe's buffer
    (the parent reads it once the process has exited)."""
    data = json.dumps(_bounded(result), allow_nan=False).encode()
    with os.fdopen(result_fd, "wb", closefd=True) as pipe:
        pipe.write(data)


def _bounded(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its texts trimmed: a result must fit in the pipe's buffer."""
    limited = dict(result)
    caps = (("errors", 12_000), ("mismatches", 2_000), ("reasons", 8_000), ("warnings", 3_000))
    for key, cap in caps:
        items = [str(x)[:cap] for x in limited.get(key) or []]
        while items and sum(map(len, items)) > cap:
            items.pop()
        limited[key] = items
    limited["summary"] = str(limited.get("summary", ""))[:2_000]
    return limited


def finite(x: float | None) -> float | None:
    # result.json must be strict JSON (msgspec rejects NaN/Infinity).
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def fmt(x: float) -> str:
    return f"{x:.6g}"


def format_exception(exc: BaseException, workdir: str) -> list[str]:
    """A traceback an LLM coder can act on: its own frames, the raising frame, the error.

    Library frames (torch, triton internals) between them are elided; the exception chain
    is kept because Triton wraps the real error (e.g. an InterpreterError caused by a
    NameError inside the kernel). Paths are made relative to the work dir, so the coder
    reads ``candidate.py``.
    """
    chain: list[BaseException] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    chain.reverse()

    prefix = workdir.rstrip("/") + "/"
    lines: list[str] = []
    for i, err in enumerate(chain):
        if i:
            direct = chain[i - 1] is err.__cause__
            lines.append(
                "The above exception was the direct cause of the following exception:"
                if direct
                else "During handling of the above exception, another exception occurred:"
            )
        frames = traceback.extract_tb(err.__traceback__)
        if frames:
            lines.append("Traceback (most recent call last):")
            skipped = 0
            for j, frame in enumerate(frames):
                if frame.filename.startswith(prefix) or j == len(frames) - 1:
                    if skipped:
                        lines.append(f"  ... {skipped} library frame(s) ...")
                        skipped = 0
                    lines.extend("".join(traceback.format_list([frame])).rstrip("\n").split("\n"))
                else:
                    skipped += 1
        lines.extend(
            "".join(traceback.format_exception_only(type(err), err)).rstrip("\n").split("\n")
        )
    cleaned = [(ln.replace(prefix, "")[:MAX_LINE_CHARS]) for ln in lines if ln.strip() != ""]
    if len(cleaned) > MAX_TRACEBACK_LINES:
        cleaned = ["... (earlier lines trimmed)", *cleaned[-MAX_TRACEBACK_LINES:]]
    return cleaned


def exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    return chain


def classify_exception(exc: BaseException) -> str:
    names = {type(e).__name__ for e in exception_chain(exc)}
    if names & {"CompilationError", "CompileException", "NVRTCError", "SyntaxError"}:
        return "compile_error"
    return "runtime_error"


def wrote_outside(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a write the read-only sandbox file system refused (an
    OSError, or a library's own error quoting it, as torch.save's RuntimeError does)."""
    text = os.strerror(errno.EROFS)
    return any(
        (isinstance(e, OSError) and e.errno == errno.EROFS) or text in str(e)
        for e in exception_chain(exc)
    )
