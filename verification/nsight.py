"""Nsight Compute's key metrics of a candidate's kernels, for the coder's ``profile_kernel``
on a GPU (docs/verifier.md, "The roofline and profile tools").

Where the device is a CUDA GPU and ``ncu`` is on PATH, the profile job's sandbox process
runs under ``ncu`` (:func:`ncu_command`), which profiles the kernels the candidate's
process launches inside its NVTX range (``child.profiling.NVTX_RANGE``: the profiled
calls, never the reference's), with the Speed Of Light and Occupancy sections, and writes
them as CSV (its ``details`` page) to ``ncu.csv`` in the job's work dir. :func:`parse_ncu_csv`
reads that file and :func:`ncu_lines` says, per kernel, the achieved DRAM bandwidth, the
achieved occupancy, the units' throughputs and the one that limits it.

Parent side: no torch.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

from kernelflow.verification.child.profiling import NVTX_RANGE

__all__ = ["NCU_LOG", "KernelMetrics", "ncu_command", "ncu_lines", "parse_ncu_csv"]

NCU_LOG = "ncu.csv"  # in the job's work dir (the sandbox process's working dir)
MAX_KERNELS = 20  # launches ncu profiles (each is replayed for every section's counters)
SHOWN_KERNELS = 5
SOL_SECTION = "GPU Speed Of Light Throughput"
DRAM = "DRAM Throughput"
MEMORY = "Memory Throughput"
COMPUTE = "Compute (SM) Throughput"
OCCUPANCY = "Achieved Occupancy"
DURATION = "Duration"
# A unit under this share of its peak limits nothing: the kernel waits (latency-bound).
BUSY_PCT = 60.0
_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def ncu_command(ncu: str) -> tuple[str, ...]:
    """The command line the sandbox process runs under: ``ncu`` at path ``ncu``."""
    return (
        ncu,
        "--csv",
        "--page",
        "details",
        "--section",
        "SpeedOfLight",
        "--section",
        "Occupancy",
        "--nvtx",
        "--nvtx-include",
        f"{NVTX_RANGE}/",
        "--target-processes",
        "all",
        "--launch-count",
        str(MAX_KERNELS),
        "--log-file",
        NCU_LOG,
    )


@dataclass
class KernelMetrics:
    """One kernel's metrics, averaged over its profiled launches: by metric name, the
    value (percentages in %, durations in microseconds); and the Speed Of Light section's
    percentages (the breakdown by unit)."""

    name: str
    launches: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    sol: dict[str, float] = field(default_factory=dict)

    @property
    def limit(self) -> str:
        """The unit that limits the kernel, in words."""
        memory, compute = self.metrics.get(MEMORY, 0.0), self.metrics.get(COMPUTE, 0.0)
        if max(memory, compute) < BUSY_PCT:
            return (
                f"latency (no unit above {BUSY_PCT:.0f} % of its peak: too little "
                "parallelism, or waiting on memory)"
            )
        return "memory" if memory >= compute else "compute (SM)"


def parse_ncu_csv(text: str) -> list[KernelMetrics]:
    """The kernels of ``ncu --csv --page details`` output, in the order first launched.
    Lines ncu prints about itself (``==PROF==``, ``==WARNING==``) and rows that are not
    metrics (rule results, values that are not numbers) are skipped."""
    rows = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    kernels: dict[str, KernelMetrics] = {}
    sums: dict[tuple[str, str, bool], list[float]] = {}
    launches: dict[str, set[str]] = {}
    for row in csv.DictReader(rows):
        name, metric = row.get("Kernel Name") or "", row.get("Metric Name") or ""
        value = _number(row.get("Metric Value") or "")
        if not name or not metric or value is None:
            continue
        unit = (row.get("Metric Unit") or "").strip()
        if metric == DURATION:
            value *= _TO_US.get(unit, 1.0)
        kernels.setdefault(name, KernelMetrics(name))
        launches.setdefault(name, set()).add(row.get("ID") or "")
        in_sol = row.get("Section Name") == SOL_SECTION and unit == "%"
        sums.setdefault((name, metric, in_sol), []).append(value)
    for (name, metric, in_sol), values in sums.items():
        kernel = kernels[name]
        kernel.metrics[metric] = sum(values) / len(values)
        if in_sol:
            kernel.sol[metric] = kernel.metrics[metric]
    for name, ids in launches.items():
        kernels[name].launches = len(ids)
    return list(kernels.values())


def ncu_lines(kernels: list[KernelMetrics]) -> list[str]:
    """What the coder reads of ``kernels``: the longest first, a line each."""
    ordered = sorted(kernels, key=lambda k: k.metrics.get(DURATION, 0.0), reverse=True)
    lines = []
    for kernel in ordered[:SHOWN_KERNELS]:
        m = kernel.metrics
        said = [f"{kernel.name[:80]} ({kernel.launches} launch(es)"]
        if DURATION in m:
            said[0] += f", {m[DURATION]:.1f} us each"
        said[0] += ")"
        if DRAM in m:
            said.append(f"DRAM bandwidth {m[DRAM]:.0f} % of peak")
        if OCCUPANCY in m:
            said.append(f"achieved occupancy {m[OCCUPANCY]:.0f} %")
        breakdown = ", ".join(f"{unit} {pct:.0f} %" for unit, pct in kernel.sol.items())
        if breakdown:
            said.append(f"speed-of-light: {breakdown}")
        said.append(f"limited by {kernel.limit}")
        lines.append("; ".join(said))
    if len(ordered) > SHOWN_KERNELS:
        lines.append(f"(and {len(ordered) - SHOWN_KERNELS} more kernels)")
    return lines


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None
