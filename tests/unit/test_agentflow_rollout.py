"""AgentFlow's in-the-flow rollout run whole (docs/workflows.md, "agentflow"): the real
conductor and agent actors on the in-memory log, every LLM scripted (planner, executor,
memory verifier, solution generator, judge). Turns are planner actions that reached the
executor, the cap holds however many retries a turn takes, the solution generator always
writes the final answer and the judge grades that; a rollout that cannot reach it ends
failed, unjudged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import yaml

from kernelflow.actors.agents import LLMAgent
from kernelflow.actors.conductor import Conductor
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    ROUTING_VERSION,
    AgentDispatched,
    Event,
    OutputParsed,
    ParseFailed,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.llm import make_provider
from kernelflow.offline.redecide import redecide
from kernelflow.projections.task_state import TaskState, fold
from kernelflow.rollout import RolloutConfig, rollout_complete
from tests.daemons import trigger_message
from tests.memory import running_bridge

T = "af-1"
PLAN = json.dumps({"context": "6 and 7", "sub_goal": "multiply", "tool_name": "calculator"})
CALL = "TOOL_CALL: calculator(expression='6 * 7')"
CONTINUE = json.dumps({"analysis": "not sure yet", "conclusion": "CONTINUE"})
STOP = json.dumps({"analysis": "the calculator answered", "conclusion": "STOP"})
ANSWER = "Final Answer: 42"
RIGHT = json.dumps({"analysis": "same number", "true_false": True})


def agentflow(tools: tuple[str, ...] = ("calculator",), max_step: int | None = None) -> str:
    """The agentflow workflow as ``kernelflow rollout --workflow agentflow --tools`` runs it."""
    _, text = RolloutConfig(workflow="agentflow", tools=tools).task_workflow()
    if max_step is None:
        return text
    doc = yaml.safe_load(text)
    doc["limitation_info"]["required"]["max_step"] = max_step
    return yaml.safe_dump(doc, sort_keys=False)


def rollout(
    tmp_path: Path,
    script: dict[str, list[Any]],
    workflow: str | None = None,
    routing_version: int = ROUTING_VERSION,
) -> TaskState:
    """Run one rollout of "What is 6 times 7?" to its end, rewards and judge included."""
    return fold(T, rollout_events(tmp_path, script, workflow, routing_version))


def rollout_events(
    tmp_path: Path,
    script: dict[str, list[Any]],
    workflow: str | None = None,
    routing_version: int = ROUTING_VERSION,
) -> list[Event]:
    """The log of ``rollout``."""
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(script))
    provider = make_provider(f"scripted:{path}")
    submitted = TaskSubmitted(
        task_id=T, task_name="q", task_source="", workflow_name="agentflow",
        workflow_yaml=workflow or agentflow(), backend="triton", group_id="g",
        prompt="What is 6 times 7?", reference_answer="42", rewards=["judge@1"],
        routing_version=routing_version,
    )  # fmt: skip
    with running_bridge() as bridge:
        conductor = Conductor(bridge, llm=provider)
        conductor.advance(bridge.call(bridge.log.append(TaskHistory(T), [submitted])))
        for _ in range(40):
            history = bridge.call(bridge.log.read_task(T))
            if rollout_complete(fold(T, history.events)):
                return list(history.events)
            assert isinstance(history.events[-1], AgentDispatched), history.events[-1]
            LLMAgent(bridge, history.events[-1].agent, provider).handle(trigger_message(history))
            conductor.advance(bridge.call(bridge.log.read_task(T)))
    raise AssertionError("the rollout never ended")


def events_of(state: TaskState, kind: type[Event]) -> list[Any]:
    return [
        e
        for d in state.dispatches
        for e in (d.event, *d.llm_calls, *d.tool_calls, d.result)
        if isinstance(e, kind)
    ]


def judged_right(state: TaskState) -> None:
    """The task ended with the solution generator's answer, and the judge graded that."""
    assert state.history[-1] == "solution_generator"
    assert state.finished is not None and state.finished.status == "success"
    assert state.finished.final_answer == "42"
    assert state.judge_call is not None and "## Answer to judge\n42" in (
        state.judge_call.messages[-1].content
    )
    assert state.rewards["judge"].value == 1.0
    rubric = state.judge_call.messages[0].content  # semantic, numeric and option equivalence
    assert all(s in rubric for s in ('"B", "(B)"', '"option B"', "numeric equivalence"))


