"""Analysis tools for a kernel engineer (docs/agents.md, "Tools"; docs/verifier.md, "The
roofline and profile tools"): where the machine's limit is and where the time goes.

``roofline`` counts the reference's work and least traffic at the task's shapes in the
verifier's sandbox and sets them against the machine's peaks (the node's cache, measured
where it has none): the attainable time and whether the op is memory- or compute-bound;
given a candidate, it also times it as ``time_kernel`` does and says its fraction of
speed-of-light. ``profile_kernel`` shows per-operator time of the reference and the
candidate by torch's profiler, and Nsight Compute's metrics where a GPU and ``ncu``
allow them. ``dsl_notes`` gives the task backend's notes on its DSL. A failed check or
analysis is a failed call, with the reasons as its output.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from kernelflow.projections.speedups import report_conclusive, report_interval, speedup_text
from kernelflow.tools.base import TEXT, Tool, ToolContext, ToolError, ToolLimits, arguments
from kernelflow.tools.kernel import tool_config, verdict_line, verified, verifier_limits
from kernelflow.tools.registry import register_tool
from kernelflow.verification.analysis import Analysis, profile, reference_roofline
from kernelflow.verification.backends import UnknownBackend
from kernelflow.verification.backends import backend as find_backend
from kernelflow.verification.results import untimed_reason

__all__ = ["DslNotes", "ProfileKernel", "Roofline", "operator_table", "roofline_lines"]

_OPTIONAL_CODE = arguments(
    {},
    {"code": {**TEXT, "description": "a candidate module (ModelNew) to measure as well"}},
)
PEAKS_NOTE = "roofline: "  # the judge's note on where the peaks came from (child.roofline)


def roofline_lines(limit: dict[str, Any], peaks_from: str = "") -> list[str]:
    """The roofline ``limit`` (``child.roofline.roofline``'s fields) in words."""
    lines = []
    peak_gbs, peak_gflops = float(limit["peak_gbs"]), float(limit["peak_gflops"])
    dtype = f" {limit['dtype']}" if limit.get("dtype") else ""
    lines.append(
        f"machine peaks: {peak_gbs:.1f} GB/s (a large copy), {peak_gflops:.1f} GFLOP/s "
        f"(a square{dtype} matmul)" + (f"; {peaks_from}" if peaks_from else "")
    )
    moved = float(limit["bytes"])
    if limit.get("flops") is None:
        lines.append(
            f"least traffic: {moved / 1e6:.3g} MB; torch's FLOP counter cannot follow this "
            f"reference: no roofline (memory alone takes {moved / peak_gbs / 1e6:.3g} ms)"
        )
        return lines
    flops = float(limit["flops"])
    compute_ms, memory_ms = flops / peak_gflops / 1e6, moved / peak_gbs / 1e6
    lines.append(
        f"work: {flops:.3g} FLOP; least traffic: {moved / 1e6:.3g} MB (inputs, parameters "
        f"and outputs, each once); {flops / max(moved, 1.0):.3g} FLOP per byte"
    )
    lines.append(
        f"attainable: {float(limit['attainable_ms']):.3g} ms, {limit['bound']}-bound "
        f"(compute {compute_ms:.3g} ms, memory {memory_ms:.3g} ms)"
    )
    return lines


def operator_table(title: str, rows: list[dict[str, Any]]) -> list[str]:
    """A profile's operators (``child.profiling.profile_calls``) as a small table."""
    lines = [title, f"  {'self ms':>9}  {'share':>5}  {'calls':>5}  operator"]
    lines += [
        f"  {row['self_ms']:9.4f}  {row['share']:5.0%}  {row['calls']:5.3g}  {row['name']}"
        for row in rows
    ]
    return lines if rows else [title, "  (no operators recorded)"]


def _checked(analysis: Analysis, what: str) -> None:
    """A ToolError where the job did not pass (the reference fails, the candidate
    fails its trial, the node cannot run it), or ran no analysis."""
    report = analysis.report
    if not report.passed:
        raise ToolError(verdict_line(report) + f"\n{report.feedback or report.summary}")
    if not analysis.found:
        notes = "\n".join(f"note: {note}" for note in report.errors)
        raise ToolError(f"the {what} could not be made\n{notes}".rstrip())


def _peaks_from(notes: list[str]) -> str:
    note = next((n for n in notes if n.startswith(PEAKS_NOTE)), "")
    return note.removeprefix(PEAKS_NOTE)


def _shapes(found: dict[str, Any]) -> str:
    shapes = found.get("shapes") or {}
    sizes = ", ".join(f"{k}={v}" for k, v in shapes.items())
    return f" at {sizes}" if sizes else " at the task's own sizes"


@register_tool
class Roofline(Tool):
    name = "roofline"
    description = (
        "The task's operator against the machine's limit: its floating-point work and the "
        "least bytes it moves at the task's shapes, the machine's peak bandwidth and "
        "arithmetic throughput, the attainable time and whether it is memory- or "
        "compute-bound, and eager PyTorch's time against it. Given `code`, also times "
        "that candidate as the verifier does and gives its fraction of speed-of-light."
    )
    parameters = _OPTIONAL_CODE

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return verifier_limits(600.0)  # a candidate: the rounds and a first build

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        code = args.get("code")
        if code is not None:
            return await self._of_candidate(code, ctx)
        config = tool_config(self, ctx)
        analysis = await asyncio.to_thread(
            reference_roofline, ctx.task_source, backend=ctx.backend, config=config
        )
        _checked(analysis, "roofline")
        found = analysis.found
        lines = [f"roofline of the reference{_shapes(found)} on {analysis.report.device}:"]
        lines += roofline_lines(found, _peaks_from(analysis.report.errors))
        if "sol_fraction" in found:
            lines.append(
                f"eager PyTorch (the reference) takes {found['reference_ms']:.3g} ms a call: "
                f"{found['sol_fraction']:.0%} of speed-of-light"
            )
        return "\n".join(lines)  # run_tool scrubs what a tool says

    async def _of_candidate(self, code: str, ctx: ToolContext) -> str:
        report = await verified(self, code, ctx, timing=True)
        if not report.passed:
            raise ToolError(verdict_line(report) + f"\n{report.feedback}")
        lines = [verdict_line(report)]
        if report.roofline is None or report.speedup is None:
            why = untimed_reason(report) or "torch's FLOP counter cannot follow this reference"
            notes = [f"note: {note}" for note in report.errors]
            raise ToolError("\n".join([*lines, f"no roofline: {why}", *notes]))
        limit = msgspec.structs.asdict(report.roofline)
        lines += roofline_lines(limit, _peaks_from(report.errors))
        words = speedup_text(report.speedup, report_interval(report), report_conclusive(report))
        median = report.timing.candidate_ms["median"] if report.timing else float("nan")
        lines.append(
            f"the candidate takes {median:.3g} ms a call: {limit['sol_fraction']:.0%} of "
            f"speed-of-light (speedup over eager PyTorch: {words})"
        )
        return "\n".join(lines)  # run_tool scrubs what a tool says


@register_tool
class ProfileKernel(Tool):
    name = "profile_kernel"
    description = (
        "Where the time goes at the task's shapes: the operators of the reference and, "
        "given `code`, of that candidate, by self time (torch's profiler, in the "
        "verifier's sandbox); on a GPU with Nsight Compute, the candidate's kernels' "
        "achieved DRAM bandwidth, occupancy and limiting unit."
    )
    parameters = _OPTIONAL_CODE

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return verifier_limits(600.0)  # a first build; Nsight Compute replays kernels

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        code = args.get("code")
        config = tool_config(self, ctx)
        analysis = await asyncio.to_thread(
            profile,
            ctx.task_source,
            code,
            backend=ctx.backend,
            policy=ctx.policy,
            config=config,
        )
        _checked(analysis, "profile")
        found, report = analysis.found, analysis.report
        lines = [verdict_line(report)] if code is not None else []
        calls = f"per call{_shapes(found)} on {report.device}"
        lines += operator_table(f"reference (eager PyTorch), {calls}:", found["reference"])
        if code is not None:
            if "candidate" in found:
                lines += operator_table(f"candidate, {calls}:", found["candidate"])
            lines += [note for note in report.errors if note.startswith("profile: ")]
        lines += analysis.nsight
        return "\n".join(lines)  # run_tool scrubs what a tool says


@register_tool
class DslNotes(Tool):
    name = "dsl_notes"
    description = "The task backend's notes on its kernel language: what to write and how."
    parameters = arguments({})

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        try:
            dsl = find_backend(ctx.backend)
        except UnknownBackend as exc:
            raise ToolError(str(exc)) from None
        if not dsl.dsl_notes.strip():
            raise ToolError(f"the backend {dsl.name!r} has no notes")
        return f"{dsl.name} backend notes:\n{dsl.dsl_notes.strip()}"
