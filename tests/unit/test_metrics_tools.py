"""Per-agent and per-tool metrics: the pure fold on synthetic logs with tool calls, and how
``kernelflow report`` and ``kernelflow replay --view metrics`` show them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelflow.cli.main import main as kernelflow_main
from kernelflow.events.codec import decode_event, encode
from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
    ToolCalled,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections import logfile
from kernelflow.projections.metrics import MetricsProjection, TaskMetrics
from kernelflow.projections.report import report_text
from kernelflow.projections.statistics import projection_metrics
from tests.unit.test_projections_props import FAST, interleave, make_task, task_specs


def stamp(events: list[Event], t0: float = 1000.0) -> list[Event]:
    return [msgspec.structs.replace(e, seq=i, at=t0 + i) for i, e in enumerate(events, 1)]


def with_tools(history: list[Event]) -> list[Event]:
    """A task history with a tool call after each LLM call (alternately ok and failing)."""
    out: list[Event] = []
    for e in history:
        out.append(e)
        if isinstance(e, LLMCalled):
            n = len(out)
            out.append(
                ToolCalled(
                    task_id=e.task_id,
                    agent=e.agent,
                    dispatch_id=e.dispatch_id,
                    call_id=f"c{n}",
                    tool="python" if n % 2 else "calculator",
                    args={"code": "1+1"},
                    ok=n % 2 == 0,
                    output="2",
                    error="" if n % 2 == 0 else "boom",
                    truncated=n % 3 == 0,
                    duration_s=0.25,
                )
            )
    return [msgspec.structs.replace(e, seq=i) for i, e in enumerate(out, 1)]


def tool_task(tid: str = "tt-1") -> list[Event]:
    def llm(agent: str, did: str) -> LLMCalled:
        return LLMCalled(
            task_id=tid,
            agent=agent,
            dispatch_id=did,
            provider="scripted",
            model="m",
            messages=[],
            response_text="…",
            latency_s=0.5,
        )

    def tool(did: str, name: str, ok: bool, took: float, truncated: bool = False) -> ToolCalled:
        return ToolCalled(
            task_id=tid,
            agent="coder",
            dispatch_id=did,
            call_id=f"{did}-{name}",
            tool=name,
            ok=ok,
            output="out",
            error="" if ok else "failed",
            truncated=truncated,
            duration_s=took,
        )

    report = VerificationReport(verdict="mismatch", summary="no")
    return stamp(
        [
            TaskSubmitted(
                task_id=tid,
                task_name="relu",
                task_source="",
                workflow_name="coder_only",
                workflow_yaml="x: 1",
                backend="triton",
                group_id="g",
            ),
            AgentDispatched(task_id=tid, agent="coder", step=1, dispatch_id="d1"),
            llm("coder", "d1"),
            tool("d1", "calculator", True, 0.2),
            tool("d1", "python", False, 1.0, truncated=True),
            llm("coder", "d1"),
            tool("d1", "calculator", True, 0.4),
            OutputParsed(task_id=tid, agent="coder", dispatch_id="d1", fields={"code": "x"}),
            AgentDispatched(task_id=tid, agent="verifier", step=2, dispatch_id="d2"),
            VerificationCompleted(
                task_id=tid, agent="verifier", dispatch_id="d2", code="x", report=report
            ),
            llm("conductor", "e10"),
            AgentDispatched(task_id=tid, agent="coder", step=3, dispatch_id="d3"),
            llm("coder", "d3"),
            ParseFailed(task_id=tid, agent="coder", dispatch_id="d3", reason="no code"),
            TaskFinished(task_id=tid, status="failed", reason="gave up"),
        ]
    )


def test_per_agent_and_per_tool_metrics() -> None:
    p = MetricsProjection().apply_all(enumerate(tool_task(), 1))
    m = projection_metrics(p)
    coder, verifier, conductor = m.agents["coder"], m.agents["verifier"], m.agents["conductor"]
    assert (coder.runs, coder.successes, coder.failures, coder.unfinished) == (2, 1, 1, 0)
    assert (coder.llm_calls, coder.tool_calls, coder.success_rate) == (3, 3, 0.5)
    # dispatch at 2, output at 8; dispatch at 12, parse failure at 14: (6 + 2) / 2
    assert coder.total_s == pytest.approx(8.0) and coder.mean_s == pytest.approx(4.0)
    assert (verifier.runs, verifier.successes, verifier.failures) == (1, 0, 1)
    assert (conductor.runs, conductor.llm_calls, conductor.mean_s) == (0, 1, None)
    calc, python = m.tools["calculator"], m.tools["python"]
    assert (calc.calls, calc.successes, calc.failures, calc.truncated) == (2, 2, 0, 0)
    assert calc.mean_s == pytest.approx(0.3) and calc.success_rate == 1.0
    assert (python.calls, python.successes, python.failures, python.truncated) == (1, 0, 1, 1)
    assert m.tool_calls == 3 and p.tasks["tt-1"].tool_failures == 1
    assert p.tasks["tt-1"].reason == "gave up"

    text = report_text(m, {}, list(p.tasks.values()))
    assert "Per agent" in text and "Per tool (3 calls)" in text
    calc_line = next(line for line in text.splitlines() if line.startswith("calculator"))
    assert calc_line.split()[:5] == ["calculator", "2", "2", "0", "100.0%"]


def test_the_names_every_task_repeats_are_kept_once() -> None:
    """A long log's per-task rows hold the same few names (workflow, agents, verdicts,
    status, reason, reward): decoded anew from each event, they are still kept once, not
    once per task (the read model and the offline tools keep a row per task)."""
    p = MetricsProjection().apply_all(enumerate(decoded_tasks("ab"), 1))
    assert_names_kept_once(p.tasks["a"], p.tasks["b"])
    # Rows restored from a snapshot are decoded from JSON, each with strings of its own.
    restored = MetricsProjection.restore(p.snapshot())
    assert_names_kept_once(restored.tasks["a"], restored.tasks["b"])


def decoded_tasks(task_ids: str) -> list[Event]:
    """A tool task each, rewarded, one after another, decoded from the wire: one string
    object per name."""
    events: list[Event] = []
    for tid in task_ids:
        events += tool_task(tid)
        events.append(RewardAssigned(task_id=tid, reward_fn="binary", version=1, value=0.0, seq=99))
    return [decode_event(encode(e)) for e in events]


def assert_names_kept_once(a: TaskMetrics, b: TaskMetrics) -> None:
    assert a.workflow == "coder_only" and a.workflow is b.workflow
    assert a.task_name is b.task_name and a.backend is b.backend
    coder = {name: name for name in b.llm_calls_by_agent}["coder"]
    assert next(name for name in a.llm_calls_by_agent if name == "coder") is coder
    assert a.verdicts == ("mismatch",) and a.verdicts[0] is b.verdicts[0]
    assert a.status is b.status and a.reason is b.reason
    assert next(iter(a.rewards)) is next(iter(b.rewards))


def test_each_kind_of_dispatch_result_is_counted_for_its_task_and_agent() -> None:
    tid = "r-1"

    def dispatched(agent: str, did: str) -> AgentDispatched:
        return AgentDispatched(task_id=tid, agent=agent, step=int(did[1:]), dispatch_id=did)

    def verified(did: str, verdict: str, speedup: float | None) -> VerificationCompleted:
        report = VerificationReport(verdict=verdict, summary=verdict, speedup=speedup)  # type: ignore[arg-type]
        return VerificationCompleted(
            task_id=tid, agent="verifier", dispatch_id=did, code="x", report=report
        )

    events = stamp(
        [
            dispatched("coder", "d1"),
            ParseFailed(task_id=tid, agent="coder", dispatch_id="d1", reason="no code"),
            dispatched("coder", "d2"),
            AgentFailed(task_id=tid, agent="coder", dispatch_id="d2", error="provider down"),
            dispatched("coder", "d3"),
            OutputParsed(task_id=tid, agent="coder", dispatch_id="d3", fields={"code": "x"}),
            dispatched("verifier", "d4"),
            verified("d4", "pass", 1.5),
            dispatched("verifier", "d5"),
            verified("d5", "mismatch", None),
            dispatched("verifier", "d6"),
            verified("d6", "pass", 3.0),
        ]
    )
    p = MetricsProjection().apply_all(enumerate(events, 1))
    t = p.tasks[tid]
    assert (t.parse_failures, t.agent_failures) == (1, 1)
    assert t.verdicts == ("pass", "mismatch", "pass") and t.best_speedup == 3.0
    m = projection_metrics(p)
    coder, verifier = m.agents["coder"], m.agents["verifier"]
    assert (coder.runs, coder.successes, coder.failures, coder.unfinished) == (3, 1, 2, 0)
    assert (verifier.runs, verifier.successes, verifier.failures) == (3, 2, 1)
    # Each result is one second after its dispatch (``stamp``).
    assert coder.total_s == pytest.approx(3.0) and verifier.mean_s == pytest.approx(1.0)


@FAST
@given(task_specs(n_max=5), st.integers(0, 2**16), st.data())
def test_agent_and_tool_tallies_resume_without_double_counting(specs, seed, data) -> None:  # type: ignore[no-untyped-def]
    log = interleave([with_tools(make_task(s)) for s in specs], seed)
    one = MetricsProjection().apply_all(log)
    k = data.draw(st.integers(0, len(log)))
    resumed = MetricsProjection.restore(MetricsProjection().apply_all(log[:k]).snapshot())
    resumed.apply_all(log[k - data.draw(st.integers(0, k)) :])  # some delivered again
    assert resumed.snapshot() == one.snapshot()
    m = projection_metrics(one)
    tools = [e for _, e in log if isinstance(e, ToolCalled)]
    assert m.tool_calls == len(tools) == sum(t.calls for t in m.tools.values())
    assert sum(t.successes for t in m.tools.values()) == sum(e.ok for e in tools)
    assert sum(a.llm_calls for a in m.agents.values()) == m.llm_calls


def test_replay_and_report_show_agents_and_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tools.jsonl"
    writer = logfile.LogWriter()
    lines = [writer.header(), *(writer.record(e) for e in tool_task()), writer.trailer()]
    path.write_bytes(b"".join(lines))
    cli = kernelflow_main
    replay = ["replay", "--task", "tt-1", "--from", str(path), "--view", "metrics"]
    assert cli([*replay, "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert view["tools"]["python"]["failures"] == 1 and view["agents"]["coder"]["runs"] == 2
    assert view["tool_calls"] == 3
    assert cli(replay) == 0
    assert "Per tool (3 calls)" in capsys.readouterr().out
    assert cli(["report", "--from", str(path), "--json"]) == 0
    overall = json.loads(capsys.readouterr().out)["overall"]
    assert overall["tools"]["calculator"]["calls"] == 2
    assert overall["agents"]["verifier"]["failures"] == 1
