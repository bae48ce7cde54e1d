"""One verification job, phase by phase, in the judge's process: fork the candidate's
process first (:mod:`.remote`), confine this one, load the task, have the candidate's
process load the candidate and start the backend's runtime, let the judge run the trials
(:mod:`.judge`), time the candidate where its kernels are timed (:mod:`.timing`, in one
of the node's timing slots: :mod:`.slot`), and hand the result to the parent. A build
job (``job["build"]``) only has the candidate's process compile its C++/CUDA extensions
(:mod:`.build`).

The job is ``WORKDIR/job.json`` (written by :mod:`kernelflow.verification.engine`);
the candidate's files are in ``WORKDIR/candidate/``. The result, the fields of
``VerificationReport``, leaves through :func:`~.report.write_result` on a pipe only this
process holds: the candidate's process closes its copy before any of its code runs.
Anything else (a crash, a timeout, no result) is turned into a verdict by the parent.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from kernelflow.sandbox import confine_judge
from kernelflow.sandbox.limits import libc
from kernelflow.verification.backends import DEFAULT_BACKEND
from kernelflow.verification.child.analysis import analyse
from kernelflow.verification.child.compare import compare_outputs, tolerances_of
from kernelflow.verification.child.device import pin_cores, set_threads
from kernelflow.verification.child.environment import environment
from kernelflow.verification.child.judge import (
    Checks,
    Judge,
    Judged,
    candidate_died,
    candidate_raised,
)
from kernelflow.verification.child.loading import load_module
from kernelflow.verification.child.remote import (
    CandidateDied,
    CandidateRaised,
    RemoteCandidate,
    Unsupported,
    start_candidate,
)
from kernelflow.verification.child.report import (
    CheckEnded,
    Reports,
    VerificationFailure,
    finite,
    format_exception,
    internal_error,
    write_result,
)
from kernelflow.verification.child.roofline import Peaks
from kernelflow.verification.child.slot import TimingSlot
from kernelflow.verification.child.taskload import load_task
from kernelflow.verification.child.timing import speedup_conclusive, timing_report

__all__ = ["execute", "run_job"]

PR_SET_DUMPABLE = 4


def execute(workdir: Path, result_fd: int) -> None:
    """Run the job of ``workdir`` in this (not yet confined) process and write its result
    on ``result_fd``; never returns."""
    started = time.perf_counter()
    began = time.monotonic()
    me = os.getpid()
    job: dict[str, Any] = {}
    candidate: RemoteCandidate | None = None
    slot = TimingSlot([])
    try:
        job = json.loads((workdir / "job.json").read_text())
        # A job that checks only the task's reference starts no candidate process.
        candidate = None if job.get("reference_only") else start_candidate(workdir, job)
        # Opened after the candidate's fork (it never holds them), before the judge's view
        # of the file system may hide their dir.
        slot = TimingSlot.open(job, began)
        confine_judge(
            workdir,
            fs_isolation=bool(job.get("fs_isolation")),
            memory_kind=job.get("memory_kind", "as"),
            memory_mb=int(job.get("memory_mb", 0)),
        )
        # Not traceable, its memory not readable, by a process of the same user.
        libc().prctl(PR_SET_DUMPABLE, 0)
        result = run_job(workdir, job, candidate, slot)
    except BaseException as exc:  # a bug here must still produce a readable verdict
        result = internal_error(exc, workdir, str(job.get("device") or ""))
    finally:
        if candidate is not None and os.getpid() == me:
            candidate.close()
        slot.close()
    if os.getpid() != me:  # never the candidate's process, but be sure: only the judge reports
        os._exit(0)
    result["duration_s"] = time.perf_counter() - started
    try:
        write_result(result_fd, result)
    except BaseException:
        os._exit(70)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_job(
    workdir: Path,
    job: dict[str, Any],
    candidate: RemoteCandidate | None,
    slot: TimingSlot | None = None,
) -> dict[str, Any]:
    """The job's result (a dict of ``VerificationReport`` fields); without a candidate,
    whether the task's reference runs on every shape set (``task_error`` if it cannot).
    ``slot``: the node's timing slot the timing waits for (none: it waits for none)."""
    import torch

    if job.get("build"):
        assert candidate is not None
        try:
            return build_job(candidate, job)
        except CheckEnded as verdict:
            return verdict.result
    checks = Checks.from_job(job)
    # The reference computes with the threads the candidate's process is given, on the
    # same cores.
    pin_cores([int(c) for c in job.get("cores") or []])
    set_threads(int(job.get("threads") or 0))
    dsl = str(job.get("backend") or DEFAULT_BACKEND)
    reports = Reports(checks.device, environment(checks.device, dsl))
    if checks.device == "cuda":
        # Full-precision fp32 reference: TF32 would loosen it beyond the tolerances.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    # What the sandbox plan says is missing (only where the operator opted in to run
    # candidates anyway), then what confining the candidate's process found.
    notes: list[str] = [str(note) for note in job.get("sandbox_notes") or []]
    tag = f"{os.getpid()}_{time.monotonic_ns()}"
    wd = str(workdir)
    try:
        # The reference comes first: a broken task is not the coder's fault.
        task = import_task(workdir, job["task_file"], f"kf_task_{tag}", reports)
        if getattr(task, "Model", None) is None:
            msg = "the reference task defines no Model"
            raise reports.failed("task_error", msg, ["no Model"], "task_error: no Model")
        if candidate is not None:
            load_candidate(candidate, job, f"kf_candidate_{tag}", checks.device, reports)
            notes.extend(note for note in candidate.notes if note not in notes)
        task_file = workdir / job["task_file"]

        def task_for(shapes: dict[str, int]) -> Any:
            # Executed afresh with the set's sizes: shapes derived at import follow.
            return task if not shapes else load_task(task_file, shapes, f"kf_task_{tag}")

        judged = Judge(task_for, candidate, checks, reports, notes, wd).run()
    except CheckEnded as verdict:
        return verdict.result
    if job.get("analysis"):
        analyse(str(job["analysis"]), judged, candidate, job, notes, wd, slot or TimingSlot([]))
    if candidate is None:
        return reports.reference_runs(judged.shapes, notes)
    speedup, timing = time_candidate(candidate, judged, job, notes, wd, slot)
    return reports.passed(
        trials=judged.trials,
        shapes=judged.shapes,
        max_abs=judged.max_abs,
        max_rel=judged.max_rel,
        speedup=speedup,
        timing=timing,
        notes=notes,
        warnings=judged.warnings,
    )


