"""Timings that say what they know: a speedup whose 95 % interval holds 1, or spans more
than a factor of 2, is inconclusive; the verifier measures more rounds within a budget
before it says so, records it (``speedup_conclusive``), and every view, fast_p, geomean
and reward treats it as no figure. Pure: the decisions are driven with given samples and
a given clock, never with real timings."""

from __future__ import annotations

import itertools
import math
from datetime import datetime
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelflow.cli.commands.verify import timing_line, verdict_text
from kernelflow.events.codec import decode_event, encode
from kernelflow.events.model import (
    TaskFinished,
    TimingStats,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.benchmark import ProblemResult, run_summary
from kernelflow.projections.metrics import MetricsProjection, TaskMetrics
from kernelflow.projections.render import row_speedup_text, summary
from kernelflow.projections.report import bench_text
from kernelflow.projections.rewards import KERNEL_REWARDS, RewardInput, get_reward
from kernelflow.projections.speedups import (
    interval_conclusive,
    report_conclusive,
    speedup_text,
)
from kernelflow.projections.statistics import fast_p, run_metrics
from kernelflow.verification.child.slot import TimingSlot
from kernelflow.verification.child.speedup import speedup_conclusive, speedup_words
from kernelflow.verification.child.timing import (
    CANDIDATE,
    TIMING_ROUNDS,
    median_ci95,
    run_rounds,
    speedup_interval,
)
from kernelflow.verification.results import untimed_reason

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)

# --------------------------------------------------------------------------- the rule


@FAST
@given(positive, positive)
def test_an_interval_is_conclusive_exactly_when_it_excludes_1_and_spans_at_most_2x(
    a: float, b: float
) -> None:
    low, high = min(a, b), max(a, b)
    expected = (high < 1.0 or low > 1.0) and high / low <= 2.0
    assert speedup_conclusive([low, high]) == expected
    if low <= 1.0 <= high:
        assert speedup_conclusive([low, high]) is False  # it holds 1: no side is known
    if high > 2.0 * low:
        assert speedup_conclusive([low, high]) is False  # too wide to be a figure


@FAST
@given(
    st.lists(
        st.one_of(positive, st.sampled_from([0.0, -1.0, math.inf, math.nan, 1.0, 2.0, 0.5])),
        max_size=3,
    )
)
def test_the_judge_s_rule_and_the_projections_rule_agree(interval: list[float]) -> None:
    """The child side (stdlib only) and the parent side (old reports) apply one rule."""
    assert speedup_conclusive(interval) == interval_conclusive(interval)


@FAST
@given(positive, positive, positive, st.sampled_from([True, False, None]))
def test_the_summary_and_every_view_word_a_speedup_alike(
    speedup: float, a: float, b: float, conclusive: bool | None
) -> None:
    interval = [min(a, b), max(a, b)]
    assert speedup_words(speedup, interval, conclusive) == speedup_text(
        speedup, interval, conclusive
    )


def test_the_words_of_an_inconclusive_speedup() -> None:
    assert speedup_text(0.54, [0.03, 10.57], False) == (
        "inconclusive (between 0.03x and 10.57x): the machine was busy"
    )
    assert speedup_text(1.01, [0.97, 1.04], False) == (
        "inconclusive (between 0.97x and 1.04x): no measurable difference from the baseline"
    )
    assert speedup_text(1.7, [1.6, 1.8], True) == "1.70x"
    assert speedup_text(None, untimed="not timed") == "not timed"


def test_reports_recorded_before_the_flag_are_judged_by_their_interval() -> None:
    def report(interval: list[float], flag: bool | None = None) -> VerificationReport:
        timing = TimingStats(speedup_ci95=interval) if interval else TimingStats()
        return VerificationReport(
            verdict="pass", summary="", speedup=1.2, timing=timing, speedup_conclusive=flag
        )

    assert report_conclusive(report([0.03, 10.57])) is False  # the first run
    assert report_conclusive(report([1.6, 1.8])) is True
    assert report_conclusive(report([])) is True  # before intervals: as it always counted
    assert report_conclusive(report([0.03, 10.57], flag=True)) is True  # the flag decides
    untimed = VerificationReport(verdict="pass", summary="")
    assert report_conclusive(untimed) is None


