"""Properties of the pure projections: metrics folds, rewards, Flow-GRPO samples, the
trajectory format and the exported-log file format, on synthetic logs."""

from __future__ import annotations

import gc
import itertools
import json
import math
import random
from collections import defaultdict
from dataclasses import dataclass

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    RewardAssigned,
    TaskCancelled,
    TaskFinished,
    TaskSubmitted,
    Usage,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections import logfile
from kernelflow.projections.flow_grpo import (
    GrpoOptions,
    GrpoSample,
    RewardTable,
    SampleBuilder,
    group_stats,
)
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.rewards import (
    KERNEL_REWARDS,
    REWARD_FUNCTIONS,
    RewardInput,
    get_reward,
    pending_reward_events,
    reward_events,
)
from kernelflow.projections.statistics import fast_p, geomean, projection_metrics
from kernelflow.projections.task_state import fold
from kernelflow.projections.trajectory import StepType, Trajectory, TrajectoryStep, build_trajectory

# --------------------------------------------------------------------------- synthetic logs


@dataclass(frozen=True)
class TaskSpec:
    task_id: str
    group: str
    verdicts: tuple[str, ...]  # one verification per coder turn
    end: str = "finished"  # finished | cancelled | unfinished
    speedup: float | None = None
    record_rewards: bool = False
    workflow: str = "default"


def make_task(spec: TaskSpec, t0: float = 1000.0) -> list[Event]:
    """A realistic task history (designer, then coder/verifier rounds), seq and at set."""
    tid = spec.task_id
    out: list[Event] = []

    def add(e: Event) -> None:
        out.append(msgspec.structs.replace(e, seq=len(out) + 1, at=t0 + len(out)))

    add(
        TaskSubmitted(
            task_id=tid,
            cause="cmd:1",
            task_name="relu",
            task_source="class Model: ...",
            workflow_name=spec.workflow,
            workflow_yaml="x: 1",
            backend="triton",
            group_id=spec.group,
        )
    )
    step = 0

    def run(agent: str, text: str, verdict: str | None = None) -> None:
        nonlocal step
        step += 1
        did = f"{tid}:d{step}"
        add(
            ConductorDecided(
                task_id=tid, after_agent="", options=[agent], mode="auto", chosen=agent, reason="r"
            )
        )
        add(AgentDispatched(task_id=tid, agent=agent, step=step, dispatch_id=did))
        if verdict is None:
            add(
                LLMCalled(
                    task_id=tid,
                    agent=agent,
                    dispatch_id=did,
                    provider="scripted",
                    model="m1",
                    messages=[
                        ChatMessage(role="system", content="you write kernels"),
                        ChatMessage(role="user", content=f"task {tid} step {step}"),
                    ],
                    response_text=text,
                    usage=Usage(input_tokens=10, output_tokens=5),
                    latency_s=0.5,
                    token_ids=[1, 2, 3],
                    logprobs=[-0.1, -0.2, -0.3],
                    cost_usd=0.01,
                )
            )
            add(OutputParsed(task_id=tid, agent=agent, dispatch_id=did, fields={"code": text}))
        else:
            report = VerificationReport(
                verdict=verdict,  # type: ignore[arg-type]
                summary=verdict,
                speedup=spec.speedup if verdict == "pass" else None,
            )
            add(
                VerificationCompleted(
                    task_id=tid, agent="verifier", dispatch_id=did, code=text, report=report
                )
            )

    run("designer", "plan")
    for i, verdict in enumerate(spec.verdicts):
        run("coder", f"code {i}")
        run("verifier", f"code {i}", verdict)
    if spec.end == "unfinished":
        return out
    if spec.end == "cancelled":
        add(TaskCancelled(task_id=tid, reason="user"))
        return out
    last = spec.verdicts[-1] if spec.verdicts else None
    finished = TaskFinished(
        task_id=tid,
        cause=f"{tid}:{len(out)}",
        status="success" if last == "pass" else "failed",
        reason="done",
        final_code="code",
        verdict=last,  # type: ignore[arg-type]
        speedup=spec.speedup if last == "pass" else None,
    )
    add(finished)
    if spec.record_rewards:  # as the conductor does: right after the finish
        for r in pending_reward_events(fold(tid, out)):
            add(r)
    return out


