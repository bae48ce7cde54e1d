"""The conductor's pure decision loop, driven without NATS: what it appends for every
state, that tasks always end within their limits, and the trajectory of the result."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.actors.decide import Append, AskLLM, Idle, plan_next
from kernelflow.actors.prompts import conductor_messages
from kernelflow.events.codec import decode_event, encode
from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RemovedOption,
    TaskSubmitted,
    TimingStats,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.counters import counters_at_decisions
from kernelflow.projections.rewards import pending_reward_events
from kernelflow.projections.task_state import CONDUCTOR, fold
from kernelflow.projections.trajectory import StepType, Trajectory, build_trajectory
from kernelflow.workflows.loader import load_workflow, parse_workflow
from tests.conftest import EXAMPLES
from tests.unit.test_speed_of_light import LIMIT

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


FIX_IT = '{"decision": "coder", "error_and_suggestion": "fix it"}'


def passed_at(sol_fraction: float) -> VerificationReport:
    """A timed pass whose kernel reaches ``sol_fraction`` of speed-of-light."""
    limit = msgspec.structs.replace(LIMIT, sol_fraction=sol_fraction)
    timing = TimingStats(roofline=limit)
    return VerificationReport(
        verdict="pass", summary="checked", speedup=1 + sol_fraction, timing=timing
    )


def simulate(
    workflow: str,
    verdicts: list[bool] | list[str] | list[bool | float],
    parse_ok: list[bool] | None = None,
    conductor_says: str | list[str] = FIX_IT,
    workflow_text: str | None = None,
) -> list[Event]:
    """Run a task to its end with scripted agent outcomes, appending what plan_next says:
    each verification passes or fails (a bool), ends with a verdict (a str), or passes at
    a fraction of speed-of-light (a float). The conductor's LLM answers ``conductor_says``
    every time, or each of a list in turn. ``workflow_text``: the workflow's document (else
    the predefined ``workflow``'s)."""
    wf, text = load_workflow(workflow)
    if workflow_text is not None:
        wf, text = parse_workflow(workflow_text, workflow), workflow_text
    events: list[Event] = []
    answers = [conductor_says] if isinstance(conductor_says, str) else list(conductor_says)

    def record(event: Event) -> None:
        events.append(msgspec.structs.replace(event, seq=len(events) + 1))

    record(msgspec.structs.replace(submitted(workflow), workflow_yaml=text))
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
                    response_text=answers.pop(0) if len(answers) > 1 else answers[0],
                )
            )
        elif fold(T, events).terminal is not None:
            return events
        else:  # an agent must work: play its part
            d = fold(T, events).current
            assert d is not None and isinstance(plan, Idle)
            if d.agent == "verifier":
                ok = verdicts.pop(0) if verdicts else False
                if isinstance(ok, float):
                    report = passed_at(ok)
                else:
                    verdict = ok if isinstance(ok, str) else "pass" if ok else "fail"
                    report = VerificationReport(verdict=verdict, summary="checked")  # type: ignore[arg-type]
                record(
                    VerificationCompleted(
                        task_id=T,
                        agent="verifier",
                        dispatch_id=d.dispatch_id,
                        code=f"k{d.event.step}",
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


@pytest.mark.parametrize(
    ("verdict", "whose"), [("task_error", "the task is broken"), ("unsupported", "this node")]
)
@pytest.mark.parametrize("workflow", ["default", "conductor_connect_all", "coder_only"])
def test_a_fault_that_is_not_the_candidate_s_ends_the_task_in_one_decision(
    verdict: str, whose: str, workflow: str
) -> None:
    events = simulate(workflow, [verdict, True])
    state = fold(T, events)
    assert state.history[-1] == "verifier" and state.history.count("verifier") == 1
    assert state.finished is not None and state.finished.status == "rejected"
    assert state.finished.reason.startswith(whose)
    last = state.decisions[-1]
    assert (last.mode, last.chosen, last.options) == ("auto", "finish", ["finish"])
    checked = next(i for i, e in enumerate(events) if isinstance(e, VerificationCompleted))
    after = events[checked:]
    assert not [e for e in after if isinstance(e, LLMCalled)]  # no LLM call spent on it
    assert pending_reward_events(state) == []  # no reward: not the policy's doing


def test_an_unusable_conductor_answer_falls_back_safely() -> None:
    state = fold(T, simulate("default", [False, True], conductor_says="no idea"))
    assert [d.mode for d in state.decisions].count("fallback") == 1
    assert state.finished is not None and state.finished.status == "success"


def test_max_step_ends_a_task_that_never_passes_on_a_checked_answer() -> None:
    """coder_only (max_step 15): a 15th agent would be a coder whose answer nothing could
    check; the task ends on its 14th, the verifier, naming the check and the limit."""
    state = fold(T, simulate("coder_only", []))
    assert state.step == 14 and state.history[-1] == "verifier"
    assert state.finished is not None and state.finished.status == "failed"
    last = state.decisions[-1]
    assert last.mode == "limit"
    assert last.removed == [RemovedOption(agent="coder", limit="max_step", count=14, maximum=15)]
    assert state.finished.reason == (
        "fail: checked; max_step 15: 14 agents ran, and no verification could follow coder "
        "in the one step left"
    )


def test_the_last_step_goes_to_the_verifier() -> None:
    """default (max_step 20): an answer that fails to parse at step 18 is rerun at 19,
    and the verifier still checks it at 20, the last step."""
    parse_ok = [True] * 9 + [False, True]  # designer, then coders: the 9th coder's fails
    state = fold(T, simulate("default", [], parse_ok=parse_ok))
    assert state.history[-3:] == ["coder", "coder", "verifier"] and state.step == 20
    assert state.finished is not None
    assert "max_step 20 reached (20 agents ran)" in state.finished.reason


def test_a_decision_recorded_before_removals_were_recorded_decodes_with_none() -> None:
    old = (
        b'{"kind":"conductor_decided","v":1,"task_id":"t","seq":4,"at":1.0,"cause":"t:3",'
        b'"after_agent":"coder","options":["verifier"],"mode":"auto","chosen":"verifier",'
        b'"reason":"the only option","suggestion":""}'
    )
    decided = decode_event(old)
    assert isinstance(decided, ConductorDecided) and decided.removed == []
    removed = RemovedOption(agent="coder", limit="sequence", count=3, maximum=3, sequence="cv")
    new = msgspec.structs.replace(decided, removed=[removed])
    assert decode_event(encode(new)) == new


def dispatches(events: list[Event]) -> list[AgentDispatched]:
    return [e for e in events if isinstance(e, AgentDispatched)]


def test_an_unparseable_coder_answer_reruns_the_coder_in_default() -> None:
    """The coder does not list itself in default: its retry is the rule's, not an edge's.
    The verifier sees code, and the retry is asked with the suggestion the coder had."""
    events = simulate("default", [False, True], parse_ok=[True, True, False, True])
    state = fold(T, events)
    assert state.history == ["designer", "coder", "verifier", "coder", "coder", "verifier"]
    assert [d.mode for d in state.decisions] == [
        "auto",
        "auto",
        "auto",
        "llm",
        "retry",
        "auto",
        "auto",
    ]
    assert len(state.verifications) == 2 and state.finished.status == "success"  # type: ignore[union-attr]
    assert [d.suggestion for d in dispatches(events)][3:5] == ["fix it", "fix it"]


def test_a_retry_the_limits_forbid_is_named_and_routing_goes_on() -> None:
    """coder_only's coder may run 3 times in a row (the default limit)."""
    events = simulate("coder_only", [True], parse_ok=[False, False, False])
    state = fold(T, events)
    assert state.history == ["coder", "coder", "coder", "verifier"]
    routed = state.decisions[3]
    assert (routed.mode, routed.chosen) == ("limit", "verifier")
    assert routed.removed == [
        RemovedOption(agent="coder", limit="single_agent", count=3, maximum=3)
    ]
    assert routed.reason == (
        "output failed to parse, not retried: "
        "coder ran 3 times in a row (single_agent limit 3); the only option left"
    )
    at_decisions = counters_at_decisions(events, {})
    assert [c.step for _, c in at_decisions] == [0, 1, 2, 3, 4]
    assert at_decisions[3][1].consecutive("coder") == 3


def test_a_rejected_answer_suggests_nothing_to_the_fallback_agent() -> None:
    rejected = '{"decision": "deploy", "error_and_suggestion": "ship it as is"}'
    events = simulate("default", [False, True], conductor_says=rejected)
    state = fold(T, events)
    fallback = state.decisions[3]
    assert (fallback.mode, fallback.chosen, fallback.suggestion) == ("fallback", "coder", "")
    assert dispatches(events)[3].suggestion == ""


def test_a_verified_kernel_goes_on_to_the_optimizer_when_the_conductor_chooses() -> None:
    """Seed 001's extension example, with the verifier under mandatory analysis: the
    conductor's LLM may hand a passed kernel on; never back to the agent that wrote it.
    In default, a pass still finishes with no conductor call."""
    answers = [
        '{"decision": "optimizer", "error_and_suggestion": "widen the blocks"}',
        '{"decision": "verifier", "error_and_suggestion": ""}',
        '{"decision": "finish", "error_and_suggestion": ""}',
    ]
    workflow = str(EXAMPLES / "workflows" / "default_with_optimizer.yaml")
    events = simulate(workflow, [True, True], conductor_says=answers)
    state = fold(T, events)
    assert state.history == ["designer", "coder", "verifier", "optimizer", "verifier"]
    after_passes = [d for d in state.decisions if d.after_agent == "verifier"]
    assert [(d.options, d.chosen, d.mode) for d in after_passes] == [
        (["finish", "optimizer"], "optimizer", "llm"),
        (["finish", "coder"], "finish", "llm"),
    ]
    assert state.dispatches[3].event.suggestion == "widen the blocks"
    assert state.finished is not None and state.finished.status == "success"
    # The conductor's prompt says what finishing and handing on a passed kernel mean.
    first_pass = next(i for i, e in enumerate(events) if isinstance(e, VerificationCompleted))
    wf, _ = load_workflow(workflow)
    asked = conductor_messages(
        fold(T, events[: first_pass + 1]), wf, ("finish", "optimizer"), "verifier"
    )
    assert "The kernel passed: `finish` ends the task with it" in asked[-1].content
    default = fold(T, simulate("default", [True]))
    assert default.finished is not None and default.finished.status == "success"
    assert not default.conductor_calls


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
    assert t.get_tool_calls() == []  # the agents' own LLM turns are not tool calls
    agents = [s.metadata["agent"] for s in t.steps if s.step_type == StepType.ACTION]
    assert agents == ["designer", "coder", "coder"]
    assert t.is_completed and t.metadata["status"] == "success"
    assert Trajectory.from_dict(t.to_dict()) == t
    assert t.get_messages()[0]["role"] == "user"