def build_job(candidate: RemoteCandidate, job: dict[str, Any]) -> dict[str, Any]:
    """A build job's result: ``pass`` once the candidate's process built every extension
    (:mod:`.build`), else ``compile_error`` with the compiler's first errors."""
    device = str(job["device"])
    reports = Reports(device)
    started = time.monotonic()
    try:
        errors = candidate.build(
            list(job["build"]), device, [int(c) for c in job.get("cores") or []]
        )
    except Unsupported as exc:
        raise reports.failed("unsupported", str(exc), [str(exc)], f"unsupported: {exc}") from None
    except CandidateRaised as raised:
        raise candidate_raised(reports, dict(raised.info), "the build", 0, "build") from None
    except CandidateDied as died:
        raise candidate_died(reports, died, 0, "build") from None
    if errors:
        raise reports.failed("compile_error", errors[0], errors[1:], "compile_error: " + errors[0])
    return reports.built(len(job["build"]), time.monotonic() - started)


def import_task(workdir: Path, file: str, name: str, reports: Reports) -> Any:
    try:
        return load_module(workdir / file, name)
    except BaseException as exc:
        tb = format_exception(exc, str(workdir))
        raise reports.failed(
            "task_error", "the reference task failed to import", tb, "task_error: " + tb[-1]
        ) from None


def load_candidate(
    candidate: RemoteCandidate, job: dict[str, Any], name: str, device: str, reports: Reports
) -> None:
    """The candidate's process imports the candidate (after readying the backend's
    runtime); it must define ``ModelNew``."""
    label = "import"
    try:
        has_model = candidate.load(
            str(job["candidate_file"]),
            str(job.get("backend", DEFAULT_BACKEND)),
            device,
            name,
            list(job.get("warned_rules") or []),
            int(job.get("threads") or 0),
            [int(c) for c in job.get("cores") or []],
        )
    except Unsupported as exc:  # the backend's runtime, or the sandbox, cannot run here
        msg = str(exc)
        raise reports.failed("unsupported", msg, [msg], "unsupported: " + msg) from None
    except VerificationFailure as failure:
        raise reports.refused(failure, 0, label, []) from None
    except CandidateRaised as raised:
        info = dict(raised.info)
        if info.get("kind") != "compile_error" and not info.get("wrote_outside"):
            info["kind"] = "compile_error"  # a module that does not import does not compile
        raise candidate_raised(reports, info, "the candidate's import", 0, label) from None
    except CandidateDied as died:
        raise candidate_died(reports, died, 0, label) from None
    if not has_model:
        msg = "candidate module defines no ModelNew after import"
        raise reports.failed("compile_error", msg, [msg], "no_modelnew: " + msg)


def time_candidate(
    candidate: RemoteCandidate,
    judged: Judged,
    job: dict[str, Any],
    notes: list[str],
    workdir: str,
    slot: TimingSlot | None = None,
) -> tuple[float | None, dict[str, Any] | None]:
    """Speedup and timing details when the job asks for them (the parent asks where the
    backend's kernels are timed: interpreted Triton on the CPU has no timing meaning),
    the details with whether the speedup is conclusive (``conclusive``). A failed timing
    is a note."""
    if not job.get("timing"):
        return None, None
    peaks = Peaks(job.get("peaks"))
    try:
        tolerances = tolerances_of(job)
        speedup, timing = timing_report(
            judged.reference_model,
            candidate,
            judged.inputs,
            judged.expected,
            job,
            lambda outputs: compare_outputs(judged.expected, outputs, tolerances),
            notes,
            slot,
            peaks,
        )
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        notes.append("timing failed: " + " | ".join(format_exception(exc, workdir)[-3:]))
        return None, None
    if timing.get("roofline") is not None:
        notes.append(peaks.note())
    peaks.leave_for_parent(workdir)
    speedup = finite(speedup)
    timing["conclusive"] = None if speedup is None else speedup_conclusive(timing["speedup_ci95"])
    return speedup, timing
