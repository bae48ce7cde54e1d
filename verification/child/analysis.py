"""The analyses a coder's tools ask the judge for (docs/verifier.md, "The roofline and
profile tools"). A job with ``analysis`` set checks as any job does (the reference alone,
or the candidate too), ending on the task's shapes, then:

``roofline``
    the reference's work and least traffic (:mod:`.roofline`), the machine's peaks (the
    node's cached ones, what they lack measured here in a timing slot), the attainable
    time, the bound, and eager PyTorch's own time against it;
``profile``
    per-operator time of the reference (in the judge's process) and of the candidate (in
    its own, on request: :meth:`.remote.RemoteCandidate.profile`) by torch's profiler.

What it finds goes to ``WORKDIR/analysis.json``, which the parent reads (the candidate's
process never sees that dir).

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

from kernelflow.verification.child.device import cold_copies, synchronize
from kernelflow.verification.child.judge import Judged
from kernelflow.verification.child.loading import clone
from kernelflow.verification.child.profiling import PROFILE_CALLS, profile_calls
from kernelflow.verification.child.remote import CandidateDied, CandidateRaised, RemoteCandidate
from kernelflow.verification.child.report import VerificationFailure
from kernelflow.verification.child.roofline import (
    Peaks,
    count_flops,
    dtype_name,
    float_dtype,
    moved_bytes,
    roofline,
)
from kernelflow.verification.child.slot import TimingSlot

__all__ = ["ANALYSIS_FILE", "analyse"]

ANALYSIS_FILE = "analysis.json"
REFERENCE_CALLS = 5  # the reference's best call is its time against the roofline


def analyse(
    kind: str,
    judged: Judged,
    candidate: RemoteCandidate | None,
    job: dict[str, Any],
    notes: list[str],
    workdir: str,
    slot: TimingSlot,
) -> None:
    """Run the analysis ``kind`` ("roofline"; else "profile") on what the judge's last
    trial ran (the task's shapes) and leave it in ``WORKDIR/analysis.json``. The candidate
    failing in it is a note (and no candidate table): its verdict is the trials'."""
    device = str(job.get("device") or "cpu")
    found: dict[str, Any] = {"shapes": judged.shapes[0] if judged.shapes else {}}
    with slot.held(notes):
        if kind == "roofline":
            found.update(_reference_roofline(judged, job, notes, workdir, device))
        else:
            found["reference"] = _profile_reference(judged, device, workdir)
            if candidate is not None:
                try:
                    candidate.stage(judged.inputs)
                    found["candidate"] = candidate.profile(PROFILE_CALLS)
                except (CandidateRaised, CandidateDied, VerificationFailure) as exc:
                    notes.append(f"profile: the candidate failed under the profiler: {exc}")
    Path(workdir, ANALYSIS_FILE).write_text(json.dumps(found))


def _profile_reference(judged: Judged, device: str, workdir: str) -> list[dict[str, Any]]:
    """The reference's operators, its calls taking copies of the inputs in turn as the
    candidate's do (:meth:`.remote.RemoteCandidate.stage`)."""
    ref, copies = judged.reference_model, cold_copies(clone(judged.inputs), device)
    turn = itertools.count()
    return profile_calls(
        lambda: ref(*copies[next(turn) % len(copies)]), device, PROFILE_CALLS, workdir=workdir
    )


def _reference_roofline(
    judged: Judged, job: dict[str, Any], notes: list[str], workdir: str, device: str
) -> dict[str, Any]:
    import torch

    ref, inputs = judged.reference_model, judged.inputs
    peaks = Peaks(job.get("peaks"))
    dtype = float_dtype(inputs)
    bandwidth, compute = peaks.bandwidth(device), peaks.gflops(device, dtype)
    notes.append(peaks.note())
    peaks.leave_for_parent(workdir)
    copies = cold_copies(clone(inputs), device)
    best = float("inf")
    with torch.no_grad():
        for turn in range(REFERENCE_CALLS):
            started = time.perf_counter()
            ref(*copies[turn % len(copies)])
            synchronize(device)
            best = min(best, time.perf_counter() - started)
    flops = count_flops(ref, inputs)
    moved = moved_bytes(ref, inputs, judged.expected)
    found: dict[str, Any] = {"dtype": dtype_name(dtype), "reference_ms": best * 1000}
    if flops is None:
        return {**found, "bytes": moved, "peak_gbs": bandwidth, "peak_gflops": compute}
    return {**found, **roofline(flops, moved, bandwidth, compute, best * 1000)}