# --------------------------------------------------------------------------- more rounds


class Clock:
    """A clock that moves only when a batch runs (``step`` seconds a batch)."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        return self.now


def batches(values: dict[str, list[float]], clock: Clock):  # type: ignore[no-untyped-def]
    """``batch(side)`` answering each side's given times in turn (the last repeated)."""
    streams = {side: itertools.chain(v, itertools.repeat(v[-1])) for side, v in values.items()}
    calls: list[str] = []

    def batch(side: str) -> float:
        calls.append(side)
        clock.now += clock.step
        return next(streams[side])

    return batch, calls


def test_a_conclusive_speedup_takes_the_first_rounds_only() -> None:
    clock = Clock(0.1)
    batch, calls = batches({"eager": [2.0, 2.1, 2.05], CANDIDATE: [1.0, 1.02, 0.99]}, clock)
    samples = run_rounds(["eager", CANDIDATE], batch, "eager", extra_s=10.0, clock=clock)
    assert len(samples[CANDIDATE]) == TIMING_ROUNDS == len(samples["eager"])
    assert speedup_conclusive(speedup_interval(samples, "eager")) is True
    # Interleaved, the order turning each round.
    assert calls[:4] == ["eager", CANDIDATE, CANDIDATE, "eager"]


def test_an_inconclusive_speedup_gets_more_rounds_until_it_settles() -> None:
    clock = Clock(0.1)
    # Two wild rounds (a neighbour's burst), then steady times: 2x faster.
    noisy = {"eager": [0.2, 30.0, *[2.0] * 80], CANDIDATE: [25.0, 0.1, *[1.0] * 80]}
    batch, _ = batches(noisy, clock)
    samples = run_rounds(["eager", CANDIDATE], batch, "eager", extra_s=10.0, clock=clock)
    # Looked at again after as many rounds again (12), settled there.
    assert len(samples[CANDIDATE]) == 2 * TIMING_ROUNDS
    assert speedup_conclusive(speedup_interval(samples, "eager")) is True


def test_noise_that_never_settles_stops_at_the_budget_and_stays_inconclusive() -> None:
    clock = Clock(0.5)  # a round of two batches: 1 s
    wild = [0.1, 10.0, 1.0, 5.0, 0.2, 3.0, 0.5]
    batch, _ = batches({"eager": wild * 20, CANDIDATE: list(reversed(wild)) * 20}, clock)
    samples = run_rounds(["eager", CANDIDATE], batch, "eager", extra_s=4.0, clock=clock)
    assert len(samples[CANDIDATE]) == TIMING_ROUNDS + 4  # 4 rounds of 1 s fit in 4 s
    assert speedup_conclusive(speedup_interval(samples, "eager")) is False
    capped, _ = batches({"eager": wild * 20, CANDIDATE: list(reversed(wild)) * 20}, Clock(1))
    many = run_rounds(["eager", CANDIDATE], capped, "eager", extra_s=1e9, max_rounds=40)
    assert len(many[CANDIDATE]) == 40  # never past the rounds' cap
    none, _ = batches({"eager": wild, CANDIDATE: wild}, Clock(0.1))
    assert len(run_rounds(["eager", CANDIDATE], none, "eager", extra_s=0.0)[CANDIDATE]) == 6


