"""Agent kinds are pure step functions over a dispatch's recorded calls: each test feeds
the kind the events a real run would record and checks what it does next."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelflow.actors.kinds import (
    AgentConfigError,
    CallLLM,
    Finish,
    GiveUp,
    RunTools,
    Turn,
    UnknownAgentKind,
    agent_kind,
    agent_kinds,
)
from kernelflow.actors.kinds.coding import codebase_state, phase_of
from kernelflow.actors.kinds.formats import FormatError, format_call, parse_call, parse_react
from kernelflow.events.model import ChatMessage, LLMCalled, ToolCalled, ToolUse
from kernelflow.workflows.model import AgentSpec, OutputField

CALC = {
    "name": "calculator",
    "description": "evaluate arithmetic",
    "parameters": {
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
}
PROMPT = [ChatMessage(role="system", content="sys"), ChatMessage(role="user", content="2+2?")]


def spec(kind: str, **config: Any) -> AgentSpec:
    return AgentSpec(
        name="solver",
        possible_next=("finish",),
        output_fields=(OutputField("answer", "str", True),),
        kind=kind,
        tools=("calculator",),
        config=config,
    )


def reply(seq: int, text: str, calls: list[ToolUse] | None = None) -> LLMCalled:
    return LLMCalled(
        task_id="t",
        seq=seq,
        agent="solver",
        dispatch_id="t:d1",
        provider="scripted",
        model="m",
        messages=[],
        response_text=text,
        tool_calls=calls or [],
    )


def result(call_id: str, output: str, ok: bool = True, tool: str = "calculator") -> ToolCalled:
    return ToolCalled(
        task_id="t",
        agent="solver",
        dispatch_id="t:d1",
        call_id=call_id,
        tool=tool,
        ok=ok,
        output=output,
        error="" if ok else output,
    )


def turn(llm: list[LLMCalled], tools: list[ToolCalled] | None = None, **kw: Any) -> Turn:
    return Turn(prompt=PROMPT, llm_calls=llm, tool_calls=tools or [], tools=[CALC], **kw)


def step(kind: str, t: Turn, **config: Any):  # type: ignore[no-untyped-def]
    return agent_kind(kind)(spec(kind, **config)).next_step(t)


def test_builtin_kinds_are_registered_and_unknown_kinds_are_named() -> None:
    assert {"llm", "react", "tool", "coding", "executor"} <= set(agent_kinds())
    with pytest.raises(UnknownAgentKind, match=r"'nope'.*known: coding, executor, llm"):
        agent_kind("nope")


def test_agent_config_is_checked_by_the_kind() -> None:
    with pytest.raises(AgentConfigError, match="max_stepz"):
        agent_kind("react")(spec("react", max_stepz=3))
    with pytest.raises(AgentConfigError, match="tool_format"):
        agent_kind("tool")(spec("tool", tool_format="xml"))


def test_llm_kind_is_one_call_then_its_answer() -> None:
    first = step("llm", turn([]))
    assert isinstance(first, CallLLM) and first.messages == PROMPT
    assert step("llm", turn([reply(2, "```python\nx\n```")])) == Finish("```python\nx\n```")
    assert step("llm", turn([reply(2, "so...\nFinal Answer: 4")])) == Finish("4", whole_answer=True)


def test_react_runs_an_action_then_finishes_on_the_final_answer() -> None:
    first = step("react", turn([]))
    assert isinstance(first, CallLLM)
    system = first.messages[0].content
    assert "Thought:" in system and "calculator(expression: string)" in system
    r1 = reply(2, "Thought: add them\nAction: calculator(expression='2+2')")
    run = step("react", turn([r1]))
    assert run == RunTools((ToolUse(id="t:2#0", name="calculator", args={"expression": "2+2"}),))
    again = step("react", turn([r1], [result("t:2#0", "4")]))
    assert isinstance(again, CallLLM)
    assert again.messages[-2] == ChatMessage(role="assistant", content=r1.response_text)
    assert again.messages[-1].content == "Observation (calculator): 4"
    r2 = reply(4, "Thought: done\nFinal Answer: 4")
    assert step("react", turn([r1, r2], [result("t:2#0", "4")])) == Finish("4", whole_answer=True)


def test_react_asks_for_a_thought_before_an_action_when_configured() -> None:
    bare = reply(2, "Action: calculator(expression='1')")
    nxt = step("react", turn([bare]))
    assert isinstance(nxt, CallLLM)
    assert "write a Thought: line before each Action" in nxt.messages[-1].content
    relaxed = step("react", turn([bare]), require_thought_before_action=False)
    assert isinstance(relaxed, RunTools)


def test_react_nudges_after_too_many_thoughts_and_gives_up_at_max_steps() -> None:
    thoughts = [reply(i + 2, f"Thought: hmm {i}") for i in range(3)]
    nxt = step("react", turn(thoughts), max_consecutive_thoughts=3)
    assert isinstance(nxt, CallLLM)
    assert "Act now" in nxt.messages[-1].content
    assert "Act now" not in nxt.messages[-3].content  # earlier replies read as they did
    out = step("react", turn(thoughts), max_steps=3)
    assert isinstance(out, GiveUp) and "max_steps" in out.error


def test_react_reports_unreadable_actions_and_reflects_on_failures() -> None:
    bad = reply(2, "Thought: x\nAction: calculator(expression=open('f'))")
    nxt = step("react", turn([bad]))
    assert isinstance(nxt, CallLLM) and "could not be read" in nxt.messages[-1].content
    r1 = reply(2, "Thought: x\nAction: calculator(expression='1/0')")
    failed = step("react", turn([r1], [result("t:2#0", "error: division by zero", ok=False)]))
    assert isinstance(failed, CallLLM) and "Reflect" in failed.messages[-1].content


def test_react_native_tool_use_sends_tools_and_tool_messages() -> None:
    use = ToolUse(id="toolu_1", name="calculator", args={"expression": "2+2"})
    first = step("react", turn([]), tool_format="native")
    assert isinstance(first, CallLLM) and first.tools == [CALC]
    r1 = reply(2, "I will compute it.", [use])
    assert step("react", turn([r1]), tool_format="native") == RunTools((use,))
    nxt = step("react", turn([r1], [result("toolu_1", "4")]), tool_format="native")
    assert isinstance(nxt, CallLLM)
    assert nxt.messages[-2].tool_calls == [use]
    assert nxt.messages[-1] == ChatMessage(role="tool", content="4", tool_call_id="toolu_1")
    r2 = reply(4, "The answer is 4.")
    done = step("react", turn([r1, r2], [result("toolu_1", "4")]), tool_format="native")
    assert done == Finish("The answer is 4.", whole_answer=True)


def test_tool_kind_runs_several_calls_per_step_within_its_limit() -> None:
    r1 = reply(2, "\n".join(f"TOOL_CALL: calculator(expression='{i}+1')" for i in range(4)))
    run = step("tool", turn([r1]), max_calls_per_step=3)
    assert isinstance(run, RunTools) and [c.id for c in run.calls] == ["t:2#0", "t:2#1", "t:2#2"]
    results = [result(f"t:2#{i}", str(i + 1)) for i in range(3)]
    nxt = step("tool", turn([r1], results), max_calls_per_step=3)
    assert isinstance(nxt, CallLLM)
    assert "Only the first 3 tool calls were run" in nxt.messages[-1].content
    single = step("tool", turn([r1]), allow_multiple=False)
    assert isinstance(single, RunTools) and len(single.calls) == 1
    r2 = reply(4, "The sums are 1, 2 and 3.")
    assert step("tool", turn([r1, r2], results)) == Finish(r2.response_text, whole_answer=True)


def test_tool_kind_can_require_a_tool_before_answering() -> None:
    nxt = step("tool", turn([reply(2, "It is 4.")]), require_tool_usage=True)
    assert isinstance(nxt, CallLLM) and "Use at least one tool" in nxt.messages[-1].content


def test_coding_state_and_phases_follow_what_the_agent_did() -> None:
    def r(tool: str, ok: bool = True, **args: Any) -> ToolCalled:
        return result("x", "out", ok=ok, tool=tool).__replace__(args=args)  # type: ignore[attr-defined]

    assert phase_of(codebase_state([]), 3) == "understanding"
    explored = [r("view_file", path="a.py"), r("search_code", pattern="def")]
    assert phase_of(codebase_state(explored), 3) == "exploration"
    assert phase_of(codebase_state([*explored, r("search_files", glob="*")]), 3) == "planning"
    edited = [*explored, r("edit_file", path="a.py", old_str="a", new_str="b")]
    assert phase_of(codebase_state(edited), 3) == "implementation"
    failing = [*edited, r("run_tests", ok=False)]
    state = codebase_state(failing)
    assert phase_of(state, 3) == "refinement" and state.tests_failed == 1
    assert state.modified_files == {"a.py"} and state.viewed_files == {"a.py"}
    fixed = [*failing, r("edit_file", path="a.py", old_str="b", new_str="c")]
    assert phase_of(codebase_state(fixed), 3) == "refinement"
    assert phase_of(codebase_state([*fixed, r("run_tests")]), 3) == "testing"


def test_coding_kind_answers_with_its_answer_file() -> None:
    r1 = reply(2, "Thought: done\nFinal Answer: candidate.py is ready")
    files = {"candidate.py": "class ModelNew: ...\n"}
    out = step("coding", turn([r1], files=files), answer_file="candidate.py")
    assert out == Finish("```python\nclass ModelNew: ...\n```\n")


# --------------------------------------------------------------------------- formats

PARAMS = {"calculator": CALC["parameters"], "edit": {"properties": {"path": {}, "text": {}}}}
literals = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    name=st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True),
    args=st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), literals),
    tail=st.sampled_from(["", "\nObservation: ignored", " and more text )"]),
)
def test_parse_call_reads_back_what_format_call_writes(  # type: ignore[no-untyped-def]
    name, args, tail
) -> None:
    import keyword

    if keyword.iskeyword(name) or any(keyword.iskeyword(k) for k in args):
        return
    text = format_call(name, args)
    call, end = parse_call(text + tail, PARAMS)
    assert (call.name, call.args) == (name, args)
    assert end == len(text)


def test_parse_call_maps_positional_and_dict_arguments() -> None:
    assert parse_call("calculator('1+1')", PARAMS)[0].args == {"expression": "1+1"}
    as_dict = parse_call('edit({"path": "a", "text": "b"})', PARAMS)[0]
    assert as_dict.args == {"path": "a", "text": "b"}
    multi_line = parse_call('edit("a", text="""x\ny)""")', PARAMS)[0]
    assert multi_line.args == {"path": "a", "text": "x\ny)"}
    for bad, why in [
        ("calculator(__import__('os'))", "literals"),
        ("calculator('a', 'b')", "2 positional arguments"),
        ("calculator(**{'a': 1})", r"\*\*kwargs"),
        ("calculator('unclosed", "unbalanced"),
        ("no call here", "expected a call"),
    ]:
        with pytest.raises(FormatError, match=why):
            parse_call(bad, PARAMS)


@given(st.text(max_size=200))
def test_parse_react_never_raises(text: str) -> None:
    parse_react(text, PARAMS)


def test_workflow_tool_limits_apply_and_instances_are_shared_per_process() -> None:
    from kernelflow.actors.agents import tools_of

    limited = AgentSpec(
        name="solver",
        possible_next=("finish",),
        kind="react",
        tools=("calculator", "python"),
        tool_limits={"calculator": {"calls_per_minute": 1, "timeout_s": 2}},
    )
    tools = tools_of(limited)
    assert tools["calculator"].limits.calls_per_minute == 1
    assert tools["calculator"].limits.timeout_s == 2
    assert tools["python"].limits == type(tools["python"]).default_limits()
    assert tools_of(limited)["calculator"] is tools["calculator"]  # one rate limit per daemon


@pytest.mark.parametrize(
    "change, message",
    [
        ({"agent_kind": "reactt"}, "agent_info.solver.agent_kind: unknown agent kind 'reactt'"),
        ({"tools": ["calc"]}, "agent_info.solver.tools[0]: unknown tool 'calc'"),
        ({"agent_config": {"max_steps": "ten"}}, "agent_info.solver.agent_config"),
        ({"agent_kind": "llm"}, "agent_info.solver.tools: agent kind 'llm' makes no tool calls"),
    ],
)
def test_submitted_workflows_are_checked_against_the_registries(
    change: dict[str, Any], message: str
) -> None:
    """What the conductor (and the CLI before publishing) refuses, with the key path."""
    from kernelflow.actors.kinds.check import check_agents
    from kernelflow.workflows.loader import WorkflowError, parse_workflow

    solver: dict[str, Any] = {
        "agent_kind": "react",
        "tools": ["calculator"],
        "possible_next_agent": ["finish"],
        "output_format": {"parser_definition": {"output_fields": {"answer": {}}}},
    }
    doc = {
        "agent_info": {"solver": {**solver, **change}},
        "start_agent": "solver",
        "limitation_info": {"required": {"max_step": 1}},
    }
    valid = {**doc, "agent_info": {"solver": solver}}
    check_agents(parse_workflow(json.dumps(valid), "ok"))
    with pytest.raises(WorkflowError, match=re.escape(message)):
        check_agents(parse_workflow(json.dumps(doc), "w"))