def turns(state: TaskState) -> int:
    """Planner actions that reached the executor (each one did)."""
    planned = sum(
        d.agent == "planner" and isinstance(d.result, OutputParsed) for d in state.dispatches
    )
    assert planned == state.history.count("executor")
    return planned


def test_an_off_format_verifier_answer_is_retried_and_the_turn_cap_holds(tmp_path: Path) -> None:
    maybe = json.dumps({"analysis": "not sure yet", "conclusion": "MAYBE"})
    state = rollout(
        tmp_path,
        {
            "planner": [PLAN] * 6,
            "executor": [CALL] * 6,
            "memory_verifier": [maybe, *[CONTINUE] * 6],
            "solution_generator": [ANSWER],
            "judge": [RIGHT],
        },
    )
    assert state.history == [
        "planner", "executor", "memory_verifier", "memory_verifier",
        *["planner", "executor", "memory_verifier"] * 3, "solution_generator",
    ]  # fmt: skip
    assert turns(state) == 4  # the cap of the `turn` sequence: max_repeats 4
    [failed] = events_of(state, ParseFailed)
    assert failed.reason == "field 'conclusion' must be one of CONTINUE, STOP, got 'MAYBE'"
    retry = state.dispatches[3].llm_calls[0].messages[-1].content
    assert "must be one of CONTINUE, STOP, got 'MAYBE'" in retry
    last = state.decisions[-2]  # the one before the finish
    assert last.after_agent == "memory_verifier" and last.chosen == "solution_generator"
    assert [r.sequence for r in last.removed] == ["turn"]
    judged_right(state)


def test_a_planner_retried_every_turn_stays_within_the_cap_and_g_answers(tmp_path: Path) -> None:
    state = rollout(
        tmp_path,
        {
            "planner": ["I would use the calculator.", PLAN] * 6,
            "executor": [CALL] * 6,
            "memory_verifier": [CONTINUE] * 6,
            "solution_generator": [ANSWER],
            "judge": [RIGHT],
        },
    )
    turn = ["planner", "planner", "executor", "memory_verifier"]
    assert state.history == [*turn * 4, "solution_generator"]
    assert turns(state) == 4 and state.step == 17  # within max_step 20, G's step included
    judged_right(state)


def test_a_tool_outside_the_toolset_is_retried_with_the_tools(tmp_path: Path) -> None:
    search = json.dumps({"context": "", "sub_goal": "look it up", "tool_name": "web_search"})
    state = rollout(
        tmp_path,
        {
            "planner": [search, PLAN],
            "executor": [CALL],
            "memory_verifier": [STOP],
            "solution_generator": [ANSWER],
            "judge": [RIGHT],
        },
    )
    assert state.history[:3] == ["planner", "planner", "executor"]
    [failed] = events_of(state, ParseFailed)
    why = "field 'tool_name' must name one of the tools: calculator; got 'web_search'"
    assert failed.reason == why
    assert why in state.dispatches[1].llm_calls[0].messages[-1].content  # told on the retry
    assert [c.tool for c in events_of(state, ToolCalled)] == ["calculator"]
    judged_right(state)


def test_the_executor_runs_the_planners_tool_or_the_turn_fails_visibly(tmp_path: Path) -> None:
    """The planner chose the calculator; the executor writes a python call: it is not run,
    the memory shows it failed, and the next turn goes on from there."""
    state = rollout(
        tmp_path,
        {
            "planner": [PLAN, PLAN],
            "executor": ["TOOL_CALL: python(code='print(6 * 7)')", CALL],
            "memory_verifier": [CONTINUE, STOP],
            "solution_generator": [ANSWER],
            "judge": [RIGHT],
        },
        agentflow(tools=("calculator", "python")),
    )
    first, second = events_of(state, ToolCalled)
    assert (first.tool, first.ok) == ("python", False)
    assert first.error == "'python' was not run: planner chose calculator for this turn"
    assert (second.tool, second.ok, second.output) == ("calculator", True, "42")
    # The executor was offered the planner's tool alone.
    executor_prompt = state.dispatches[1].llm_calls[0].messages[0].content
    assert "- calculator(" in executor_prompt and "- python(" not in executor_prompt
    verifier_prompt = state.dispatches[2].llm_calls[0].messages[-1].content
    assert "'python' was not run: planner chose calculator" in verifier_prompt
    judged_right(state)


