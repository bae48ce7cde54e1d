"""The analysis tools' parts that run no process (docs/verifier.md, "The machine's peaks"
and "The roofline and profile tools"): their arguments and errors, the node's peaks
cache, Nsight Compute's command line and the parsing of its CSV, the roofline in words,
and the bounds on what the candidate's process claims of its profile."""

from __future__ import annotations

import asyncio
import json
import math
import socket
from pathlib import Path

import pytest

from kernelflow.tools import argument_errors, make_tool
from kernelflow.tools.analysis import DslNotes, ProfileKernel, Roofline, roofline_lines
from kernelflow.tools.base import ToolContext, ToolError
from kernelflow.verification.backends import backend
from kernelflow.verification.child.channel import Channel
from kernelflow.verification.child.profiling import NVTX_RANGE, TOP_OPERATORS
from kernelflow.verification.child.remote import RemoteCandidate
from kernelflow.verification.nsight import NCU_LOG, ncu_command, ncu_lines, parse_ncu_csv
from kernelflow.verification.peaks import CACHE_FILE, cached_peaks, peaks_key, record_peaks

NO_TASK = ToolContext(task_id="t", agent="engineer", backend="cpp")


@pytest.mark.parametrize("tool", [Roofline, ProfileKernel])
def test_code_is_optional_but_never_empty_nor_anything_else(tool: type) -> None:
    made = tool()
    assert argument_errors(made, {}) is None
    assert argument_errors(made, {"code": "class ModelNew: ..."}) is None
    assert "should be non-empty" in str(argument_errors(made, {"code": ""}))
    assert "Additional properties" in str(argument_errors(made, {"source": "x"}))
    assert made.limits.timeout_s == 600.0 and made.limits.memory_mb


@pytest.mark.parametrize("tool", ["roofline", "profile_kernel"])
def test_a_task_without_a_reference_is_an_observation_not_a_crash(tool: str) -> None:
    with pytest.raises(ToolError, match=f"{tool} needs a kernel task"):
        asyncio.run(make_tool(tool).run({}, NO_TASK))


def test_dsl_notes_are_the_task_backends() -> None:
    said = asyncio.run(DslNotes().run({}, NO_TASK))
    assert said == f"cpp backend notes:\n{backend('cpp').dsl_notes.strip()}"
    with pytest.raises(ToolError, match="'fortran'"):
        asyncio.run(DslNotes().run({}, ToolContext(task_id="t", agent="e", backend="fortran")))
    assert "Additional properties" in str(argument_errors(DslNotes(), {"code": "x"}))


def test_the_roofline_in_words() -> None:
    limit = {
        "flops": 2e9,
        "bytes": 1.2e7,
        "peak_gbs": 10.0,
        "peak_gflops": 100.0,
        "attainable_ms": 20.0,
        "bound": "compute",
        "dtype": "float32",
    }
    peaks, work, attainable = roofline_lines(limit, "measured now")
    assert peaks == (
        "machine peaks: 10.0 GB/s (a large copy), 100.0 GFLOP/s (a square float32 matmul); "
        "measured now"
    )
    assert (
        work.startswith("work: 2e+09 FLOP; least traffic: 12 MB ") and "167 FLOP per byte" in work
    )
    assert attainable == "attainable: 20 ms, compute-bound (compute 20 ms, memory 1.2 ms)"
    uncounted = roofline_lines({**limit, "flops": None})
    assert "FLOP counter cannot follow this reference: no roofline (memory alone" in uncounted[-1]


# --------------------------------------------------------------------------- peaks cache

KEY = peaks_key("cpu", None, 2, [0, 1, 2, 5])


def test_the_key_names_what_changes_the_figures() -> None:
    assert KEY.endswith(" cpu threads=2 cores=0-2,5")
    assert peaks_key("cuda", "1", 8, [0]) != peaks_key("cuda", "0", 8, [0])
    assert peaks_key("cpu", None, 1, [0, 1]) != peaks_key("cpu", None, 2, [0, 1])


