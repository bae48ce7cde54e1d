"""The analyses behind a coder's ``roofline`` and ``profile_kernel`` (docs/verifier.md,
"The roofline and profile tools"), run in the verifier's sandbox as a verification is:
the same job, confinement and timing slots, with an analysis the judge runs after the
trials (:mod:`.child.analysis`). Without a candidate, the job only runs the reference
(:func:`~.engine.check_reference`); with one, it is checked as in a verification, on one
trial and untimed, before it is profiled.

Parent side: no torch.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelflow.events.model import VerificationReport
from kernelflow.verification.child.analysis import ANALYSIS_FILE
from kernelflow.verification.engine import (
    DEFAULT_CONFIG,
    VerifierConfig,
    check_reference,
    checking_device,
    verify,
)
from kernelflow.verification.nsight import NCU_LOG, ncu_command, ncu_lines, parse_ncu_csv

__all__ = ["Analysis", "profile", "reference_roofline"]


@dataclass(frozen=True)
class Analysis:
    """A job's verdict (the reference ran; the candidate passed its trial) and what the
    judge found (``child.analysis``: empty where the job ended before it ran)."""

    report: VerificationReport
    found: dict[str, Any] = field(default_factory=dict)
    # Nsight Compute's lines on the candidate's kernels, or the one line saying why none.
    nsight: list[str] = field(default_factory=list)


def reference_roofline(
    task_source: str, *, backend: str, config: VerifierConfig = DEFAULT_CONFIG
) -> Analysis:
    """The reference's roofline at the task's shapes: its FLOPs and least bytes, the
    machine's peaks (the node's cache; measured where it has none), the attainable time
    and the bound, and the reference's own time."""
    found: dict[str, Any] = {}
    config = dataclasses.replace(config, analysis="roofline", on_workdir=_reader(found))
    report = check_reference(task_source, backend=backend, config=config)
    return Analysis(report, found)


def profile(
    task_source: str,
    candidate_source: str | None,
    *,
    backend: str,
    policy: str,
    config: VerifierConfig = DEFAULT_CONFIG,
) -> Analysis:
    """Per-operator time of the reference and (given one) the candidate at the task's
    shapes, by torch's profiler; on a CUDA GPU with ``ncu`` on PATH, Nsight Compute's
    metrics of the candidate's kernels too (the job then runs in a fresh process under
    ``ncu``)."""
    found: dict[str, Any] = {}
    ncu = shutil.which("ncu")
    why_not = _nsight_unavailable(checking_device(config), ncu, candidate_source)
    nsight: list[str] = [why_not] if why_not else []
    wrapper: tuple[str, ...] = ()
    if ncu is not None and not why_not:
        wrapper = ncu_command(ncu)
    read_analysis = _reader(found)

    def read(workdir: Path) -> None:
        read_analysis(workdir)
        if wrapper:
            nsight.extend(_nsight_lines(workdir / NCU_LOG))

    config = dataclasses.replace(
        config,
        analysis="profile",
        on_workdir=read,
        timing=False,
        wrapper=wrapper,
        warm=config.warm and not wrapper,  # ncu starts the process it profiles
    )
    if candidate_source is None:
        report = check_reference(task_source, backend=backend, config=config)
    else:
        report = verify(
            task_source, candidate_source, backend=backend, policy=policy, config=config
        )
    return Analysis(report, found, nsight)


def _reader(found: dict[str, Any]) -> Callable[[Path], None]:
    """What reads the judge's ``analysis.json`` from a job's work dir into ``found``."""

    def read(workdir: Path) -> None:
        try:
            data = json.loads((workdir / ANALYSIS_FILE).read_text())
        except (OSError, ValueError):  # the job ended before its analysis
            return
        if isinstance(data, dict):
            found.update(data)

    return read


def _nsight_unavailable(device: str, ncu: str | None, candidate_source: str | None) -> str:
    """Why Nsight Compute cannot profile here, in one line ("": it can)."""
    if candidate_source is None:
        return ""
    if device != "cuda":
        return (
            "Nsight Compute: not available here (no CUDA GPU: the kernels run on the CPU, "
            "where only torch's profiler applies)"
        )
    if ncu is None:
        return "Nsight Compute: not available here (no `ncu` on PATH)"
    return ""


def _nsight_lines(log: Path) -> list[str]:
    """Nsight Compute's lines from its CSV log, or why there are none."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ["Nsight Compute: ran, but wrote no report"]
    kernels = parse_ncu_csv(text)
    if kernels:
        return ["Nsight Compute:", *ncu_lines(kernels)]
    said = next((ln for ln in text.splitlines() if "ERR" in ln or "rror" in ln), "")
    return [f"Nsight Compute: no kernel metrics{f' ({said.strip()[:200]})' if said else ''}"]