def test_a_short_step_budget_keeps_the_solution_generators_step(tmp_path: Path) -> None:
    """max_step 8: after two turns the planner would leave no room for the answer."""
    state = rollout(
        tmp_path,
        {
            "planner": [PLAN] * 3,
            "executor": [CALL] * 3,
            "memory_verifier": [CONTINUE] * 3,
            "solution_generator": [ANSWER],
            "judge": [RIGHT],
        },
        agentflow(max_step=8),
    )
    assert state.history == [*["planner", "executor", "memory_verifier"] * 2, "solution_generator"]
    last = state.decisions[-2]  # the one before the finish
    assert [(r.agent, r.limit) for r in last.removed] == [("planner", "max_step_reserve")]
    assert "would leave no step for the agent that gives the final answer" in last.reason
    judged_right(state)


def test_a_rollout_that_cannot_reach_the_solution_generator_fails_unjudged(
    tmp_path: Path,
) -> None:
    state = rollout(
        tmp_path,
        {"planner": [PLAN], "judge": [RIGHT]},
        agentflow(max_step=3),
    )
    assert state.history == ["planner"]
    assert state.finished is not None and state.finished.status == "failed"
    assert state.finished.final_answer is None
    assert state.finished.reason.startswith(
        "no final answer: the task ended after planner, and only solution_generator may give it"
    )
    assert state.judge_call is None  # a failed rollout scores 0 without the judge
    assert {name: r.value for name, r in state.rewards.items()} == {"judge": 0.0}


def test_a_task_decided_by_the_first_routing_rules_replays_by_them(tmp_path: Path) -> None:
    """Recorded before routing version 2, a rollout whose planner was retried every turn
    ran 5 turns into max_step and ended on the verifier's answer: its decisions still follow
    from its log under the rules it ran by, and would not under today's."""
    script = {
        "planner": ["I would use the calculator.", PLAN] * 6,
        "executor": [CALL] * 6,
        "memory_verifier": [CONTINUE] * 6,
        "judge": [RIGHT],
    }
    events = rollout_events(tmp_path, script, routing_version=1)
    state = fold(T, events)
    assert state.history == ["planner", "planner", "executor", "memory_verifier"] * 5
    assert state.finished is not None and state.finished.final_answer == CONTINUE
    assert redecide(T, events) == []
    today = [
        msgspec.structs.replace(e, routing_version=ROUTING_VERSION)
        if isinstance(e, TaskSubmitted)
        else e
        for e in events
    ]
    assert redecide(T, today)  # the fifth turn: today the solution generator answers


def test_an_executor_without_a_planned_tool_runs_none_and_says_so(tmp_path: Path) -> None:
    """Three planner answers that do not parse (its single_agent limit): the turn goes on
    without an action, and the executor, asked nothing, records why no tool ran."""
    state = rollout(
        tmp_path,
        {
            "planner": ["no plan"] * 3,
            "memory_verifier": [STOP],
            "solution_generator": [ANSWER],
            "judge": [RIGHT],
        },
    )
    assert state.history[:5] == ["planner"] * 3 + ["executor", "memory_verifier"]
    executor = state.dispatches[3]
    assert not executor.llm_calls and not executor.tool_calls
    why = "no tool run: planner chose none (its answer did not parse)"
    assert isinstance(executor.result, OutputParsed) and executor.result.fields["answer"] == why
    assert why in state.dispatches[4].llm_calls[0].messages[-1].content  # in the memory
    judged_right(state)
