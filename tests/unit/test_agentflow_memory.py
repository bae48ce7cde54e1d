"""The memory AgentFlow's agents read (docs/workflows.md, "agentflow"): a fold of the
task's events, one structured record per finished step with its turn, time and error
signals; the same events give the same memory, however they are split."""

from __future__ import annotations

import msgspec

from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    Event,
    OutputParsed,
    ParseFailed,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.projections.agent_memory import EMPTY, memory, render_memory
from kernelflow.projections.task_state import TaskState, apply, fold

T = "t-memory"


def steps() -> list[Event]:
    """Turn 1: a planner answer that does not parse, its rerun, a failed and a good tool
    call, the verifier's CONTINUE; turn 2: the planner again, then an executor that fails,
    then a planner still at work."""
    events: list[Event] = [
        TaskSubmitted(
            task_id=T, at=100.0, task_name="q", task_source="", workflow_name="agentflow",
            workflow_yaml="", backend="triton", group_id="g", prompt="What is 6 times 7?",
        )
    ]  # fmt: skip

    def dispatch(agent: str, at: float) -> str:
        step = sum(isinstance(e, AgentDispatched) for e in events) + 1
        events.append(
            AgentDispatched(task_id=T, at=at, agent=agent, step=step, dispatch_id=f"d{step}")
        )
        return f"d{step}"

    def answer(agent: str, at: float, **fields: object) -> None:
        d = dispatch(agent, at - 0.5)
        events.append(OutputParsed(task_id=T, at=at, agent=agent, dispatch_id=d, fields=fields))

    d = dispatch("planner", 100.5)
    events.append(
        ParseFailed(task_id=T, at=101.0, agent="planner", dispatch_id=d, reason="no JSON object")
    )
    answer("planner", 102.0, sub_goal="multiply", tool_name="calculator")
    d = dispatch("executor", 102.5)
    for n, (ok, output) in enumerate([(False, "bad expression"), (True, "42")]):
        events.append(
            ToolCalled(
                task_id=T, at=103.0, agent="executor", dispatch_id=d, call_id=f"c{n}",
                tool="calculator", args={"expression": "6*7"}, ok=ok, output=output,
                error="" if ok else "SyntaxError",
            )
        )  # fmt: skip
    events.append(
        OutputParsed(task_id=T, at=103.4, agent="executor", dispatch_id=d, fields={"answer": "ran"})
    )
    answer("memory_verifier", 104.0, conclusion="CONTINUE")
    answer("planner", 105.0, sub_goal="check", tool_name="calculator")
    d = dispatch("executor", 105.5)
    events.append(
        AgentFailed(task_id=T, at=106.0, agent="executor", dispatch_id=d, error="provider down")
    )
    dispatch("planner", 106.5)
    return [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events, 1)]


def test_each_finished_step_is_a_record_with_its_turn_time_and_error_signals() -> None:
    records = memory(fold(T, steps()))
    assert [(r.turn, r.step, r.agent, r.elapsed_s) for r in records] == [
        (1, 1, "planner", 1.0),
        (1, 2, "planner", 2.0),  # a rerun is the same turn
        (1, 3, "executor", 3.4),
        (1, 4, "memory_verifier", 4.0),
        (2, 5, "planner", 5.0),
        (2, 6, "executor", 6.0),
    ]  # the planner dispatched last has not answered yet: no record
    assert records[0].error == "its answer did not parse: no JSON object"
    assert [(c.ok, c.output, c.error) for c in records[2].tool_calls] == [
        (False, "bad expression", "SyntaxError"),
        (True, "42", ""),
    ]
    assert records[5].error == "it failed: provider down"
    text = render_memory(records)
    assert text.startswith("Turn 1:\n- step 1, planner (at 1s):\n    error signal: its answer")
    assert "    tool call calculator(expression='6*7') -> error: SyntaxError" in text
    assert "    tool call calculator(expression='6*7') -> 42" in text
    assert "Turn 2:\n- step 5, planner (at 5s):\n    sub_goal: check" in text


def test_the_memory_is_the_same_however_the_events_arrive() -> None:
    events = steps()
    whole = memory(fold(T, events))
    for cut in range(len(events)):
        state = TaskState(T)
        for e in events[:cut]:
            apply(state, e)
        so_far = memory(state)
        assert so_far == whole[: len(so_far)]  # a record, once made, never changes
        for e in events[cut:]:
            apply(state, e)
        assert memory(state) == whole
    assert render_memory([]) == EMPTY
