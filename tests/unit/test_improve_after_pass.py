"""Improving after a pass (docs/workflows.md, "Improving after a pass"): in a workflow
with ``improve_after_pass`` a kernel that passes below the target fraction of
speed-of-light goes back to its author, the limits and budgets end the improving, and the
task ends as a success with the best kernel that passed, whatever came after it."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.actors.decide import Append, Idle, kept_check, plan_next
from kernelflow.actors.prompts import agent_messages
from kernelflow.events.model import (
    AgentDispatched,
    Event,
    OutputParsed,
    TaskFinished,
    VerificationCompleted,
)
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.render import summary
from kernelflow.projections.rewards import get_reward, reward_events
from kernelflow.projections.search import SearchDatabase
from kernelflow.projections.task_state import fold
from kernelflow.workflows.loader import WorkflowError, load_workflow, parse_workflow
from kernelflow.workflows.model import Improvement
from tests.unit.test_decide import T, simulate

_, AGENTIC = load_workflow("agentic")
TARGET_HALF = AGENTIC.replace("target_sol_fraction: 0.8", "target_sol_fraction: 0.5")


SCORED = [get_reward("binary"), get_reward("sol")]


def finished(events: list[Event]) -> TaskFinished:
    end = fold(T, events).finished
    assert end is not None
    return end


def engineers(events: list[Event]) -> int:
    return sum(isinstance(e, AgentDispatched) and e.agent == "engineer" for e in events)


def test_the_predefined_agentic_workflow_improves_towards_80_percent() -> None:
    wf, _ = load_workflow("agentic")
    assert wf.improve == Improvement(target_sol_fraction=0.8)


def test_a_pass_below_the_target_goes_back_to_its_author_and_one_at_it_finishes() -> None:
    events = simulate("agentic", [0.1, 0.3, 0.85], workflow_text=AGENTIC)
    state = fold(T, events)
    assert state.history == ["engineer", "verifier"] * 3
    reasons = [d.reason for d in state.decisions if d.after_agent == "verifier"]
    assert reasons[0] == (
        "verification passed at 10% of speed-of-light, below the target 80%: engineer improves it"
    )
    assert reasons[-1] == "verification passed at 85% of speed-of-light, the target 80% reached"
    # A pass is routed by the rule alone: no conductor LLM call, no suggestion.
    assert [d.mode for d in state.decisions if d.after_agent == "verifier"] == ["auto"] * 3
    end = finished(events)
    assert end.status == "success" and end.final_code == "k6" and end.final_check is None


def test_the_limits_end_the_improving_and_the_task_keeps_its_best_pass() -> None:
    # max_step 8: four hand-overs, four checks; the best (60 %) is the third.
    events = simulate("agentic", [0.2, 0.4, 0.6, 0.5], workflow_text=AGENTIC)
    state = fold(T, events)
    assert state.step == 8
    last = state.decisions[-1]
    assert last.mode == "limit" and last.chosen == "finish"
    assert last.reason.endswith("no more improving: max_step 8 reached (8 agents ran)")
    end = finished(events)
    best = state.verifications[2]
    assert end.status == "success" and end.final_code == best.code == "k6"
    assert end.final_check == best.event_id and state.final_check is best
    assert end.reason.startswith("ended with the best kernel that passed; ")
    assert end.speedup == pytest.approx(1.6)


def test_a_later_kernel_that_fails_does_not_undo_the_pass() -> None:
    events = simulate("agentic", [0.3, False, False, False], workflow_text=AGENTIC)
    end = finished(events)
    assert end.status == "success" and end.verdict == "pass" and end.final_code == "k2"
    # The rewards, run --json / status and the metrics read the kept kernel, not the last
    # (failed) one.
    state = fold(T, events)
    rewards = {r.reward_fn: r.value for r in reward_events(state, functions=SCORED)}
    assert rewards["binary"] == 1.0 and rewards["sol"] == pytest.approx(0.3)
    shown = summary(state)
    assert shown["verdict"] == "pass" and shown["sol_fraction"] == pytest.approx(0.3)
    t = MetricsProjection().apply_all(enumerate(events, 1)).tasks[T]
    assert t.final_verdict == "pass" and t.final_sol_fraction == pytest.approx(0.3)
    assert t.outcome().sol_fraction == pytest.approx(0.3) and t.passes == {}
    # A search's candidate (a bench problem's best kernel) is the kept kernel too.
    (candidate,) = SearchDatabase(None).apply_all(events).ordered()
    assert candidate.passed and candidate.code == "k2" and candidate.report is not None
    assert candidate.report.sol_fraction == pytest.approx(0.3) and candidate.passes == {}


def test_an_untimed_pass_finishes_there_being_nothing_to_improve_towards() -> None:
    events = simulate("agentic", [True], workflow_text=AGENTIC)
    state = fold(T, events)
    assert state.history == ["engineer", "verifier"]
    assert "not timed here" in state.decisions[-1].reason
    assert finished(events).status == "success"


def test_the_deadline_ends_the_improving_as_a_success_with_the_best_kernel() -> None:
    wf = parse_workflow(AGENTIC, "agentic")
    events = simulate("agentic", [0.3, 0.4], workflow_text=AGENTIC)
    first = msgspec.structs.replace(events[0], deadline_s=10.0)
    checks = [i for i, e in enumerate(events) if isinstance(e, VerificationCompleted)]
    back = next(i for i, e in enumerate(events) if isinstance(e, AgentDispatched) and e.step == 3)
    answered = next(i for i, e in enumerate(events) if isinstance(e, OutputParsed) and i > back)
    # The engineer answered its improvement after the deadline: the conductor ends the task.
    state = fold(T, [first, *events[1 : answered + 1]])
    plan = plan_next(state, wf, now=first.at + 11)
    assert isinstance(plan, Append) and isinstance(plan.event, TaskFinished)
    assert plan.event.status == "success" and plan.event.final_code == "k2"
    # Without a pass to keep, a deadline is a timeout, as in every workflow.
    state = fold(T, [first, *events[1 : checks[0] - 2]])
    plan = plan_next(state, wf, now=first.at + 11)
    assert isinstance(plan, Append) and isinstance(plan.event, TaskFinished)
    assert plan.event.status == "timeout"


def test_the_authors_prompt_says_how_close_it_came_and_the_target() -> None:
    events = simulate("agentic", [0.25, 0.9], workflow_text=AGENTIC)
    wf = parse_workflow(AGENTIC, "agentic")
    second = next(i for i, e in enumerate(events) if isinstance(e, AgentDispatched) and e.step == 3)
    state = fold(T, events[: second + 1])
    prompt = agent_messages(state, wf, "engineer")[-1].content
    assert "## Your kernel passed: now make it faster" in prompt
    assert "It reaches 25% of this machine's speed-of-light; the target is 80%." in prompt
    first = fold(T, events[:2])
    assert "now make it faster" not in agent_messages(first, wf, "engineer")[-1].content


def test_without_improve_after_pass_the_last_verification_decides_as_before() -> None:
    text = AGENTIC.replace("improve_after_pass:\n  target_sol_fraction: 0.8\n", "")
    events = simulate("agentic", [0.3, False], workflow_text=text)
    state = fold(T, events)
    assert state.history == ["engineer", "verifier"]  # a pass finishes
    assert finished(events).status == "success"
    assert parse_workflow(text, "agentic").improve is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.booleans(), st.floats(0.01, 1.5, allow_nan=False)), max_size=10))
def test_a_task_that_passed_once_ends_a_success_with_its_best_pass(
    outcomes: list[bool | float],
) -> None:
    events = simulate("agentic", outcomes, workflow_text=TARGET_HALF)
    state = fold(T, events)
    end = finished(events)
    passes = [c for c in state.verifications if c.report.passed]
    assert (end.status == "success") == bool(passes)
    wf = parse_workflow(TARGET_HALF, "agentic")
    if passes:
        best = max(
            (c.report.sol_fraction or 0.0, c.report.speedup or 0.0, i) for i, c in enumerate(passes)
        )
        assert state.final_check is passes[best[2]] is kept_check(state, wf)
        assert end.final_code == passes[best[2]].code
    # It stops improving once a pass reaches the target, or one is untimed.
    for check in state.verifications[:-1]:
        sol = check.report.sol_fraction
        assert not check.report.passed or (sol is not None and sol < 0.5)
    assert isinstance(plan_next(state, wf), Idle)
    assert engineers(events) <= 4


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{target_sol_fraction: 0}", "must be a fraction of speed-of-light above 0 and at most 1"),
        ("{target_sol_fraction: 1.5}", "above 0 and at most 1, got a number 1.5"),
        ("{target_sol_fraction: yes}", "above 0 and at most 1, got a boolean True"),
        ("{target: 0.5}", "improve_after_pass.target"),
        ("[0.5]", "improve_after_pass: must be a mapping"),
    ],
)
def test_a_broken_improve_after_pass_is_refused_naming_it(value: str, problem: str) -> None:
    text = AGENTIC.replace("improve_after_pass:\n  target_sol_fraction: 0.8\n", "")
    with pytest.raises(WorkflowError) as err:
        parse_workflow(text + f"\nimprove_after_pass: {value}\n", "w", source="w.yaml")
    assert problem in str(err.value)


def test_improving_needs_an_author_the_verifier_may_go_back_to() -> None:
    text = AGENTIC.replace(
        "possible_next_agent: [finish, engineer]", "possible_next_agent: [finish]"
    )
    with pytest.raises(WorkflowError, match="add the kernel's author to the verifier's"):
        parse_workflow(text, "w")
    without = text.replace("improve_after_pass:\n  target_sol_fraction: 0.8\n", "")
    assert parse_workflow(without, "w").improve is None  # a pass is final: nothing to check


def test_true_improves_towards_the_default_target() -> None:
    text = AGENTIC.replace(
        "improve_after_pass:\n  target_sol_fraction: 0.8\n", "improve_after_pass: true\n"
    )
    assert parse_workflow(text, "w").improve == Improvement(target_sol_fraction=0.95)
