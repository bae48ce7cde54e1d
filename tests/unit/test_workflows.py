"""Workflow files, their validation, the routing rules and the output parsers (all pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelflow.projections.counters import repeat_counters
from kernelflow.workflows.loader import (
    WorkflowError,
    catalogue,
    load_workflow,
    parse_workflow,
)
from kernelflow.workflows.model import FINISH, AgentSpec, OutputField, Workflow
from kernelflow.workflows.parsing import ParseError, parse_output
from kernelflow.workflows.rules import Outcome, illegal_agents, read_llm_decision, route


def counted(wf: Workflow, history: list[str]):  # type: ignore[no-untyped-def]
    return repeat_counters(history, wf.sequence_patterns)


def test_the_predefined_workflows_load() -> None:
    assert [w.name for w in catalogue()] == [
        "agentflow",
        "coder_only",
        "conductor_connect_all",
        "default",
        "verifier_only",
    ]
    default, _ = load_workflow("default")
    assert default.start_agent == "designer" and default.max_step == 20
    assert default.agents["verifier"].possible_next == ("finish", "coder")
    assert default.mandatory_llm_analysis == {"verifier"}
    connect_all, _ = load_workflow("conductor_connect_all")
    assert connect_all.single_agent_limit("coder") == 2
    assert connect_all.single_agent_limit("verifier") == 3  # the default when unset
    assert connect_all.sequences[0].pattern == ("coder", "verifier")


VALID = """
agent_info:
  coder:
    possible_next_agent: [verifier]
    output_format:
      parser_name: p
      parser_definition:
        output_fields:
          code: {field_type: str, mandatory: true}
  verifier:
    possible_next_agent: [finish, coder]
start_agent: coder
limitation_info:
  required: {max_step: 5}