def interleave(histories: list[list[Event]], seed: int) -> list[tuple[int, Event]]:
    """Merge per-task histories in a random order that keeps each task's order."""
    rng = random.Random(seed)
    cursors = [0] * len(histories)
    merged: list[Event] = []
    live = [i for i, h in enumerate(histories) if h]
    while live:
        i = rng.choice(live)
        merged.append(histories[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(histories[i]):
            live.remove(i)
    return list(enumerate(merged, 1))


VERDICTS = ["pass", "mismatch", "compile_error", "rejected_static", "rejected_runtime"]


@st.composite
def task_specs(draw: st.DrawFn, n_max: int = 8) -> list[TaskSpec]:
    n = draw(st.integers(1, n_max))
    specs = []
    for i in range(n):
        specs.append(
            TaskSpec(
                task_id=f"t{i}",
                group=f"g{draw(st.integers(0, 2))}",
                verdicts=tuple(draw(st.lists(st.sampled_from(VERDICTS), min_size=0, max_size=3))),
                end=draw(
                    st.sampled_from(["finished", "finished", "finished", "cancelled", "unfinished"])
                ),
                speedup=draw(st.none() | st.floats(0.1, 20.0)),
                record_rewards=draw(st.booleans()),
                workflow=draw(st.sampled_from(["default", "coder_only"])),
            )
        )
    return specs


@st.composite
def logs(draw: st.DrawFn) -> list[tuple[int, Event]]:
    specs = draw(task_specs())
    return interleave([make_task(s) for s in specs], draw(st.integers(0, 2**16)))


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- metrics


@FAST
@given(logs(), st.data())
def test_metrics_fold_in_any_split_equals_one_pass(log: list[tuple[int, Event]], data) -> None:  # type: ignore[no-untyped-def]
    one = MetricsProjection().apply_all(log).snapshot()
    k = data.draw(st.integers(0, len(log)))
    first = MetricsProjection().apply_all(log[:k])
    # Stop, persist the read model, resume: and the source delivers some events again.
    resumed = MetricsProjection.restore(first.snapshot())
    overlap = data.draw(st.integers(0, k))
    resumed.apply_all(log[k - overlap :])
    assert resumed.snapshot() == one
    assert resumed.position == (log[-1][0] if log else 0)


@FAST
@given(logs())
def test_metrics_count_what_the_log_says(log: list[tuple[int, Event]]) -> None:
    p = MetricsProjection().apply_all(log)
    by_task: dict[str, list[Event]] = defaultdict(list)
    for _, e in log:
        by_task[e.task_id].append(e)
    for tid, events in by_task.items():
        t = p.tasks[tid]
        state = fold(tid, events)
        assert t.steps == state.step
        assert t.llm_calls == sum(isinstance(e, LLMCalled) for e in events)
        assert t.verdicts == tuple(v.report.verdict for v in state.verifications)
        assert t.ended == (state.terminal is not None)
    m = projection_metrics(p)
    assert m.tasks == len(by_task)
    assert sum(m.verdicts.values()) == sum(len(t.verdicts) for t in p.tasks.values())
    if m.ended:
        assert m.fast_p["fast_0"] == m.correctness_rate


def test_run_metrics_definitions() -> None:
    specs = [
        TaskSpec("a", "g", ("mismatch", "pass"), speedup=2.0),
        TaskSpec("b", "g", ("pass",), speedup=0.5),
        TaskSpec("c", "g", ("compile_error",)),
        TaskSpec("d", "g", ("pass",), speedup=None),
        TaskSpec("e", "g", ("pass",), end="unfinished"),
    ]
    p = MetricsProjection().apply_all(interleave([make_task(s) for s in specs], 3))
    m = projection_metrics(p, fast_ps=(0.0, 1.0, 1.5))
    assert (m.tasks, m.ended, m.running, m.correct) == (5, 4, 1, 3)
    assert m.correctness_rate == pytest.approx(0.75)
    assert m.fast_p == {"fast_0": 0.75, "fast_1": 0.25, "fast_1.5": 0.25}
    assert m.geomean_speedup == pytest.approx(math.sqrt(2.0 * 0.5))
    assert m.verdicts == {"compile_error": 1, "mismatch": 1, "pass": 4}
    assert p.tasks["a"].best_speedup == 2.0 and p.tasks["a"].cost_usd == pytest.approx(0.03)
    assert m.agent_latency["coder"].count == 6 and m.llm_latency["designer"].mean_s == 0.5
    assert fast_p([], 1.0) is None and geomean([]) is None


def test_the_metrics_read_model_leaves_the_cycle_collector_nothing_to_scan() -> None:
    """The read model keeps one TaskMetrics per task for the life of the daemon, and a
    replay folds every task of the log: if they were tracked, each full collection would
    walk all of them, and a 1M-event replay spent seconds in the collector."""
    specs = [TaskSpec(f"t{i}", "g", ("mismatch", "pass"), speedup=1.5) for i in range(300)]
    log = interleave([make_task(s) for s in specs], 5)
    gc.collect()
    before = len(gc.get_objects())
    p = MetricsProjection().apply_all(log)
    del log
    gc.collect()
    assert len(p.tasks) == 300 and p.tasks["t7"].verdicts == ("mismatch", "pass")
    assert len(gc.get_objects()) - before < 30  # a few per agent, none per task or event


# --------------------------------------------------------------------------- rewards


def test_reward_functions() -> None:
    binary, speedup, cheat = (get_reward(k) for k in ("binary", "speedup@1", "cheat_penalty"))
    ok = RewardInput(status="success", verdict="pass", speedup=3.0, verdicts=("pass",))
    assert (binary(ok), speedup(ok), cheat(ok)) == (1.0, 3.0, 1.0)
    fast = RewardInput(status="success", verdict="pass", speedup=50.0, verdicts=("pass",))
    assert speedup(fast) == 10.0  # capped
    unmeasured = RewardInput(status="success", verdict="pass", verdicts=("pass",))
    assert speedup(unmeasured) == 1.0
    hacked = RewardInput(status="failed", verdict="rejected_static", verdicts=("rejected_static",))
    assert (binary(hacked), speedup(hacked), cheat(hacked)) == (0.0, 0.0, -1.0)
    hack_then_pass = RewardInput(
        status="success", verdict="pass", verdicts=("rejected_runtime", "pass")
    )
    assert cheat(hack_then_pass) == 0.0
    with pytest.raises(ValueError, match="unknown reward"):
        get_reward("nope")


def test_reward_events_record_every_function_with_inputs() -> None:
    events = make_task(TaskSpec("r1", "g", ("rejected_static", "pass"), speedup=4.0))
    state = fold("r1", events[:-1])
    finished = events[-1]
    assert isinstance(finished, TaskFinished)
    recorded = reward_events(state, finished)
    assert {f"{r.reward_fn}@{r.version}" for r in recorded} == set(KERNEL_REWARDS)
    values = {r.reward_fn: r.value for r in recorded}
    assert values == {"binary": 1.0, "speedup": 4.0, "cheat_penalty": 0.0}
    assert all(r.cause == finished.event_id and r.task_id == "r1" for r in recorded)
    assert recorded[0].inputs["verdicts"] == ["rejected_static", "pass"]
    # Only a task whose newest event is its finish still needs its rewards recorded.
    assert pending_reward_events(state) == []
    after = fold("r1", events)
    assert pending_reward_events(after) == reward_events(after) == recorded
    unstamped = msgspec.structs.replace(finished, seq=0)
    assert reward_events(state, unstamped) == recorded
    logged = make_task(TaskSpec("r2", "g", ("pass",), record_rewards=True))
    assert isinstance(logged[-1], RewardAssigned)
    assert pending_reward_events(fold("r2", logged)) == []
    assert reward_events(fold("r2", logged[:3])) == []  # not finished


# --------------------------------------------------------------------------- Flow-GRPO


def grpo(
    log: list[tuple[int, Event]], options: GrpoOptions
) -> tuple[list[GrpoSample], RewardTable, SampleBuilder]:
    metrics = MetricsProjection().apply_all(log)
    table = RewardTable.from_tasks(metrics.tasks.values(), options, metrics.position)
    samples: list[GrpoSample] = []
    builder = SampleBuilder(table, samples.append)
    for pos, e in log:
        builder.apply(pos, e)
    builder.finish()
    return samples, table, builder


OPTIONS = st.builds(
    GrpoOptions,
    reward=st.sampled_from(sorted(REWARD_FUNCTIONS)),
    normalize=st.sampled_from(["trajectory", "turn"]),
    scale_std=st.booleans(),
    agents=st.sampled_from([None, frozenset({"coder"}), frozenset({"designer", "coder"})]),
)


@FAST
@given(logs(), OPTIONS)
def test_advantages_are_group_normalised(
    log: list[tuple[int, Event]], options: GrpoOptions
) -> None:
    samples, table, builder = grpo(log, options)
    # Every turn of a rollout carries the rollout's reward and advantage.
    per_rollout: dict[str, set[tuple[float, float]]] = defaultdict(set)
    for s in samples:
        per_rollout[s.rollout_id].add((s.reward, s.advantage))
        assert s.reward == table.rollouts[s.rollout_id].reward
    assert all(len(v) == 1 for v in per_rollout.values())
    # Over each group's values (rollouts, or turns), advantages have mean 0 and, scaled
    # by the std, unit std.
    for gid, g in table.groups.items():
        rollouts = [r for r in table.rollouts.values() if r.grouped and r.group_id == gid]
        weights = [(r.turns if options.normalize == "turn" else 1) for r in rollouts]
        if options.normalize == "turn" and sum(weights) == 0:
            weights = [1] * len(rollouts)
        advs = [
            g.advantage(r.reward, options)
            for r, w in zip(rollouts, weights, strict=True)
            for _ in range(w)
        ]
        assert math.fsum(advs) == pytest.approx(0.0, abs=1e-9)
        if g.verdict == "ok" and options.scale_std:
            mean = math.fsum(advs) / len(advs)
            std = math.sqrt(math.fsum((a - mean) ** 2 for a in advs) / (len(advs) - 1))
            assert std == pytest.approx(1.0, rel=1e-4)
        if g.verdict != "ok":
            assert all(a == 0.0 for a in advs)
    # Samples are exactly the trainable turns of tasks that ended, not cancelled.
    grouped = {tid for tid, r in table.rollouts.items() if r.grouped}
    expected = sum(table.rollouts[t].turns for t in grouped)
    assert len(samples) == expected
    assert builder.drops.unfinished == sum(r.turns for r in table.rollouts.values() if not r.ended)
    cancelled = sum(r.turns for r in table.rollouts.values() if r.ended and r.cancelled)
    assert builder.drops.cancelled == cancelled
    turn_idx: dict[str, list[int]] = defaultdict(list)
    for s in samples:
        turn_idx[s.rollout_id].append(s.turn_index)
        assert options.agents is None or s.agent in options.agents
    assert all(v == list(range(len(v))) for v in turn_idx.values())


def test_advantage_values_and_policies() -> None:
    specs = [
        TaskSpec("a", "g", ("pass",)),
        TaskSpec("b", "g", ("mismatch",)),
        TaskSpec("c", "g", ("mismatch", "mismatch")),  # two coder turns
        TaskSpec("solo", "h", ("pass",)),
        TaskSpec("same1", "z", ("pass",)),
        TaskSpec("same2", "z", ("pass",), record_rewards=True),
    ]
    log = interleave([make_task(s) for s in specs], 1)
    coder = frozenset({"coder"})
    samples, table, _ = grpo(log, GrpoOptions(agents=coder, epsilon=0.0))
    adv = {s.rollout_id: s.advantage for s in samples}
    # Rewards 1, 0, 0: mean 1/3, sample std sqrt(1/3).
    std = math.sqrt(1 / 3)
    assert adv["a"] == pytest.approx((1 - 1 / 3) / std)
    assert adv["b"] == pytest.approx((0 - 1 / 3) / std)
    assert adv["solo"] == 0.0 and adv["same1"] == 0.0
    assert table.groups["h"].verdict == "singleton"
    assert table.groups["z"].verdict == "zero_variance"
    assert {s.reward_source for s in samples if s.rollout_id == "same2"} == {"recorded"}
    assert {s.reward_source for s in samples if s.rollout_id == "same1"} == {"computed"}
    # Over turns, c's two turns weigh twice: values 1, 0, 0, 0.
    samples, _, _ = grpo(log, GrpoOptions(agents=coder, normalize="turn", scale_std=False))
    assert {s.rollout_id: s.advantage for s in samples}["a"] == pytest.approx(0.75)
    samples, _, b = grpo(log, GrpoOptions(agents=coder, singleton="drop", zero_variance="drop"))
    assert {s.rollout_id for s in samples} == {"a", "b", "c"}
    assert (b.drops.singleton_group, b.drops.zero_variance) == (1, 2)


def test_a_cancelled_rollout_is_left_out_of_its_group_and_the_samples() -> None:
    """Cancelled from outside (a user, an interrupted run): its reward is not the policy's,
    so its group's statistics are those of the others, as a resumed rollout needs."""
    specs = [
        TaskSpec("a", "g", ("pass",)),
        TaskSpec("b", "g", ("mismatch",)),
        TaskSpec("cut", "g", ("mismatch",), end="cancelled"),
    ]
    log = interleave([make_task(s) for s in specs], 1)
    samples, table, b = grpo(log, GrpoOptions(agents=frozenset({"coder"}), epsilon=0.0))
    assert {s.rollout_id for s in samples} == {"a", "b"}
    assert b.drops.cancelled == 1
    assert table.groups["g"].rollouts == 2  # rewards 1 and 0: mean 1/2, std sqrt(1/2)
    adv = {s.rollout_id: s.advantage for s in samples}
    assert adv["a"] == pytest.approx(0.5 / math.sqrt(0.5))


def test_length_limits_truncate_or_drop() -> None:
    log = interleave([make_task(TaskSpec("a", "g", ("pass",)))], 0)
    samples, _, b = grpo(log, GrpoOptions(max_response_chars=3, max_prompt_chars=20))
    designer = next(s for s in samples if s.agent == "designer")
    assert designer.response == "pla" and designer.truncated
    assert designer.response_token_ids is None
    assert sum(len(m.content) for m in designer.prompt) == 20
    assert designer.prompt[0].content == "you write kernels"  # the system message is kept
    assert b.drops.truncated_responses == 2 and b.drops.truncated_prompts == 2
    samples, _, b = grpo(log, GrpoOptions(max_response_chars=4, overlong="drop"))
    assert [s.agent for s in samples] == ["designer"]
    counted = {k: v for k, v in msgspec.structs.asdict(b.drops).items() if v}
    assert counted == {"response_too_long": 1}


# --------------------------------------------------------------------------- trajectory

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
STEPS = st.builds(
    TrajectoryStep,
    step_type=st.sampled_from(list(StepType)),
    content=st.text(max_size=30),
    metadata=st.dictionaries(st.text(max_size=5), JSONISH, max_size=3),
    tool_name=st.none() | st.text(max_size=5),
    tool_args=st.none() | st.dictionaries(st.text(max_size=5), JSONISH, max_size=3),
    tool_result=JSONISH,
    reward_score=st.none() | st.floats(allow_nan=False),
    is_correct=st.none() | st.booleans(),
    log_probs=st.none() | st.lists(st.floats(allow_nan=False), max_size=4),
    attention_mask=st.none() | st.lists(st.integers(0, 1), max_size=4),
)


@FAST
@given(
    st.builds(
        Trajectory,
        request_id=st.text(max_size=10),
        steps=st.lists(STEPS, max_size=5),
        metadata=st.dictionaries(st.text(max_size=5), JSONISH, max_size=3),
        is_completed=st.booleans(),
        final_reward=st.none() | st.floats(allow_nan=False),
        total_tokens=st.integers(0, 10**6),
    )
)
def test_trajectory_round_trips(t: Trajectory) -> None:
    assert Trajectory.from_dict(t.to_dict()) == t
    assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t


@FAST
@given(task_specs(n_max=3))
def test_built_trajectories_round_trip_through_json(specs: list[TaskSpec]) -> None:
    for spec in specs:
        t = build_trajectory(spec.task_id, make_task(spec))
        assert Trajectory.from_dict(json.loads(json.dumps(t.to_dict()))) == t


# --------------------------------------------------------------------------- log file


def export_lines(events: list[Event], flt: dict[str, str] | None = None) -> list[bytes]:
    w = logfile.LogWriter(flt)
    return [w.header(), *(w.record(e) for e in events), w.trailer()]


@FAST
@given(logs(), st.data())
def test_log_file_round_trips_and_detects_any_change(log: list[tuple[int, Event]], data) -> None:  # type: ignore[no-untyped-def]
    events = [e for _, e in log]
    lines = export_lines(events, {"group": "g1"})
    assert [e for _, e in logfile.read_events(lines)] == events
    summary = logfile.verify(lines)
    assert summary.records == len(events) and summary.header.filter == {"group": "g1"}
    # The same check without decoding the records, from blocks cut anywhere.
    whole = b"".join(lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(whole)), max_size=6)))
    blocks = [whole[a:b] for a, b in itertools.pairwise([0, *cuts, len(whole)])]
    digest = logfile.check_digest(blocks)
    assert (digest.records, digest.sha256, digest.header) == (
        summary.records,
        summary.sha256,
        summary.header,
    )
    assert lines == export_lines(events, {"group": "g1"})  # deterministic
    # Flip one byte anywhere before the trailer: refused.
    blob = bytearray(b"".join(lines[:-1]))
    i = data.draw(st.integers(0, len(blob) - 1))
    blob[i] = (blob[i] + 1) % 256 if blob[i] != ord("\n") - 1 else blob[i] + 2
    damaged = [*bytes(blob).splitlines(keepends=True), lines[-1]]
    with pytest.raises(logfile.CorruptLogFile):
        logfile.verify(damaged)
    with pytest.raises(logfile.CorruptLogFile):
        logfile.check_digest([bytes(blob[:i]), bytes(blob[i:]), lines[-1]])


