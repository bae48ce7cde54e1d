"""The conductor's pure decision loop, driven without NATS: what it appends for every
state, that tasks always end within their limits, and the trajectory of the result."""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.actors.decide import Append, AskLLM, Idle, plan_next
from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    TaskSubmitted,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.task_state import CONDUCTOR, fold
from kernelflow.projections.trajectory import StepType, Trajectory, build_trajectory
from kernelflow.workflows.loader import load_workflow

T = "t-sim"


def submitted(workflow: str) -> TaskSubmitted:
    _, text = load_workflow(workflow)
    return TaskSubmitted(
        task_id=T,
        task_name="relu",
        task_source="class Model: ...",
        workflow_name=workflow,
        workflow_yaml=text,
        backend="triton",
        group_id="g",
    )


def simulate(
    workflow: str,
    verdicts: list[bool],
    parse_ok: list[bool] | None = None,
    conductor_says: str = '{"decision": "coder", "error_and_suggestion": "fix it"}',
) -> list[Event]:
    """Run a task to its end with scripted agent outcomes, appending what plan_next says."""
    wf, _ = load_workflow(workflow)
    events: list[Event] = []

    def record(event: Event) -> None:
        events.append(msgspec.structs.replace(event, seq=len(events) + 1))

    record(submitted(workflow))
    verdicts, parse_ok = list(verdicts), list(parse_ok or [])
    for _ in range(500):
        plan = plan_next(fold(T, events), wf)
        if isinstance(plan, Append):
            record(plan.event)
        elif isinstance(plan, AskLLM):
            record(
                LLMCalled(
                    task_id=T,
                    agent=CONDUCTOR,
                    dispatch_id=plan.decision_point,
                    provider="test",
                    model="m",
                    messages=[ChatMessage(role="user", content="?")],
                    response_text=conductor_says,
                )
            )
        elif fold(T, events).terminal is not None:
            return events
        else:  # an agent must work: play its part
            d = fold(T, events).current
            assert d is not None and isinstance(plan, Idle)
            if d.agent == "verifier":
                ok = verdicts.pop(0) if verdicts else False
                report = VerificationReport(verdict="pass" if ok else "fail", summary="checked")
                record(
                    VerificationCompleted(
                        task_id=T,
                        agent="verifier",
                        dispatch_id=d.dispatch_id,
                        code="k",
                        report=report,
                    )
                )
                continue
            record(
                LLMCalled(
                    task_id=T,
                    agent=d.agent,
                    dispatch_id=d.dispatch_id,
                    provider="test",
                    model="m",
                    messages=[],
                    response_text="```python\nk\n```",
                )
            )
            if parse_ok.pop(0) if parse_ok else True:
                record(
                    OutputParsed(
                        task_id=T, agent=d.agent, dispatch_id=d.dispatch_id, fields={"code": "k"}
                    )
                )
            else:
                record(
                    ParseFailed(
                        task_id=T, agent=d.agent, dispatch_id=d.dispatch_id, reason="no code"
                    )
                )
    raise AssertionError("the task never ended")


def test_default_workflow_fail_then_pass() -> None:
    events = simulate("default", [False, True])
    state = fold(T, events)
    assert state.history == ["designer", "coder", "verifier", "coder", "verifier"]
    assert state.finished is not None and state.finished.status == "success"
    modes = [d.mode for d in state.decisions]
    assert modes == ["auto", "auto", "auto", "llm", "auto", "auto"]
    # The conductor's suggestion reaches the coder it sends back.
    second_coder = [e for e in events if isinstance(e, AgentDispatched)][3]
    assert second_coder.suggestion == "fix it"


def test_an_unusable_conductor_answer_falls_back_safely() -> None:
    state = fold(T, simulate("default", [False, True], conductor_says="no idea"))
    assert [d.mode for d in state.decisions].count("fallback") == 1
    assert state.finished is not None and state.finished.status == "success"


def test_max_step_ends_a_task_that_never_passes() -> None:
    state = fold(T, simulate("coder_only", []))
    assert state.step == 15  # coder_only's max_step
    assert state.finished is not None and state.finished.status == "failed"
    assert state.decisions[-1].mode == "limit"


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["default", "coder_only", "conductor_connect_all", "verifier_only"]),
    st.lists(st.booleans(), max_size=12),
    st.lists(st.booleans(), max_size=12),
)
def test_every_task_ends_within_its_limits(
    workflow: str, verdicts: list[bool], parse_ok: list[bool]
) -> None:
    wf, _ = load_workflow(workflow)
    events = simulate(workflow, verdicts, parse_ok)
    state = fold(T, events)
    assert state.finished is not None
    assert state.step <= wf.max_step
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    passed = bool(state.verifications) and state.verifications[-1].report.passed
    assert (state.finished.status == "success") == passed
    # Nothing after the end, and re-planning the final state does nothing.
    assert isinstance(plan_next(state, wf), Idle)


def test_trajectory_of_a_run_round_trips() -> None:
    events = simulate("default", [False, True])
    t = build_trajectory(T, events)
    assert t.steps[0].step_type == StepType.OBSERVATION
    assert t.steps[-1].step_type == StepType.FINAL_ANSWER and t.steps[-1].is_correct
    assert [s.tool_name for s in t.get_tool_calls()] == ["designer", "coder", "coder"]
    assert t.is_completed and t.metadata["status"] == "success"
    assert Trajectory.from_dict(t.to_dict()) == t
    assert t.get_messages()[0]["role"] == "user"
