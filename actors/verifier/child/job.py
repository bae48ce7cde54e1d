"""One verification job in its sandbox process, phase by phase: confine the process, load
the task, start the backend's runtime, load the candidate, let the judge run the trials,
time the candidate on a GPU, and hand the result to the parent.

The job is ``WORKDIR/job.json`` (written by :mod:`kernelflow.actors.verifier.engine`); the
result, the fields of ``VerificationReport``, leaves through
:func:`~.report.write_result`. Anything else (a crash, a timeout, no result) is turned into
a verdict by the parent.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kernelflow.actors.backends import DEFAULT_BACKEND, Backend, backend
from kernelflow.actors.sandbox import confine
from kernelflow.actors.verifier.child.candidate import Candidate
from kernelflow.actors.verifier.child.guards import LAUNCHES
from kernelflow.actors.verifier.child.judge import Checks, Judge, Judged
from kernelflow.actors.verifier.child.loading import load_module
from kernelflow.actors.verifier.child.report import (
    WROTE_OUTSIDE,
    Reports,
    Verdict,
    finite,
    format_exception,
    internal_error,
    write_result,
    wrote_outside,
)

__all__ = ["execute", "run_job"]


def execute(workdir: Path, nonce: str) -> None:
    """Run the job of ``workdir`` in this (not yet confined) process; never returns."""
    job: dict[str, Any] = {}
    started = time.perf_counter()
    me = os.getpid()
    try:
        job = json.loads((workdir / "job.json").read_text())
        confine(
            workdir,
            fs_isolation=bool(job.get("fs_isolation")),
            memory_kind=job.get("memory_kind", "as"),
            memory_mb=int(job.get("memory_mb", 0)),
        )
        result = run_job(workdir, job)
    except BaseException as exc:  # a bug here must still produce a readable verdict
        result = internal_error(exc, workdir, str(job.get("device") or ""))
    if os.getpid() != me:  # a process the candidate forked: only the sandbox reports
        os._exit(0)
    result["duration_s"] = time.perf_counter() - started
    try:
        write_result(workdir, result, nonce)
    except BaseException:
        os._exit(70)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip atexit handlers and interpreter teardown: candidate code may have registered
    # some (to rewrite result.json, or to hang).
    os._exit(0)


def run_job(workdir: Path, job: dict[str, Any]) -> dict[str, Any]:
    """The job's result (a dict of ``VerificationReport`` fields)."""
    import torch

    checks = Checks.from_job(job)
    reports = Reports(checks.device)
    dsl = backend(job.get("backend", DEFAULT_BACKEND))
    if checks.device == "cuda":
        # Full-precision fp32 reference: TF32 would loosen it beyond the tolerances.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    notes: list[str] = []
    if not job.get("fs_isolation"):
        notes.append(
            "sandbox: no file-system isolation on this machine (mount namespaces are not "
            "available): writes outside the work dir are not blocked"
        )
    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    wd = str(workdir)
    try:
        # The reference comes first: a broken task is not the coder's fault.
        task = load_task(workdir, job["task_file"], f"kf_task_{tag}", reports)
        start_backend(dsl, checks.device, reports)
        candidate = load_candidate(
            workdir, job["candidate_file"], f"kf_candidate_{tag}", dsl, checks.device, reports
        )
        model_class = required_classes(task, candidate, reports)
        judged = Judge(task, model_class, candidate, checks, reports, notes, wd).run()
    except Verdict as verdict:
        return verdict.result
    speedup, timing = time_candidate(candidate, judged, job, notes, wd)
    return reports.passed(
        trials=judged.trials,
        shapes=judged.shapes,
        max_abs=judged.max_abs,
        max_rel=judged.max_rel,
        speedup=speedup,
        timing=timing,
        notes=notes,
    )


def load_task(workdir: Path, file: str, name: str, reports: Reports) -> Any:
    try:
        return load_module(workdir / file, name)
    except BaseException as exc:
        tb = format_exception(exc, str(workdir))
        raise reports.failed(
            "runtime_error", "the reference task failed to import", tb, "task_error: " + tb[-1]
        ) from None


def start_backend(dsl: Backend, device: str, reports: Reports) -> None:
    """Ready the backend's runtime and launch counting before the candidate is imported."""
    try:
        dsl.start_runtime(device, LAUNCHES)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        msg = (
            f"backend {dsl.name!r} is unsupported on this device ({device}): "
            f"{dsl.runtime_unavailable} ({type(exc).__name__}: {exc})"
        )
        raise reports.failed("unsupported", msg, [msg], "unsupported: " + msg) from None


def load_candidate(
    workdir: Path, file: str, name: str, dsl: Backend, device: str, reports: Reports
) -> Candidate:
    try:
        return Candidate.load(workdir / file, name, device, dsl.launch_label)
    except BaseException as exc:
        tb = format_exception(exc, str(workdir))
        last = tb[-1] if tb else type(exc).__name__
        if wrote_outside(exc):
            raise reports.failed(
                "rejected_runtime", f"candidate import: {last}", tb, WROTE_OUTSIDE + last
            ) from None
        raise reports.failed(
            "compile_error", f"candidate failed to import: {last}", tb, "import: " + last
        ) from None


def required_classes(task: Any, candidate: Candidate, reports: Reports) -> Any:
    """The task's ``Model``; both it and the candidate's ``ModelNew`` must exist."""
    model_class = getattr(task, "Model", None)
    if model_class is None:
        raise reports.failed(
            "runtime_error",
            "the reference task defines no Model",
            ["no Model"],
            "task_error: no Model",
        )
    if candidate.model_class is None:
        msg = "candidate module defines no ModelNew after import"
        raise reports.failed("compile_error", msg, [msg], "no_modelnew: " + msg)
    return model_class


def time_candidate(
    candidate: Candidate, judged: Judged, job: dict[str, Any], notes: list[str], workdir: str
) -> tuple[float | None, dict[str, Any] | None]:
    """Speedup and timing details on a GPU when asked for; interpreted Triton on the CPU
    has no meaningful timing, so (None, None) there. A failed timing is a note."""
    if candidate.device != "cuda" or not job.get("timing", True):
        return None, None
    try:
        speedup, timing = candidate.timing(
            judged.reference_model, judged.inputs, judged.expected, job
        )
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        notes.append("timing failed: " + " | ".join(format_exception(exc, workdir)[-3:]))
        return None, None
    return finite(speedup), timing