def test_the_interval_is_looked_at_after_each_doubling_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each look that may stop the timing is a chance for noise to pass for a result:
    after the first 6 rounds, the interval is looked at after 12, 24, 48 only."""
    from kernelflow.verification.child import timing

    looked: list[int] = []

    def interval(samples: dict[str, list[float]], kind: str) -> list[float]:
        looked.append(len(samples[CANDIDATE]))
        return [0.5, 5.0]  # never settles

    monkeypatch.setattr(timing, "speedup_interval", interval)
    batch, _ = batches({"eager": [1.0], CANDIDATE: [1.0]}, Clock(0.01))
    samples = run_rounds(["eager", CANDIDATE], batch, "eager", extra_s=1e9, max_rounds=60)
    assert looked == [6, 12, 24, 48] and len(samples[CANDIDATE]) == 60


def test_a_candidate_as_fast_as_the_baseline_is_not_timed_longer() -> None:
    """An interval narrow around 1 is inconclusive, but more rounds would only narrow it
    around 1: none are taken."""
    clock = Clock(0.1)
    batch, _ = batches({"eager": [1.0, 1.01, 0.99], CANDIDATE: [1.0, 0.995, 1.005]}, clock)
    samples = run_rounds(["eager", CANDIDATE], batch, "eager", extra_s=10.0, clock=clock)
    assert len(samples[CANDIDATE]) == TIMING_ROUNDS
    interval = speedup_interval(samples, "eager")
    assert speedup_conclusive(interval) is False
    assert "no measurable difference" in speedup_words(1.0, interval, False)


def test_the_speedup_interval_is_both_medians_intervals_combined() -> None:
    samples = {"eager": [2.0, 2.2, 1.9, 2.1, 2.0, 2.3], CANDIDATE: [1.0, 1.1, 0.9, 1.0, 1.2, 1.0]}
    (lb, hb), (lc, hc) = median_ci95(samples["eager"]), median_ci95(samples[CANDIDATE])
    assert speedup_interval(samples, "eager") == [lb / hc, hb / lc]


# --------------------------------------------------------------------------- timing slots


def test_a_node_times_one_verifier_at_a_time(tmp_path: Path) -> None:
    job = {"timing": True, "timing_slots": 1, "timing_lock_dir": str(tmp_path / "timing")}
    first = TimingSlot.open({**job, "timeout_s": 300.0}, started=0.0)
    clock = Clock(0.0)
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    second = TimingSlot(
        TimingSlot.open(job, started=0.0).fds, deadline=2.0, clock=clock, sleep=sleep
    )
    notes: list[str] = []
    try:
        # The slot is taken: the second waits until its deadline, then times anyway.
        with first.held(notes), second.held(notes):
            pass
        assert sum(waits) == pytest.approx(2.0, abs=0.1) and second.waited_s >= 1.9
        assert len(notes) == 1 and "no timing slot" in notes[0]
        assert first.acquire()  # released: free again
        first.release()
        with second.held(notes):  # once free, taken at once
            assert second.holding is not None
        assert len(notes) == 1
    finally:
        first.close()
        second.close()


def test_more_slots_let_that_many_verifiers_time_at_once(tmp_path: Path) -> None:
    job = {"timing": True, "timing_slots": 2, "timing_lock_dir": str(tmp_path)}
    slots = [TimingSlot.open(job, started=0.0) for _ in range(3)]
    try:
        assert slots[0].acquire() and slots[1].acquire()
        third = TimingSlot(slots[2].fds, deadline=0.0)
        assert not third.acquire()
        none = TimingSlot.open({**job, "timing_slots": 0}, started=0.0)
        assert none.fds == []  # KF_TIMING_SLOTS=0: no queue
        assert TimingSlot.open({**job, "timing": False}, started=0.0).fds == []
    finally:
        for slot in slots:
            slot.close()


# --------------------------------------------------------------------------- the events


INCONCLUSIVE = VerificationReport(
    verdict="pass",
    summary="all 3 trial(s) match; speedup inconclusive (between 0.03x and 10.57x): ...",
    speedup=0.54,
    speedup_conclusive=False,
    timing=TimingStats(
        baseline="eager",
        speedups={"eager": 0.54},
        speedup_ci95=[0.03, 10.57],
        candidate_ms={"median": 0.37},
        baseline_ms={"median": 0.2},
        rounds=46,
        reps=40,
        queued_s=3.5,
    ),
)


def test_the_flag_round_trips_in_the_events_and_old_events_read_as_unknown() -> None:
    checked = VerificationCompleted(
        task_id="t", seq=3, agent="verifier", dispatch_id="d", code="x", report=INCONCLUSIVE
    )
    again = decode_event(encode(checked))
    assert isinstance(again, VerificationCompleted)
    assert again.report.speedup_conclusive is False and again.report.timing is not None
    assert again.report.timing.queued_s == 3.5 and again.report.timing.rounds == 46
    finished = TaskFinished(
        task_id="t", seq=4, status="success", reason="r", speedup=0.54, speedup_conclusive=False
    )
    assert decode_event(encode(finished)) == finished
    # Recorded before the field: absent, None.
    raw = msgspec.json.decode(encode(checked))
    del raw["report"]["speedup_conclusive"]
    old = decode_event(msgspec.json.encode(raw))
    assert isinstance(old, VerificationCompleted) and old.report.speedup_conclusive is None


# --------------------------------------------------------------------------- counting


def task(task_id: str, speedup: float | None, conclusive: bool | None) -> TaskMetrics:
    return TaskMetrics(
        task_id=task_id,
        status="success",
        verdicts=("pass",),
        final_verdict="pass",
        final_speedup=speedup,
        final_conclusive=conclusive,
    )


def test_fast_p_and_the_geomean_count_only_conclusive_speedups() -> None:
    tasks = [
        task("a", 2.0, True),
        task("b", 8.0, True),
        task("c", 6.48, False),  # a noisy "6x": no figure
        task("d", 0.54, False),
        task("e", None, None),  # not timed
    ]
    m = run_metrics(tasks, fast_ps=(0.0, 1.0, 0.5))
    assert m.fast_p == {"fast_0": 1.0, "fast_1": 2 / 5, "fast_0.5": 2 / 5}
    assert m.geomean_speedup == pytest.approx(4.0) and m.speedups_measured == 2
    assert m.speedups_inconclusive == 2
    assert fast_p(tasks[2:4], 1.0) == 0.0  # timed, nothing known: no hit, not "untimed"


def test_the_metrics_fold_takes_the_flag_from_the_verification_and_the_finish() -> None:
    checked = VerificationCompleted(
        task_id="t", seq=1, agent="verifier", dispatch_id="d", code="x", report=INCONCLUSIVE
    )
    finished = TaskFinished(task_id="t", seq=2, status="success", reason="r", verdict="pass")
    finished = msgspec.structs.replace(finished, speedup=0.54)  # recorded before the flag
    t = MetricsProjection().apply_all([(1, checked), (2, finished)]).tasks["t"]
    assert t.final_conclusive is False and t.final_speedup_ci95 == (0.03, 10.57)
    assert t.best_speedup is None  # an inconclusive pass raises no best
    assert t.outcome().speedup_conclusive is False
    assert run_metrics([t]).speedups_inconclusive == 1


def problem(name: str, speedup: float | None, conclusive: bool | None) -> ProblemResult:
    return ProblemResult(
        problem=name,
        search_id=name,
        solved=True,
        best_verdict="pass",
        best_task=f"{name}-1",
        speedup=speedup,
        speedup_compile=None,
        candidates=1,
        running=0,
        verifications=1,
        tokens=10,
        cost_usd=None,
        gpu_s=0.0,
        speedup_conclusive=conclusive,
        speedup_ci95=(0.44, 45.3) if conclusive is False else (),
    )


def test_the_bench_summary_counts_conclusive_speedups_and_says_how_many_were_not() -> None:
    results = [
        problem("1_a", 2.0, True),
        problem("2_b", 6.48, False),
        problem("3_c", 1.7, False),
        problem("4_d", 0.5, True),
        problem("5_e", 3.0, True),
    ]
    summary = run_summary(results)
    assert summary["fast_p"]["1"] == 2 / 5 and summary["fast_p"]["0"] == 1.0
    assert summary["inconclusive"] == 2 and summary["correct_and_faster"] == 2
    assert summary["geomean_speedup"] == pytest.approx((2.0 * 0.5 * 3.0) ** (1 / 3))
    text = bench_text("run", results, summary, {"devices": [], "timing": None,
                      "timing_note": "x", "timings": [], "verifier_versions": [],
                      "policies": [], "tolerances": {}, "passed_with_warnings": [],
                      "checks_on_in_every_check": [], "checks_on_in_some_only": [],
                      "implausible_speedups": []})  # fmt: skip
    assert "fast_1=0.40" in text and "(2 inconclusive not counted)" in text
    row = next(line for line in text.splitlines() if line.startswith("2_b"))
    assert "inconclusive" in row and "6.48" not in row


def test_the_speedup_reward_credits_parity_for_an_inconclusive_timing() -> None:
    """speedup@2 (the default): correct, no speed credit either way; speedup@1 as it was."""
    assert "speedup@2" in KERNEL_REWARDS
    new, old = get_reward("speedup"), get_reward("speedup@1")
    assert new.key == "speedup@2"
    noisy = RewardInput(status="success", verdict="pass", speedup=6.48, speedup_conclusive=False)
    slow = RewardInput(status="success", verdict="pass", speedup=0.54, speedup_conclusive=False)
    sure = RewardInput(status="success", verdict="pass", speedup=3.0, speedup_conclusive=True)
    unknown = RewardInput(status="success", verdict="pass", speedup=3.0)  # before the flag
    assert (new(noisy), new(slow), new(sure), new(unknown)) == (1.0, 1.0, 3.0, 3.0)
    assert (old(noisy), old(slow)) == (6.48, 0.54)
    failed = RewardInput(status="failed", verdict="mismatch", speedup=6.0, speedup_conclusive=False)
    assert new(failed) == 0.0
    assert noisy.to_dict()["speedup_conclusive"] is False


# --------------------------------------------------------------------------- what is shown


def test_verify_prints_the_policy_and_every_warning_on_the_pass_line_and_under_it() -> None:
    report = VerificationReport(
        verdict="pass",
        summary="all 3 trial(s) match the reference (max abs err 0); speedup 0.92x",
        device="cpu",
        backend="cpp",
        duration_s=41.0,
        policy="kernelbench",
        warnings=["torch_compute: line 7: at::gelu computes in the kernel's place"],
        speedup=0.92,
        speedup_conclusive=True,
        timing=TimingStats(speedups={"eager": 0.92}, speedup_ci95=[0.9, 0.95], rounds=6),
    )
    lines = verdict_text(report).splitlines()
    assert lines[0].startswith("PASS on cpu (cpp) in 41.0s under policy kernelbench: ")
    assert lines[1] == "  warning: torch_compute: line 7: at::gelu computes in the kernel's place"
    assert lines[2].startswith("  timing: ") and "eager 0.92x (between 0.90x and 0.95x)" in lines[2]
    strict = verdict_text(msgspec.structs.replace(report, policy="", warnings=[]))
    assert "under policy strict:" in strict.splitlines()[0]


def test_verify_says_an_inconclusive_speedup_in_words() -> None:
    line = timing_line(INCONCLUSIVE.timing, False)  # type: ignore[arg-type]
    assert "eager inconclusive (between 0.03x and 10.57x): the machine was busy" in line
    assert "0.54x" not in line and "46 rounds of 40 calls" in line
    assert "waited 3.5 s for the node's timing slot" in line
    text = verdict_text(msgspec.structs.replace(INCONCLUSIVE, device="cpu", backend="cpp"))
    assert "inconclusive (between 0.03x and 10.57x)" in text


def test_verify_says_why_a_pass_was_not_timed() -> None:
    triton = VerificationReport(verdict="pass", summary="ok", device="cpu", backend="triton")
    assert untimed_reason(triton) == "not timed: Triton runs interpreted on the CPU"
    assert "  not timed: Triton runs interpreted on the CPU" in verdict_text(triton)
    assert untimed_reason(triton, timing_on=False) == "not timed: timing is off"
    cpp = msgspec.structs.replace(triton, backend="cpp", errors=["timing failed: boom"])
    assert untimed_reason(cpp) == "not timed: the timing failed (see the notes below)"
    assert "  note: timing failed: boom" in verdict_text(cpp)
    assert untimed_reason(msgspec.structs.replace(triton, verdict="mismatch")) is None


def test_status_shows_an_inconclusive_speedup_in_words() -> None:
    from kernelflow.events.model import AgentDispatched
    from kernelflow.projections.task_state import fold

    dispatched = AgentDispatched(task_id="t", seq=1, agent="verifier", step=1, dispatch_id="d")
    checked = VerificationCompleted(
        task_id="t", seq=2, agent="verifier", dispatch_id="d", code="x", report=INCONCLUSIVE
    )
    finished = TaskFinished(
        task_id="t", seq=3, status="success", reason="r", verdict="pass", speedup=0.54
    )  # recorded before the flag: the verification's is taken
    row = summary(fold("t", [dispatched, checked, finished]))
    assert row["speedup_conclusive"] is False and row["speedup_ci95"] == [0.03, 10.57]
    assert row_speedup_text(row) == (
        "inconclusive (between 0.03x and 10.57x): the machine was busy"
    )
    from kernelflow.cli.commands.tasks import task_details

    assert "speedup: inconclusive (between 0.03x and 10.57x)" in task_details(row)


def test_each_baseline_batch_holds_a_round_trip_to_the_candidate_s_process() -> None:
    """A candidate's batch is a request its process answers (a wake-up each way: on a
    busy machine, milliseconds); each baseline batch makes one too, or those waits would
    count against the candidate alone. The order of requests is what is checked here."""
    import torch

    from kernelflow.verification.child.timing import TIMING_WARMUP, time_both

    asked: list[str] = []

    class Candidate:
        def stage(self, inputs: object) -> None:
            asked.append("stage")

        def ping(self) -> None:
            asked.append("ping")

        def time(self, reps: int) -> None:
            asked.append(f"time {reps}")

        def timed_outputs(self, device: str, expected_bytes: int) -> object:
            asked.append("outputs")
            return type("Answer", (), {"outputs": None})()

    stats = time_both(
        {"eager": lambda x: x * 2},
        Candidate(),  # type: ignore[arg-type]
        [torch.ones(8)],
        "cpu",
        lambda outputs: None,
        32,
        max_reps=3,
        extra_s=0.0,
    )
    assert stats["rounds"] == TIMING_ROUNDS
    assert asked[:3] == ["stage", f"time {TIMING_WARMUP}", "ping"]  # the warm-up's batch
    rounds = asked[3:]
    assert rounds.count("ping") == TIMING_ROUNDS  # one per baseline batch
    assert rounds.count("time 3") == TIMING_ROUNDS == rounds.count("outputs")
    assert rounds[:4] == ["ping", "time 3", "outputs", "time 3"]  # the order turns


def test_the_card_the_report_and_the_dashboard_say_an_inconclusive_speedup_in_words() -> None:
    from kernelflow.cli.html_report import report_page
    from kernelflow.cli.ui.html import speedup, task_speedup
    from kernelflow.projections.benchmark import card_lines
    from kernelflow.projections.report import report_text

    words = "inconclusive (between 0.44x and 45.30x): the machine was busy"
    card = {
        "devices": [],
        "timing": None,
        "timing_note": "x",
        "timings": [
            {
                "problem": "12_tanh_gelu",
                "task": "t",
                "candidate_ms": 0.3,
                "candidate_ci95_ms": [0.1, 1.0],
                "baseline": "eager",
                "baseline_ms": 2.0,
                "baseline_ci95_ms": [0.44, 4.53],
                "speedups": {"eager": 6.48},
                "speedup_ci95": [0.44, 45.3],
                "speedup_conclusive": False,
            }
        ],
        "verifier_versions": [4],
        "policies": ["strict"],
        "tolerances": {},
        "passed_with_warnings": [],
        "checks_on_in_every_check": [],
        "checks_on_in_some_only": [],
        "implausible_speedups": [],
    }
    (line,) = [line for line in card_lines(card) if "12_tanh_gelu" in line]
    assert line.endswith(f"; speedup {words}") and "6.48" not in line
    tasks = [task("a", 2.0, True), task("b", 6.48, False)]
    tasks[1] = msgspec.structs.replace(tasks[1], final_speedup_ci95=(0.44, 45.3))
    metrics = run_metrics(tasks)
    text = report_text(metrics, {}, tasks, card=card)
    assert "Speedups inconclusive" in text and ": 1, not counted in fast_p" in text
    page = report_page(
        metrics, {}, tasks, None, fast_ps=(1.0,), generated_at=datetime(2025, 1, 1), card=card
    )
    assert "1 inconclusive (their 95 % interval holds 1" in page and words in page
    assert speedup(6.48, False, (0.44, 45.3)) == words
    assert task_speedup(tasks[1]) == words and task_speedup(tasks[0]) == "2.00x"