def test_what_a_judge_measured_is_merged_into_the_cache(tmp_path: Path) -> None:
    node, job = tmp_path / "timing", tmp_path / "job"
    job.mkdir()
    assert cached_peaks(node, KEY) == {}
    record_peaks(node, KEY, job)  # the judge measured nothing: nothing written
    assert not (node / CACHE_FILE).exists()
    (job / "peaks.json").write_text(
        json.dumps({"copy_gbs": 12.5, "matmul_gflops": {"float32": 80}})
    )
    record_peaks(node, KEY, job)
    (job / "peaks.json").write_text(json.dumps({"matmul_gflops": {"float64": 40.0}}))
    record_peaks(node, KEY, job)  # a later job in another dtype: added, the rest kept
    assert cached_peaks(node, KEY) == {
        "copy_gbs": 12.5,
        "matmul_gflops": {"float32": 80.0, "float64": 40.0},
    }
    assert cached_peaks(node, peaks_key("cpu", None, 1, [0])) == {}


@pytest.mark.parametrize(
    "corrupt",
    [
        "{not json",
        "[1, 2]",
        json.dumps({KEY: "fast"}),
        json.dumps({KEY: {"copy_gbs": -3, "matmul_gflops": {"float32": "80"}}}),
        json.dumps({KEY: {"copy_gbs": math.inf, "matmul_gflops": {"float32": True}}}),
    ],
)
def test_a_corrupt_cache_counts_as_empty_and_is_replaced(tmp_path: Path, corrupt: str) -> None:
    (tmp_path / CACHE_FILE).write_text(corrupt)
    assert cached_peaks(tmp_path, KEY) == {}
    job = tmp_path / "job"
    job.mkdir()
    (job / "peaks.json").write_text(json.dumps({"copy_gbs": 9.0, "matmul_gflops": {"float32": 50}}))
    record_peaks(tmp_path, KEY, job)
    assert cached_peaks(tmp_path, KEY) == {"copy_gbs": 9.0, "matmul_gflops": {"float32": 50.0}}


def test_implausible_figures_from_a_job_are_not_cached(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "peaks.json").write_text('{"copy_gbs": NaN, "matmul_gflops": {"float32": 0}}')
    record_peaks(tmp_path, KEY, job)
    assert cached_peaks(tmp_path, KEY) == {}


# --------------------------------------------------------------------------- Nsight Compute

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
    '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
    '"Metric Value"'
)


def row(launch: int, kernel: str, section: str, metric: str, unit: str, value: str) -> str:
    cells = [str(launch), "4242", "python3", "127.0.0.1", kernel, "1", "7", "(256, 1, 1)"]
    cells += ["(4096, 1, 1)", "0", "9.0", section, metric, unit, value]
    return ",".join(f'"{cell}"' for cell in cells)


SOL = "GPU Speed Of Light Throughput"
FUSED = "void gelu_kernel<float>(const float *, float *, long)"  # commas inside the quotes
SLOW = "slow_kernel(float *)"
SAMPLE = "\n".join(
    [
        "==PROF== Connected to process 4242 (/usr/bin/python3.11)",
        "==WARNING== Found outstanding GPU clock reset, trying to revert...Success.",
        HEADER,
        row(0, FUSED, SOL, "DRAM Frequency", "Ghz", "2.62"),
        row(0, FUSED, SOL, "Duration", "usecond", "40.00"),
        row(0, FUSED, SOL, "DRAM Throughput", "%", "88.00"),
        row(0, FUSED, SOL, "Memory Throughput", "%", "90.00"),
        row(0, FUSED, SOL, "Compute (SM) Throughput", "%", "20.00"),
        row(0, FUSED, SOL, "", "", ""),  # a rule's row: no metric
        row(0, FUSED, "Occupancy", "Achieved Occupancy", "%", "80.00"),
        row(1, FUSED, SOL, "Duration", "usecond", "44.00"),
        row(1, FUSED, SOL, "DRAM Throughput", "%", "90.00"),
        row(1, FUSED, SOL, "Memory Throughput", "%", "92.00"),
        row(1, FUSED, SOL, "Compute (SM) Throughput", "%", "22.00"),
        row(1, FUSED, "Occupancy", "Achieved Occupancy", "%", "84.00"),
        row(2, SLOW, SOL, "Duration", "msecond", "1,250.5"),
        row(2, SLOW, SOL, "DRAM Throughput", "%", "3.10"),
        row(2, SLOW, SOL, "Memory Throughput", "%", "12.00"),
        row(2, SLOW, SOL, "Compute (SM) Throughput", "%", "7.50"),
        row(2, SLOW, "Occupancy", "Achieved Occupancy", "%", "n/a"),
        "==PROF== Disconnected from process 4242",
    ]
)


