"""The roofline a timed verdict carries (docs/verifier.md, "Speed-of-light") as the rest of
kernelflow reads it: the events, the metrics fold, the ``sol@1`` reward, what ``verify``
prints. The measuring side is tests/sandbox/test_roofline.py and, through the real
verifier, tests/integration/test_verifier_cpp.py."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from kernelflow.actors.readmodel_client import status_row
from kernelflow.cli.commands.verify import verdict_text
from kernelflow.cli.ui.data import TaskRows
from kernelflow.cli.ui.list_pages import task_list_fragment
from kernelflow.cli.ui.task_page import task_fragment
from kernelflow.events.codec import decode_event, encode
from kernelflow.events.model import (
    AgentDispatched,
    Event,
    Roofline,
    TaskFinished,
    TaskSubmitted,
    TimingStats,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.benchmark import (
    BENCH_FAST_P,
    benchmark_card,
    problem_result,
    run_summary,
)
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.render import row_speedup_text, summary
from kernelflow.projections.report import bench_text, task_table
from kernelflow.projections.rewards import RewardInput, get_reward, reward_events
from kernelflow.projections.search import SearchDatabase
from kernelflow.projections.task_state import fold

LIMIT = Roofline(
    flops=0.0,
    bytes=2_097_152.0,
    peak_gbs=12.3,
    peak_gflops=167.0,
    attainable_ms=0.17,
    bound="memory",
    sol_fraction=0.44,
)
PASSED = VerificationReport(
    verdict="pass",
    summary="all 2 trial(s) match the reference",
    device="cpu",
    backend="cpp",
    speedup=2.5,
    speedup_conclusive=True,
    timing=TimingStats(
        speedups={"eager": 2.5},
        speedup_ci95=[2.2, 2.8],
        candidate_ms={"median": 0.386},
        baseline_ms={"median": 0.965},
        roofline=LIMIT,
    ),
)


def checked(report: VerificationReport = PASSED) -> VerificationCompleted:
    return VerificationCompleted(
        task_id="t", seq=3, agent="verifier", dispatch_id="d", code="x", report=report
    )


def test_the_roofline_round_trips_and_older_reports_read_without_one() -> None:
    again = decode_event(encode(checked()))
    assert isinstance(again, VerificationCompleted)
    assert again.report.roofline == LIMIT and again.report.sol_fraction == 0.44
    raw = msgspec.json.decode(encode(checked()))
    del raw["report"]["timing"]["roofline"]  # recorded before the field
    old = decode_event(msgspec.json.encode(raw))
    assert isinstance(old, VerificationCompleted)
    assert old.report.roofline is None and old.report.sol_fraction is None


def test_sol_rewards_a_passing_kernels_fraction_of_speed_of_light_at_most_1() -> None:
    sol = get_reward("sol")
    assert sol.key == "sol@1"
    passed = RewardInput(status="success", verdict="pass", sol_fraction=0.44)
    assert sol(passed) == pytest.approx(0.44)
    assert sol(msgspec.structs.replace(passed, sol_fraction=1.3)) == 1.0  # counts missed work
    assert sol(msgspec.structs.replace(passed, sol_fraction=None)) == 0.0  # nothing timed
    assert sol(RewardInput(status="failed", verdict="mismatch", sol_fraction=0.9)) == 0.0
    assert passed.to_dict()["sol_fraction"] == 0.44


def started(**fields: Any) -> list[Event]:
    """A task of the gelu problem submitted (with ``fields``) and its verifier dispatched."""
    submitted = TaskSubmitted(
        task_id="t",
        seq=1,
        task_name="gelu",
        task_source="x",
        workflow_name="default",
        workflow_yaml="x: 1",
        backend="cpp",
        group_id="g",
        **fields,
    )
    return [
        submitted,
        AgentDispatched(task_id="t", seq=2, agent="verifier", step=1, dispatch_id="d"),
    ]


def test_the_fold_and_the_recorded_rewards_take_the_last_verifications_fraction() -> None:
    submitted, dispatched = started(rewards=["sol@1"])
    finished = TaskFinished(
        task_id="t", seq=4, status="success", reason="r", verdict="pass", speedup=2.5
    )
    history = [submitted, dispatched, checked()]
    folded = MetricsProjection().apply_all(enumerate([*history, finished], 1))
    t = folded.tasks["t"]
    assert t.final_sol_fraction == 0.44 and t.outcome().sol_fraction == 0.44
    (recorded,) = reward_events(fold("t", history), finished)
    assert (recorded.reward_fn, recorded.value) == ("sol", pytest.approx(0.44))
    # status, from the read model's row and from the fold: beside the speedup.
    assert row_speedup_text(status_row(t)) == "2.50x; 44% of speed-of-light"
    assert summary(fold("t", [*history, finished]))["sol_fraction"] == 0.44
    table = task_table([t], {})  # the report's task table
    assert table.rows[0][table.headers.index("sol")] == "44.0%"
    page = task_fragment("t", [*history, finished])  # the dashboard's task page
    assert "44% of speed-of-light (memory)" in page  # the verification's line
    assert "<dt>speed-of-light</dt><dd>44%</dd>" in page  # the task's facts


def test_verify_prints_the_fraction_under_the_timing() -> None:
    text = verdict_text(PASSED)
    assert "\n  speed-of-light: 44% (memory-bound: 0.17 ms attainable for 0 FLOP and 2.1 MB" in text


def test_the_bench_card_and_the_dashboards_lists_show_the_fraction() -> None:
    submitted, dispatched = started()
    finished = TaskFinished(
        task_id="t", seq=4, status="success", reason="r", verdict="pass", speedup=2.5,
        final_code="x",
    )  # fmt: skip
    db = SearchDatabase(None).apply_all([submitted, dispatched, checked(), finished])
    result = problem_result("gelu", db)
    assert result.sol_fraction == 0.44 and result.to_dict()["sol_fraction"] == 0.44
    card = benchmark_card({"gelu": db}, [result])
    assert card["timings"][0]["roofline"]["bound"] == "memory"
    text = bench_text("r1", [result], run_summary([result], BENCH_FAST_P), card)
    header, _, row = text.splitlines()[1:4]
    assert "sol" in header.split() and "44.0%" in row.split()
    assert "; 44% of speed-of-light (memory-bound: 0.17 ms at 12 GB/s, 167 GFLOP/s)" in text
    # The dashboard's task list, from a read model row, and a group's rollouts.
    t = MetricsProjection().apply_all(enumerate([submitted, dispatched, checked(), finished], 1))
    rows = TaskRows(rows=[status_row(t.tasks["t"])], source="test")
    page = task_list_fragment(rows, "", "")
    assert "<th>sol</th>" in page and "<td>44%</td>" in page