def test_log_file_refusals_say_why() -> None:
    events = make_task(TaskSpec("a", "g", ("pass",)))
    lines = export_lines(events)
    with pytest.raises(logfile.CorruptLogFile, match="out of order"):
        logfile.verify(export_lines([events[1], events[0], *events[2:]]))
    whole = b"".join(lines)
    for cut in range(len(whole) + 1):  # two blocks, split anywhere
        assert logfile.check_digest([whole[:cut], whole[cut:]]).records == len(events)
    empty = logfile.LogWriter()
    blob = empty.header() + empty.trailer()  # an export of nothing
    for cut in range(len(blob) + 1):
        assert logfile.check_digest([blob[:cut], blob[cut:]]).records == 0
    w = logfile.LogWriter()
    three = [w.header(), *(w.record(e) for e in events[:3])]
    other = logfile.LogWriter()
    other.header(), other.record(events[0])
    for check in (logfile.verify, logfile.check_digest):
        with pytest.raises(logfile.CorruptLogFile, match="truncated"):
            check(lines[:-1])
        with pytest.raises(logfile.CorruptLogFile, match="empty"):
            check([])
        with pytest.raises(logfile.CorruptLogFile, match="header"):
            check([b"hello\n"])
        with pytest.raises(logfile.CorruptLogFile, match="says 1 records, the file has 3"):
            check([*three, other.trailer()])
        with pytest.raises(logfile.CorruptLogFile, match="after the trailer"):
            check([*three, w.trailer(), three[1]])
    assert group_stats([], GrpoOptions()) == {}
