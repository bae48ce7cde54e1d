"""Kernel tools for a coder: check and time a candidate before handing it to the verifier.

``compile_kernel`` runs every check that needs no execution: the module compiles, defines
``ModelNew``, and passes the verifier's static reward-hack gate. ``check_kernel`` runs the
real verifier (its sandbox, its comparison against the reference) on small shapes with
one trial and no timing: a quick signal, not the verdict of the verifier agent, which
checks the full shapes. ``time_kernel`` runs it on the task's shapes with the verifier's
own timing (the node's timing slots, the daemon's extension cache and threads): the
speedup with its interval and whether it is conclusive, and the fraction of
speed-of-light (docs/verifier.md, "Speed-of-light"). A failed check is a failed call,
with the reasons as its output.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from kernelflow.events.model import VerificationReport
from kernelflow.projections.speedups import report_conclusive, report_interval, speedup_text
from kernelflow.tools.base import TEXT, Tool, ToolContext, ToolError, ToolLimits, arguments
from kernelflow.tools.registry import register_tool
from kernelflow.verification.engine import VerifierConfig, verify
from kernelflow.verification.gate import check_candidate
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.verification.results import roofline_text, untimed_reason
from kernelflow.verification.shapes import SizeBudget
from kernelflow.verification.taskfile import CandidateError, check_candidate_source

__all__ = [
    "CHECK_BUDGET",
    "CheckKernel",
    "CompileKernel",
    "TimeKernel",
    "static_problems",
    "tool_config",
    "verdict_line",
    "verified",
    "verifier_limits",
]

# On the CPU, check_kernel checks much smaller shapes than the verifier: it is an agent's
# quick look, not the verdict.
CHECK_BUDGET = SizeBudget(max_dim=64, max_elements=1 << 16, max_work=1 << 18, long_dim=1 << 12)

_CODE = arguments({"code": {**TEXT, "description": "the whole candidate module"}})


def static_problems(
    code: str, backend: str, task_source: str = "", policy: str = DEFAULT_POLICY
) -> list[str]:
    """Why ``code`` cannot be a candidate under ``policy``, found without running it
    (empty: none)."""
    try:
        check_candidate_source(code)
        # compile() also reports what parsing accepts (`return` outside a function...).
        compile(code, "candidate.py", "exec", dont_inherit=True)
    except (CandidateError, SyntaxError, ValueError) as exc:
        return [str(exc)]
    violations = check_candidate(code, backend=backend, task_source=task_source, policy=policy)
    return [f"static check: {v.text()}" for v in violations]


@register_tool
class CompileKernel(Tool):
    name = "compile_kernel"
    description = (
        "Check a candidate kernel module without running it: it must compile, define "
        "class ModelNew, and pass the verifier's static rules (the kernel does the work: "
        "no PyTorch compute in forward, no fallbacks, no caching)."
    )
    parameters = _CODE

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        problems = static_problems(args["code"], ctx.backend, ctx.task_source, ctx.policy)
        if problems:
            raise ToolError("\n".join(problems))
        return "ok: the module compiles, defines ModelNew and passes the static rules"


@register_tool
class CheckKernel(Tool):
    name = "check_kernel"
    description = (
        "Run a candidate kernel module against the task's reference in the verifier's "
        "sandbox, on small shapes with one trial and no timing; shows the verdict and what "
        "went wrong. Passing here does not guarantee passing the full verification."
    )
    parameters = _CODE

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return verifier_limits(240.0)  # interpreted Triton on the CPU is slow

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        report = await verified(self, args["code"], ctx, timing=False, cpu_budget=CHECK_BUDGET)
        text = verdict_line(report) + f"\n{report.feedback}"
        if not report.passed:
            raise ToolError(text)
        return text


@register_tool
class TimeKernel(Tool):
    name = "time_kernel"
    description = (
        "Check a candidate kernel module on the task's shapes and time it against the "
        "reference as the verifier does: the speedup with its 95 % interval (and whether "
        "the machine let it say anything), and how close the kernel comes to the machine's "
        "speed-of-light (memory- or compute-bound, the attainable time)."
    )
    parameters = _CODE

    @classmethod
    def default_limits(cls) -> ToolLimits:
        return verifier_limits(600.0)  # the task's shapes, the rounds, a first build

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        report = await verified(self, args["code"], ctx, timing=True)
        if not report.passed:
            raise ToolError(verdict_line(report) + f"\n{report.feedback}")
        lines = [verdict_line(report)]
        if report.speedup is None:
            lines.append(untimed_reason(report) or "not timed")
            lines += [f"note: {note}" for note in report.errors]
        else:
            words = speedup_text(report.speedup, report_interval(report), report_conclusive(report))
            baseline = report.timing.baseline if report.timing else "eager"
            lines.append(f"speedup over {baseline} PyTorch: {words}")
            if report.roofline is not None:
                lines.append(roofline_text(report.roofline))
        return "\n".join(lines)


async def verified(tool: Tool, code: str, ctx: ToolContext, **fields: Any) -> VerificationReport:
    """The verifier's report on ``code``: one trial, within the tool's limits, with the
    daemon's verifier configuration (``ToolContext.verifier``) and ``fields`` over it."""
    config = tool_config(tool, ctx, **fields)
    return await asyncio.to_thread(
        verify, ctx.task_source, code, backend=ctx.backend, policy=ctx.policy, config=config
    )


def tool_config(tool: Tool, ctx: ToolContext, **fields: Any) -> VerifierConfig:
    """The verifier configuration a kernel tool's job runs under: the daemon's
    (``ToolContext.verifier``), one trial, the tool's limits, and ``fields`` over it;
    a ToolError where the task has no reference to check against."""
    if not ctx.task_source:
        raise ToolError(f"{tool.name} needs a kernel task: this task has no reference model")
    return dataclasses.replace(
        ctx.verifier or VerifierConfig(),
        timeout_s=tool.limits.work_timeout_s,
        memory_mb=tool.limits.memory_mb or VerifierConfig.memory_mb,
        trials=1,
        **fields,
    )


def verifier_limits(timeout_s: float) -> ToolLimits:
    """A tool that runs the verifier: its time, and the verifier's memory limit."""
    return ToolLimits(
        timeout_s=timeout_s, max_output_chars=8000, memory_mb=VerifierConfig.memory_mb
    )


def verdict_line(report: VerificationReport) -> str:
    where = f" on {report.device}" if report.device else ""
    return f"verdict: {report.verdict}{where} in {report.duration_s:.1f} s"
