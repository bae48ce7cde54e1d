"""The built-in verifier, the field it checks, and agents that choose what follows them
(docs/workflows.md, "The verifier" and "Routing"): the workflow spec's own custom
workflow, copied verbatim, validates; a verifier a workflow names without defining
finishes on a pass and goes back to the agent whose code failed; the code field is
``code``, else the one mandatory string field, else the one ``code_field`` names;
``route_by`` answers route."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.projections.counters import repeat_counters
from kernelflow.workflows.loader import WorkflowError, load_workflow, parse_workflow
from kernelflow.workflows.model import FINISH, VERIFIER, Workflow
from kernelflow.workflows.rules import Outcome, route
from tests.conftest import EXAMPLES

SEED_CUSTOM = EXAMPLES / "workflows" / "custom_workflow.yaml"
# Two agents hand over to a verifier nobody defines; the tuner may repeat itself.
TWO_AUTHORS = """
agent_info:
  coder:
    possible_next_agent: [verifier, tuner]
    output_format:
      parser_definition:
        output_fields: {code: {field_type: str, mandatory: true}}
  tuner:
    possible_next_agent: [verifier, tuner]
    output_format:
      parser_definition:
        output_fields:
          notes: {field_type: str}
          kernel: {field_type: str, mandatory: true}
start_agent: coder
limitation_info:
  required: {max_step: 8}
  optional:
    repeat_limits: {single_agent: {tuner: 2}}
"""


def problems(text: str) -> str:
    with pytest.raises(WorkflowError) as err:
        parse_workflow(text, "mine", source="mine.yaml")
    return str(err.value)


def test_the_seed_custom_workflow_validates_as_written() -> None:
    workflow, _ = load_workflow(str(SEED_CUSTOM))
    optimizer, verifier = workflow.agents["custom_optimizer"], workflow.agents[VERIFIER]
    assert verifier.built_in and verifier.possible_next == (FINISH, "custom_optimizer")
    assert optimizer.code_field == "optimized_code"
    assert optimizer.code_in({"optimized_code": "class ModelNew: ..."}) == "class ModelNew: ..."
    assert (workflow.start_agent, workflow.max_step) == ("custom_optimizer", 15)
    assert workflow.mandatory_llm_analysis == {"custom_optimizer"}


def test_the_code_field_is_code_or_the_one_mandatory_string() -> None:
    workflow = parse_workflow(TWO_AUTHORS, "two")
    assert workflow.agents["coder"].code_field == "code"
    assert workflow.agents["tuner"].code_field == "kernel"  # notes is not mandatory
    assert workflow.agents[VERIFIER].possible_next == (FINISH, "coder", "tuner")


def test_an_unclear_code_field_is_refused_saying_how_to_name_it() -> None:
    unclear = TWO_AUTHORS.replace(
        "notes: {field_type: str}", "notes: {field_type: str, mandatory: true}"
    )
    assert (
        "mine.yaml: agent_info.tuner.output_format.parser_definition.output_fields: 'tuner' "
        "hands over to the verifier, which checks one string field of its answer, but it "
        "has no 'code' field nor a single mandatory string field: name the field to check "
        "with code_field: FIELD under agent_info.tuner (declared: notes: str, kernel: str)"
    ) in problems(unclear)
    named = unclear.replace("  tuner:\n", "  tuner:\n    code_field: kernel\n")
    assert parse_workflow(named, "named").agents["tuner"].code_field == "kernel"
    misnamed = unclear.replace("  tuner:\n", "  tuner:\n    code_field: kernal\n")
    assert (
        "agent_info.tuner.code_field: must name one of the agent's string fields (notes, "
        "kernel), got a string 'kernal'; did you mean 'kernel'?"
    ) in problems(misnamed)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["coder", "tuner", VERIFIER]), min_size=1, max_size=9),
    st.sampled_from(["coder", "tuner", None]),
    st.booleans(),
)
def test_the_built_in_verifier_finishes_a_pass_and_returns_a_failure_to_its_author(
    earlier: list[str], author: str | None, passed: bool
) -> None:
    workflow = parse_workflow(TWO_AUTHORS, "two")
    history = [*earlier, VERIFIER]
    counters = repeat_counters(history, workflow.sequence_patterns)
    r = route(workflow, counters, Outcome(VERIFIER, verification_passed=passed, code_author=author))
    if passed:
        assert (r.action, r.chosen, r.mode) == ("finish", FINISH, "auto")
        return
    assert FINISH not in r.options  # a failure never ends the task as done
    # In the one step left, only the verifier may run: no check could follow an author.
    may_rerun = (
        author is not None
        and len(history) < workflow.max_step - 1
        and counters.consecutive(author) < workflow.single_agent_limit(author)
    )
    if may_rerun:
        assert (r.action, r.chosen, r.options) == ("run", author, (author,))
    else:  # nobody wrote it, or the limits forbid the author: the task ends (failed)
        assert (r.action, r.chosen) == ("finish", FINISH)


ROUTED = """
agent_info:
  planner:
    possible_next_agent: [judge_step]
  judge_step:
    possible_next_agent: [planner, writer]
    output_format:
      parser_definition:
        output_fields: {verdict: {field_type: str, mandatory: true}}
    route_by:
      field: verdict
      values: {CONTINUE: planner, STOP: writer}
  writer:
    possible_next_agent: [finish]