def test_ncu_csv_is_read_per_kernel_averaged_over_its_launches() -> None:
    fused, slow = parse_ncu_csv(SAMPLE)
    assert (fused.name, fused.launches, slow.name, slow.launches) == (FUSED, 2, SLOW, 1)
    assert fused.metrics["Duration"] == pytest.approx(42.0)  # microseconds
    assert fused.metrics["DRAM Throughput"] == pytest.approx(89.0)
    assert fused.metrics["Achieved Occupancy"] == pytest.approx(82.0)
    assert fused.limit == "memory"
    assert slow.metrics["Duration"] == pytest.approx(1_250_500.0)  # 1,250.5 ms
    assert "Achieved Occupancy" not in slow.metrics  # "n/a" is no figure
    assert slow.limit.startswith("latency (no unit above 60 % of its peak")
    # The Speed Of Light section's percentages are the breakdown by unit (not the clock).
    assert list(fused.sol) == ["DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput"]


def test_ncu_lines_put_the_longest_kernel_first() -> None:
    slow, fused = ncu_lines(parse_ncu_csv(SAMPLE))
    assert slow.startswith(f"{SLOW} (1 launch(es), 1250500.0 us each); DRAM bandwidth 3 % ")
    assert fused == (
        f"{FUSED} (2 launch(es), 42.0 us each); DRAM bandwidth 89 % of peak; achieved "
        "occupancy 82 %; speed-of-light: DRAM Throughput 89 %, Memory Throughput 91 %, "
        "Compute (SM) Throughput 21 %; limited by memory"
    )
    assert parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - no permission\n") == []


def test_ncu_profiles_the_candidates_range_only_into_the_jobs_log() -> None:
    command = ncu_command("/opt/nvidia/ncu")
    assert command[0] == "/opt/nvidia/ncu" and "--csv" in command
    assert command[command.index("--nvtx-include") + 1] == f"{NVTX_RANGE}/"
    assert command[command.index("--log-file") + 1] == NCU_LOG
    assert command[command.index("--page") + 1] == "details"


# --------------------------------------------------------------------------- candidate's claims


def test_the_candidates_profile_is_a_claim_bounded_before_anyone_reads_it() -> None:
    judge_end, candidate_end = socket.socketpair()
    with judge_end, candidate_end:
        hostile = [
            {"name": "x" * 10_000, "self_ms": math.inf, "calls": "many", "share": [1]},
            "not a row",
            *({"name": f"op{i}", "self_ms": 0.5, "calls": 2, "share": 0.1} for i in range(50)),
        ]
        # Its answer, queued before the request it answers (the channel is a socket).
        Channel(candidate_end, 1 << 20).send({"ok": True, "operators": hostile})
        remote = RemoteCandidate(Channel(judge_end, 1 << 20), 0, Path("/nonexistent"), -1)
        rows = remote.profile(10)
        request, _ = Channel(candidate_end, 1 << 20).receive()
    assert request == {"op": "profile", "calls": 10}
    assert len(rows) == TOP_OPERATORS - 1  # at most TOP_OPERATORS rows read, one not a row
    assert rows[0] == {"name": "x" * 120, "self_ms": 0.0, "calls": 0.0, "share": 0.0}
    assert rows[1] == {"name": "op0", "self_ms": 0.5, "calls": 2.0, "share": 0.1}