"""


@pytest.mark.parametrize(
    "change, path, problem",
    [
        (("start_agent: coder", "start_agent: designer"), "start_agent", "not defined"),
        (("[finish, coder]", "[finish, coderr]"), "possible_next_agent[1]", "unknown agent"),
        (("max_step: 5", "max_step: -1"), "limitation_info.required.max_step", "positive"),
        (("required: {max_step: 5}", "required: {}"), "max_step", "missing"),
        (("field_type: str", "field_type: string"), "field_type", "unknown type"),
        (("start_agent: coder\n", ""), "start_agent", "missing"),
        (
            ("start_agent: coder", "start_agent: coder\nmandatory_llm_analysys: [coder]"),
            "mandatory_llm_analysys",
            "unknown key",
        ),
        (
            ("    possible_next_agent: [verifier]", "    possible_next_agents: [verifier]"),
            "agent_info.coder.possible_next_agents",
            "unknown key",
        ),
        (
            ("required: {max_step: 5}", "required: {max_step: 5}\n  optinal: {}"),
            "limitation_info.optinal",
            "unknown key",
        ),
        (("max_step: 5", "max_step: five"), "max_step", "positive integer"),
        (
            (
                "    possible_next_agent: [verifier]\n    output_format:",
                "    possible_next_agent: [verifier]\n    output_formatx:",
            ),
            "agent_info.coder.output_formatx",
            "unknown key",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    agent_kind: [react]",
            ),
            "agent_info.coder.agent_kind",
            "agent kind's name",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    tools: calculator",
            ),
            "agent_info.coder.tools",
            "list of tool names",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    tools: [python, python]",
            ),
            "agent_info.coder.tools[1]",
            "listed twice",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    tools: [{python: {time_s: 3}}]",
            ),
            "agent_info.coder.tools[0].python.time_s",
            "unknown key",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    tools: [{python: {timeout_s: 0}}]",
            ),
            "agent_info.coder.tools[0].python.timeout_s",
            "positive number",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    agent_config: [1]",
            ),
            "agent_info.coder.agent_config",
            "must be a mapping",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    prompt: {sytem: x}",
            ),
            "agent_info.coder.prompt.sytem",
            "unknown key",
        ),
        (
            (
                "    possible_next_agent: [verifier]",
                "    possible_next_agent: [verifier]\n    prompt: {user: ''}",
            ),
            "agent_info.coder.prompt.user",
            "non-empty",
        ),
    ],
)
def test_validation_names_the_key_path(change: tuple[str, str], path: str, problem: str) -> None:
    with pytest.raises(WorkflowError) as err:
        parse_workflow(VALID.replace(*change), "custom", source="custom.yaml")
    message = str(err.value)
    assert message.startswith("custom.yaml: ") and path in message and problem in message


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "agent_info: [coder]\nstart_agent: coder\nlimitation_info: {required: {max_step: 1}}",
            "agent_info: must be a mapping, got a list ['coder'] (line 1)",
        ),
        (
            "agent_info: {coder: [finish]}\nstart_agent: coder\n"
            "limitation_info: {required: {max_step: 1}}",
            "agent_info.coder: must be a mapping, got a list ['finish'] (line 1)",
        ),
        (
            "agent_info: {verifier: {possible_next_agent: finish}}\nstart_agent: verifier\n"
            "limitation_info: {required: {max_step: 1}}",
            "agent_info.verifier.possible_next_agent: must be a list of agent names, got a "
            "string 'finish' (write [finish]) (line 1)",
        ),
        ("", "(document): the workflow is empty"),
    ],
)
def test_structural_errors_name_the_key_path(text: str, message: str) -> None:
    with pytest.raises(WorkflowError) as err:
        parse_workflow(text, "w", source="w.yaml")
    assert str(err.value) == f"w.yaml: {message}"


def test_sequence_naming_an_unknown_agent_is_refused() -> None:
    text = VALID + (
        "  optional:\n    repeat_limits:\n      sequences:\n"
        "        loop: {pattern: [coder, tester], max_repeats: 2}\n"
    )
    with pytest.raises(WorkflowError, match=r"sequences\.loop\.pattern\[1\]: unknown agent"):
        parse_workflow(text, "custom")


def test_not_yaml_is_refused() -> None:
    with pytest.raises(WorkflowError, match="not valid YAML"):
        parse_workflow("agent_info: [", "broken")


def test_routing_of_the_default_workflow() -> None:
    wf, _ = load_workflow("default")
    after_designer = route(wf, counted(wf, ["designer"]), Outcome("designer"))
    assert (after_designer.action, after_designer.chosen) == ("run", "coder")
    passed = route(
        wf,
        counted(wf, ["designer", "coder", "verifier"]),
        Outcome("verifier", verification_passed=True, code_author="coder"),
    )
    # The only other next agent wrote the kernel that passed: finish, no LLM call.
    assert (passed.action, passed.chosen) == ("finish", FINISH)
    failed = route(
        wf,
        counted(wf, ["designer", "coder", "verifier"]),
        Outcome("verifier", verification_passed=False),
    )
    # finish is removed after a failure; verifier is under mandatory analysis.
    assert failed.action == "ask_llm" and failed.options == ("coder",)


def test_parse_failure_retries_the_agent_within_its_limits() -> None:
    connect_all, _ = load_workflow("conductor_connect_all")
    retry = route(
        connect_all,
        counted(connect_all, ["designer", "coder"]),
        Outcome("coder", parse_failed=True),
    )
    assert (retry.mode, retry.chosen) == ("retry", "coder")
    # Twice in a row is coder's limit there: no third run, even to retry a parse failure.
    limited = route(
        connect_all,
        counted(connect_all, ["designer", "coder", "coder"]),
        Outcome("coder", parse_failed=True),
    )
    assert limited.chosen != "coder" and "coder" not in limited.options
    # Seed 001 retries the agent whether or not it lists itself as a next agent.
    default, _ = load_workflow("default")
    no_self = route(
        default, counted(default, ["designer", "coder"]), Outcome("coder", parse_failed=True)
    )
    assert (no_self.mode, no_self.chosen) == ("retry", "coder")


def test_limits_make_agents_illegal() -> None:
    wf, _ = load_workflow("conductor_connect_all")
    history = ["designer", "coder", "verifier", "coder", "verifier", "coder", "verifier"]
    assert counted(wf, history).sequence_repeats("coder_verifier") == 3
    assert "coder" in illegal_agents(wf, counted(wf, history))
    assert set(illegal_agents(wf, counted(wf, ["coder"] * wf.max_step))) == set(wf.agents)
    end = route(
        wf,
        counted(wf, ["designer"] * 9 + ["verifier"]),
        Outcome("verifier", verification_passed=False),
    )
    assert end.action == "finish" and end.mode == "limit" and "max_step" in end.reason


def test_agent_failure_ends_the_task() -> None:
    wf, _ = load_workflow("default")
    assert (
        route(wf, counted(wf, ["designer"]), Outcome("designer", agent_failed=True)).action
        == "finish"
    )


@given(
    st.lists(st.sampled_from(["designer", "coder", "verifier"]), min_size=1, max_size=30),
    st.booleans(),
    st.booleans(),
)
def test_a_routed_agent_never_breaks_a_limit(
    history: list[str], parse_failed: bool, passed: bool
) -> None:
    wf, _ = load_workflow("conductor_connect_all")
    last = history[-1]
    r = route(
        wf,
        counted(wf, history),
        Outcome(last, parse_failed=parse_failed, verification_passed=passed),
    )
    if r.action == "run":
        assert r.chosen is not None
        nxt = [*history, r.chosen]
        assert len(nxt) <= wf.max_step
        assert r.chosen not in illegal_agents(wf, counted(wf, history))
    for option in r.options:
        retry = parse_failed and option == last
        assert option == FINISH or retry or option in wf.agents[last].possible_next


@pytest.mark.parametrize(
    "text, chosen, valid",
    [
        ('{"decision": "Coder", "error_and_suggestion": "mask the tail"}', "coder", True),
        (
            'Sure!\n```json\n{"decision": "designer", "error_and_suggestion": ""}\n```',
            "designer",
            True,
        ),
        ('{"decision": "deploy"}', "coder", False),
        ("I think the coder should go next", "coder", False),
    ],
)
def test_llm_decisions_are_validated_with_a_safe_fallback(
    text: str, chosen: str, valid: bool
) -> None:
    decision = read_llm_decision(("coder", "designer"), text)
    assert (decision.chosen, decision.valid) == (chosen, valid)


CODE_ONLY = AgentSpec("coder", ("verifier",), "p", (OutputField("code", "str", True),))


@pytest.mark.parametrize(
    "text, code",
    [
        ('{"code": "x = 1"}', "x = 1"),
        ('Here:\n```json\n{"code": "y = 2"}\n```', "y = 2"),
        ("Plan first.\n```python\nz = 3\n```\n", "z = 3\n"),
        ("<code>\nw = 4\n</code>", "w = 4"),
        ("draft:\n```python\nold\n```\nfinal:\n```python\nnew\n```", "new\n"),
    ],
)
def test_output_parser_accepts_the_documented_shapes(text: str, code: str) -> None:
    assert parse_output(CODE_ONLY, text) == {"code": code}


@pytest.mark.parametrize(
    "spec, text, reason",
    [
        (CODE_ONLY, "I could not do it.", "no output found"),
        (CODE_ONLY, '{"code": 5}', "must be str"),
        (CODE_ONLY, '{"code": "  "}', "is empty"),
        (
            AgentSpec(
                "a", (), "p", (OutputField("code", "str", True), OutputField("n", "int", True))
            ),
            '{"code": "x"}',
            "'n' is missing",
        ),
    ],
)
def test_output_parser_says_precisely_what_is_wrong(
    spec: AgentSpec, text: str, reason: str
) -> None:
    with pytest.raises(ParseError, match=reason):
        parse_output(spec, text)


TYPED = AgentSpec(
    "counter",
    (),
    "p",
    (
        OutputField("n", "int", True),
        OutputField("ratio", "float", True),
        OutputField("done", "bool", True),
        OutputField("items", "list", False),
        OutputField("note", "str", False),
    ),
)


def test_tagged_sections_fill_typed_fields() -> None:
    text = (
        "<n>42</n>\n<ratio> 2.5 </ratio>\n<done>True</done>\n<items>[1, 2]</items>\n<note>7</note>"
    )
    assert parse_output(TYPED, text) == {
        "n": 42, "ratio": 2.5, "done": True, "items": [1, 2], "note": "7",
    }  # fmt: skip
    assert parse_output(TYPED, "<n>3</n><ratio>1</ratio><done>false</done>")["ratio"] == 1
    for wrong, reason in [
        ("<n>4.5</n><ratio>1</ratio><done>true</done>", "'n' must be int, got float"),
        ("<n>four</n><ratio>1</ratio><done>true</done>", "'n' must be int, got str"),
        ("<n>4</n><ratio>1</ratio><done>yes</done>", "'done' must be bool, got str"),
        ("<n>true</n><ratio>1</ratio><done>true</done>", "'n' must be int, got bool"),
    ]:
        with pytest.raises(ParseError, match=reason):
            parse_output(TYPED, wrong)


def test_a_route_by_answer_outside_its_values_does_not_parse() -> None:
    agentflow, _ = load_workflow("agentflow")
    verifier = agentflow.agents["memory_verifier"]
    ok = parse_output(verifier, '{"conclusion": " stop\\n"}')
    assert verifier.route_by is not None and verifier.route_by.chosen(ok) == "solution_generator"
    with pytest.raises(ParseError, match="'conclusion' must be one of CONTINUE, STOP, got 'MAYBE'"):
        parse_output(verifier, '{"analysis": "?", "conclusion": "MAYBE"}')


def test_a_tool_field_names_one_of_the_workflows_tools() -> None:
    agentflow, _ = load_workflow("agentflow")
    assert agentflow.toolset == ("calculator", "python")
    planner = agentflow.agents["planner"]
    answer = '{"sub_goal": "multiply", "tool_name": " calculator "}'
    assert parse_output(planner, answer, tools=agentflow.toolset)["tool_name"] == "calculator"
    with pytest.raises(ParseError, match="one of the tools: calculator, python; got 'web_search'"):
        parse_output(planner, answer.replace("calculator", "web_search"), tools=agentflow.toolset)
    toolless = """
agent_info:
  planner:
    possible_next_agent: [finish]
    output_format:
      parser_definition:
        output_fields:
          tool_name: {field_type: tool, mandatory: true}
start_agent: planner
limitation_info: {required: {max_step: 2}}
"""
    with pytest.raises(WorkflowError, match="a tool field names one of the workflow's tools"):
        parse_workflow(toolless, "toolless")


def test_the_workflow_specifications_file_names_are_aliases() -> None:
    for name in ("default", "coder_only", "conductor_connect_all", "verifier_only"):
        workflow, text = load_workflow(f"{name}_workflow")
        assert (workflow.name, text) == (name, load_workflow(name)[1])