start_agent: planner
limitation_info:
  required: {max_step: 12}
  optional:
    repeat_limits:
      sequences:
        turn: {pattern: [planner, judge_step], max_repeats: 2}
"""


@pytest.mark.parametrize(
    "history, answer, expected",
    [
        (["planner", "judge_step"], "stop", ("run", "writer", "auto")),
        (["planner", "judge_step"], " Continue ", ("run", "planner", "auto")),
        # Two turns: the sequence limit takes the planner out, whatever the answer says.
        (["planner", "judge_step"] * 2, "CONTINUE", ("run", "writer", "limit")),
        # An answer that names no agent leaves the choice to the conductor's LLM.
        (["planner", "judge_step"], "maybe", ("ask_llm", None, "auto")),
    ],
)
def test_an_agent_with_route_by_chooses_what_follows_it(
    history: list[str], answer: str, expected: tuple[str, str | None, str]
) -> None:
    workflow: Workflow = parse_workflow(ROUTED, "routed")
    counters = repeat_counters(history, workflow.sequence_patterns)
    r = route(workflow, counters, Outcome("judge_step", output={"verdict": answer}))
    assert (r.action, r.chosen, r.mode) == expected


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("STOP: writer", "STOP: finish"),
            "values.STOP: a string 'finish' is not one of possible_next_agent (planner, writer)",
        ),
        (
            ("field: verdict", "field: verdikt"),
            "route_by.field: must name one of the agent's "
            "string fields (verdict), got a string 'verdikt'; did you mean 'verdict'?",
        ),
        (
            ("STOP: writer", "yes: writer"),
            "route_by.values.True: must be an answer's text, got a boolean True (quote it",
        ),
        (("STOP: writer", "stop: writer, STOP: planner"), "'STOP' is given twice"),
    ],
)
def test_a_bad_route_by_is_refused_with_its_key_path(change: tuple[str, str], message: str) -> None:
    assert message in problems(ROUTED.replace(*change))


def test_limitation_info_is_required_unless_the_file_extends_a_workflow() -> None:
    text = SEED_CUSTOM.read_text().split("limitation_info:")[0]
    assert (
        "mine.yaml: limitation_info: missing required key (or extend a workflow that has "
        "one: base: default)"
    ) in problems(text)
    # A workflow given as text (a submit command's) is recorded as it is: it must be whole.
    assert "mine.yaml: base: only a workflow file may extend another" in problems(
        "base: default\n" + text
    )


def test_trainable_agents_name_llm_agents() -> None:
    assert "trainable_agents[0]: the verifier is a program" in problems(
        TWO_AUTHORS + "trainable_agents: [verifier]\n"
    )
    assert "trainable_agents[0]: unknown agent 'codr'; did you mean 'coder'?" in problems(
        TWO_AUTHORS + "trainable_agents: [codr]\n"
    )
    trained = parse_workflow(TWO_AUTHORS + "trainable_agents: [tuner]\n", "two")
    assert trained.trainable_agents == {"tuner"}
