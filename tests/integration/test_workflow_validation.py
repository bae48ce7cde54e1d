"""Malformed workflows are refused with every problem listed (key path, line, "did you
mean"), through the validator and the real CLI; workflows without ``output_format`` (seed
001 makes it optional) answer in free text and run; a task that starts with the verifier
needs a candidate; a malformed workflow published inline is rejected at its first
delivery."""

from __future__ import annotations

import copy
import json
import queue
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.conductor import Conductor
from kernelflow.actors.kinds.check import check_agents
from kernelflow.actors.worker import Message
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import AgentDispatched, OutputParsed, SubmitTask, TaskRejected
from kernelflow.workflows.loader import (
    WorkflowError,
    load_workflow,
    parse_recorded_workflow,
    parse_workflow,
)
from kernelflow.workflows.model import AgentSpec
from kernelflow.workflows.parsing import ParseError, parse_output
from kernelflow.workflows.validate import (
    FIELD_KEYS,
    LLM_AGENT_KEYS,
    OUTPUT_FORMAT_KEYS,
    TOOL_LIMIT_KEYS,
    TOP_KEYS,
)
from tests.conftest import REPO, as_user, run_cli
from tests.daemons import task_events
from tests.memory import answers_to, running_bridge

RELU = "examples/tasks/relu.py"
NOWHERE = "nats://127.0.0.1:9"  # refused before anything is published: never reached
DEFAULT = (REPO / "workflows" / "default.yaml").read_text()
CODER_FIELDS = '            mandatory: true\n            field_description: "The complete'

# The default workflow as it may be written: no output_format anywhere (docs/workflows.md).
SEED_FORMAT = """
agent_info:
  designer:
    possible_next_agent: [coder]
  coder:
    possible_next_agent: [verifier]
  verifier:
    possible_next_agent: [finish, coder]
start_agent: designer
mandatory_llm_analysis: [verifier]
limitation_info:
  required:
    max_step: 20
"""


def line_of(text: str, fragment: str) -> int:
    """The number of the first line of ``text`` holding ``fragment``."""
    return next(n for n, line in enumerate(text.splitlines(), 1) if fragment in line)


def with_optional(limits: str) -> str:
    """The default workflow with ``limits`` (YAML below ``optional:``) added."""
    return DEFAULT + "  optional:\n" + limits


# name: (the workflow's text, what each of its problems must say, key path first)
MALFORMED = {
    "repeat_limit": (
        with_optional("    repeat_limit:\n      single_agent: {coder: 2}\n"),
        ["limitation_info.optional.repeat_limit: unknown key; did you mean 'repeat_limits'?"],
    ),
    "single_agents": (
        with_optional("    repeat_limits:\n      single_agents: {coder: 2}\n"),
        [
            "limitation_info.optional.repeat_limits.single_agents: unknown key; "
            "did you mean 'single_agent'?"
        ],
    ),
    "sequence": (
        with_optional(
            "    repeat_limits:\n      sequence:\n"
            "        cv: {pattern: [coder, verifier], max_repeats: 2}\n"
        ),
        ["limitation_info.optional.repeat_limits.sequence: unknown key; did you mean 'sequences'?"],
    ),
    "mandatry": (
        DEFAULT.replace(CODER_FIELDS, CODER_FIELDS.replace("mandatory", "mandatry")),
        [
            "agent_info.coder.output_format.parser_definition.output_fields.code.mandatry: "
            "unknown key; did you mean 'mandatory'?"
        ],
    ),
    "parser_nme": (
        DEFAULT.replace("parser_name: coder_parser", "parser_nme: coder_parser"),
        ["agent_info.coder.output_format.parser_nme: unknown key; did you mean 'parser_name'?"],
    ),
    "max_stepz": (
        DEFAULT.replace("max_step: 20", "max_stepz: 20"),
        [
            "limitation_info.required.max_step: missing required key",
            "limitation_info.required.max_stepz: unknown key; did you mean 'max_step'?",
        ],
    ),
    "max_step quoted": (
        DEFAULT.replace("max_step: 20", 'max_step: "20"'),
        [
            "limitation_info.required.max_step: must be a positive integer, got a string "
            "'20' (write the number without quotes)"
        ],
    ),
    "duplicate agent": (
        DEFAULT.replace(
            "  verifier:\n", "  coder:\n    possible_next_agent: [verifier]\n  verifier:\n"
        ),
        [
            f"agent_info.coder: duplicate key, first at line {line_of(DEFAULT, '  coder:')}: "
            "YAML keeps only the last one"
        ],
    ),
    "unreachable agent": (
        DEFAULT.replace(
            "  verifier:\n", "  optimizer:\n    possible_next_agent: [verifier]\n  verifier:\n"
        ),
        ["agent_info.optimizer: no path from start_agent 'designer' reaches 'optimizer'"],
    ),
    "designer-coder cycle": (
        DEFAULT.replace("possible_next_agent: [verifier]", "possible_next_agent: [designer]"),
        [
            "agent_info.designer.possible_next_agent: no path from 'designer' leads to finish",
            "agent_info.coder.possible_next_agent: no path from 'coder' leads to finish",
            "agent_info.verifier: no path from start_agent 'designer' reaches 'verifier'",
        ],
    ),
    "empty output_format": (
        SEED_FORMAT.replace("[verifier]\n", "[verifier]\n    output_format: {}\n", 1),
        ["agent_info.coder.output_format: is empty"],
    ),
    "no output fields": (
        SEED_FORMAT.replace(
            "[verifier]\n",
            "[verifier]\n    output_format:\n      parser_definition: {output_fields: {}}\n",
            1,
        ),
        ["agent_info.coder.output_format.parser_definition.output_fields: no fields declared"],
    ),
    "verifier gets no code": (
        SEED_FORMAT.replace(
            "[verifier]\n",
            "[verifier]\n    output_format:\n      parser_definition:\n"
            "        output_fields: {kernel: {field_type: str}}\n",
            1,
        ),
        [
            "agent_info.coder.output_format.parser_definition.output_fields: 'coder' hands "
            "over to the verifier, which checks one string field of its answer, but it has no "
            "'code' field nor a single mandatory string field: name the field to check with "
            "code_field: FIELD under agent_info.coder (declared: kernel: str, optional)"
        ],
    ),
    "mandatory_llm_analysis string": (
        DEFAULT.replace("mandatory_llm_analysis: [verifier]", "mandatory_llm_analysis: coder"),
        [
            "mandatory_llm_analysis: must be a list of agent names, got a string 'coder' "
            "(write [coder])"
        ],
    ),
    "start_agent list": (
        DEFAULT.replace("start_agent: designer", "start_agent: [coder]"),
        ["start_agent: must be one agent's name, got a list ['coder'] (write start_agent: coder)"],
    ),
    "unknown next agent": (
        DEFAULT.replace("[finish, coder]", "[finish, codr]"),
        ["agent_info.verifier.possible_next_agent[1]: unknown agent 'codr'; did you mean 'coder'?"],
    ),
}
SEVERAL = (
    DEFAULT.replace("parser_name: coder_parser", "parser_nme: coder_parser")
    .replace(CODER_FIELDS, CODER_FIELDS.replace("mandatory", "mandatry"))
    .replace("start_agent: designer", "start_agent: [designer]")
    .replace("mandatory_llm_analysis: [verifier]", "mandatory_llm_analysis: verifier")
    + "  optional:\n    repeat_limit: {}\n"
)
SEVERAL_PATHS = [
    "agent_info.coder.output_format.parser_nme",
    "agent_info.coder.output_format.parser_definition.output_fields.code.mandatry",
    "start_agent",
    "mandatory_llm_analysis",
    "limitation_info.optional.repeat_limit",
]


@pytest.mark.parametrize("case", MALFORMED)
def test_each_problem_is_named_with_its_key_path(case: str) -> None:
    text, expected = MALFORMED[case]
    with pytest.raises(WorkflowError) as err:
        parse_workflow(text, "mine", source="mine.yaml")
    for problem in expected:
        assert f"mine.yaml: {problem}" in str(err.value), str(err.value)
    assert len(err.value.problems) == len(expected), str(err.value)


def test_every_problem_of_a_file_is_listed_with_its_line() -> None:
    with pytest.raises(WorkflowError) as err:
        parse_workflow(SEVERAL, "mine", source="mine.yaml")
    lines = str(err.value).splitlines()
    assert lines[0] == "mine.yaml: 5 problems:"
    # In the file's order, each with the line of its key.
    located = [(line.split(": ")[1], line.rsplit(" ", 1)[1]) for line in lines[1:]]
    assert located == [
        (path, f"{line_of(SEVERAL, fragment)})")
        for path, fragment in [
            ("agent_info.coder.output_format.parser_nme", "parser_nme"),
            (
                "agent_info.coder.output_format.parser_definition.output_fields.code.mandatry",
                "mandatry",
            ),
            ("start_agent", "start_agent"),
            ("mandatory_llm_analysis", "mandatory_llm_analysis"),
            ("limitation_info.optional.repeat_limit", "repeat_limit"),
        ]
    ]


@pytest.mark.parametrize("case", MALFORMED)
def test_the_cli_refuses_a_malformed_workflow_with_every_problem(case: str, tmp_path: Path) -> None:
    text, expected = MALFORMED[case]
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    result = run_cli("workflow", "validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for problem in expected:
        assert f"{path}: {problem}" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["validate", "run", "submit"])
def test_run_and_submit_refuse_a_workflow_file_with_all_its_problems(
    command: str, tmp_path: Path
) -> None:
    path = tmp_path / "several.yaml"
    path.write_text(SEVERAL)
    args = {
        "validate": ["workflow", "validate", str(path)],
        "run": ["run", RELU, "--workflow", str(path), "--llm", "scripted:x"],
        "submit": ["submit", RELU, "--workflow", str(path), "--nats-url", NOWHERE],
    }[command]
    result = run_cli(*args, "--data-dir", str(tmp_path)) if command == "run" else run_cli(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"kernelflow: {path}: 5 problems:" in result.stderr
    for key_path in SEVERAL_PATHS:
        assert f"\n{path}: {key_path}: " in result.stderr, result.stderr


def test_a_duplicate_key_anywhere_is_refused_with_both_lines() -> None:
    text = DEFAULT.replace("max_step: 20", "max_step: 20\n    max_step: 25")
    first, again = line_of(text, "max_step: 20"), line_of(text, "max_step: 25")
    with pytest.raises(WorkflowError) as err:
        parse_workflow(text, "mine")
    assert str(err.value) == (
        f"mine: limitation_info.required.max_step: duplicate key, first at line {first}: YAML "
        f"keeps only the last one; remove or rename the other (line {again})"
    )


def test_a_workflow_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(DEFAULT.replace("sketches", "esquisse\xe9").encode("latin-1"))
    with pytest.raises(WorkflowError, match="cannot read workflow file: 'utf-8' codec"):
        load_workflow(str(path))


def test_a_recorded_workflow_keeps_running_whatever_rules_were_added_since() -> None:
    """A task in the log was accepted under the rules of its day: an unknown key that
    older versions ignored is still ignored for it, but refused for a new submission."""
    lax = with_optional("    repeat_limit:\n      single_agent: {coder: 2}\n")
    with pytest.raises(WorkflowError):
        parse_workflow(lax, "default")
    recorded = parse_recorded_workflow(lax, "default")
    assert recorded == parse_workflow(DEFAULT, "default")
    with pytest.raises(WorkflowError, match="start_agent: must be one agent's name"):
        parse_recorded_workflow(MALFORMED["start_agent list"][0], "default")


# ---------------------------------------------------------------- free-text agents


FREE_CODER = AgentSpec("coder", ("verifier",))
FREE_DESIGNER = AgentSpec("designer", ("coder",))


@pytest.mark.parametrize(
    "spec, text, fields",
    [
        (
            FREE_CODER,
            "Masked loads cover the tail.\n```python\nx = 1\n```\n",
            {"answer": "Masked loads cover the tail.\n```python\nx = 1\n```", "code": "x = 1\n"},
        ),
        (
            FREE_CODER,
            "Draft:\n```python\nold\n```\nFinal:\n```\nnew\n```",
            {"answer": "Draft:\n```python\nold\n```\nFinal:\n```\nnew\n```", "code": "new\n"},
        ),
        (FREE_DESIGNER, "  A plan in words only.  ", {"answer": "A plan in words only."}),
        (FREE_DESIGNER, '```json\n{"a": 1}\n```', {"answer": '```json\n{"a": 1}\n```'}),
    ],
)
def test_an_agent_without_output_format_answers_in_free_text(
    spec: AgentSpec, text: str, fields: dict[str, str]
) -> None:
    assert parse_output(spec, text) == fields


@pytest.mark.parametrize("text", ["I could not do it.", '```json\n{"code": "x = 1"}\n```'])
def test_a_free_text_answer_for_the_verifier_without_code_fails_to_parse(text: str) -> None:
    """Retried (docs/workflows.md, "Routing"), rather than a verifier step spent on no code."""
    with pytest.raises(ParseError, match="no code found: give the complete module as one"):
        parse_output(FREE_CODER, text)


def test_an_empty_free_text_answer_fails_to_parse() -> None:
    with pytest.raises(ParseError, match="the answer is empty"):
        parse_output(FREE_DESIGNER, " \n ")


def test_a_seed_format_workflow_without_output_format_is_valid() -> None:
    workflow = parse_workflow(SEED_FORMAT, "seed")
    assert all(not spec.output_fields for spec in workflow.agents.values())
    check_agents(workflow)


def test_a_seed_format_workflow_without_output_format_runs(nats_url: str, tmp_path: Path) -> None:
    """The default flow with free-text agents, on the default's scripted answers: the
    coder's fenced block is what the verifier checks, and what the task ends with."""
    path = tmp_path / "seed_format.yaml"
    path.write_text(SEED_FORMAT)
    run = run_cli(
        "run", RELU, "--workflow", str(path), "--llm", "scripted:examples/scripted/relu.yaml",
        "--json", *as_user("daemon", nats_url), "--out", str(tmp_path / "out"),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["status"] == "success"
    assert result["verifications"] == ["mismatch", "pass"], result
    script = yaml.safe_load((REPO / "examples/scripted/relu.yaml").read_text())
    fenced = re.search(r"```python\n(.*?)```", script["coder"][1]["text"], re.DOTALL)
    assert fenced is not None and result["final_code"] == fenced.group(1)
    events = task_events(nats_url, result["task_id"])
    agents = [e.agent for e in events if isinstance(e, AgentDispatched)]
    assert agents == ["designer", "coder", "verifier", "coder", "verifier"]
    last_coder = [e.fields for e in events if isinstance(e, OutputParsed) and e.agent == "coder"]
    answer = script["coder"][1]["text"].strip()
    assert last_coder[-1] == {"answer": answer, "code": fenced.group(1)}


# ---------------------------------------------------------------- verifier_only


@pytest.mark.parametrize("command", ["run", "submit"])
def test_verifier_only_without_a_candidate_is_refused_up_front(
    command: str, tmp_path: Path
) -> None:
    args = ["--nats-url", NOWHERE] if command == "submit" else ["--data-dir", str(tmp_path)]
    result = run_cli(command, RELU, "--workflow", "verifier_only", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr == (
        "kernelflow: verifier_only: start_agent: the workflow starts with the verifier, which "
        "checks code given with the task: pass the code to check (--candidate FILE; "
        "candidate_code in a submit command)\n"
    )


def test_workflow_validate_says_verifier_only_needs_a_candidate() -> None:
    result = run_cli("workflow", "validate", "verifier_only")
    assert result.returncode == 0
    assert "verifier_only: starts with the verifier: submit it with --candidate FILE" in (
        result.stdout
    )


# ---------------------------------------------------------------- published inline


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    # The conductor's checks, handed the command directly: on the memory log.
    with running_bridge() as b:
        yield b


@pytest.mark.parametrize(
    "workflow, workflow_yaml, expected",
    [
        ("several", SEVERAL, [f"several: {p}: " for p in SEVERAL_PATHS]),
        (
            "verifier_only",
            None,
            ["verifier_only: start_agent: the workflow starts with the verifier"],
        ),
    ],
    ids=["malformed", "verifier_only-without-candidate"],
)
def test_a_submit_command_with_a_bad_workflow_is_rejected_at_its_first_delivery(
    bridge: Bridge, workflow: str, workflow_yaml: str | None, expected: list[str]
) -> None:
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    command = SubmitTask(
        task_id=task_id,
        task_source=(REPO / RELU).read_text(),
        task_name="relu",
        workflow_name=workflow,
        workflow_yaml=workflow_yaml,
    )
    inbox = "_INBOX.test"
    replies = answers_to(bridge.server, inbox)
    message = Message(
        source="command",
        subject=subjects.SUBMIT,
        data=encode(command),
        headers={subjects.REPLY_HEADER: inbox},
        stream_seq=1,
        deliveries=1,
    )
    assert Conductor(bridge, llm=None).handle(message) == "ack"  # answered: never redelivered
    reply = replies.get(timeout=10)
    assert reply["ok"] is False and reply["task_id"] == task_id
    [rejected] = bridge.call(bridge.log.read_task(task_id)).events
    assert isinstance(rejected, TaskRejected) and rejected.reason == reply["error"]
    for problem in expected:
        assert problem in reply["error"], reply["error"]
    with pytest.raises(queue.Empty):
        replies.get(timeout=0.5)  # exactly one answer


# ---------------------------------------------------------------- property


VALID_WORKFLOWS = {
    **{p.stem: p.read_text() for p in (REPO / "workflows").glob("*.yaml")},
    **{p.stem: p.read_text() for p in (REPO / "examples" / "workflows").glob("*.yaml")},
    "seed_format": SEED_FORMAT,
}
SCHEMA_KEYS = {
    *TOP_KEYS,
    *LLM_AGENT_KEYS,
    *OUTPUT_FORMAT_KEYS,
    *FIELD_KEYS,
    *TOOL_LIMIT_KEYS,
    "output_fields",
    "required",
    "optional",
    "max_step",
    "repeat_limits",
    "single_agent",
    "sequences",
    "pattern",
    "max_repeats",
    "system",
    "user",
}
# Keys the author chooses (agents, fields, sequences, tools) rather than the schema.
AUTHOR_NAMED = re.compile(
    r"(^|\.)(agent_info|single_agent|sequences|output_fields|route_by\.values)$|tools\[\d+\]$"
)
REQUIRED = re.compile(
    r"^(agent_info|start_agent|limitation_info|limitation_info\.required"
    r"|limitation_info\.required\.max_step|.*\.sequences\.[^.]+\.(pattern|max_repeats)"
    r"|agent_info\.[^.]+\.output_format\.parser_definition(\.output_fields)?)$"
)
OTHER_KINDS: list[Any] = [7, True, "x7", ["x7"], {"x7": 7}]


def yaml_kind(value: Any) -> str:
    """A value's kind as a workflow's author writes it: an integer and a fraction are both
    numbers (``timeout_s`` takes either)."""
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, int | float) else type(value).__name__


Step = str | int


def key_path(steps: list[Step]) -> str:
    path = ""
    for step in steps:
        path = f"{path}[{step}]" if isinstance(step, int) else (f"{path}.{step}" if path else step)
    return path


def nodes(value: Any, steps: list[Step]) -> Iterator[tuple[list[Step], Any]]:
    """Every value below ``value`` with its steps; not into ``agent_config``, which the
    agent kind checks (kernelflow.actors.kinds), not the workflow validator."""
    if steps and steps[-1] == "agent_config":
        return
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else []
    )
    for step, child in children:
        yield [*steps, step], child
        yield from nodes(child, [*steps, step])


def at(doc: Any, steps: list[Step]) -> Any:
    for step in steps:
        doc = doc[step]
    return doc


def typo(word: str, how: int, where: int) -> str:
    i = where % len(word)
    if how == 0:
        return word[:i] + word[i + 1 :]  # a letter left out
    if how == 1:
        return word[:i] + word[i] + word[i:]  # a letter doubled
    if how == 2 and i + 1 < len(word):
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]  # two letters swapped
    return word + "s"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(VALID_WORKFLOWS)),
    st.sampled_from(["rename", "drop", "retype"]),
    st.data(),
)
def test_a_mutated_workflow_is_refused_naming_the_mutated_path(
    name: str, mutation: str, data: st.DataObject
) -> None:
    doc = yaml.safe_load(VALID_WORKFLOWS[name])
    everything = list(nodes(doc, []))
    if mutation == "rename":
        keys = [
            s for s, _ in everything
            if isinstance(s[-1], str) and not AUTHOR_NAMED.search(key_path(s[:-1]))
        ]  # fmt: skip
        steps = data.draw(st.sampled_from(keys))
        new = typo(str(steps[-1]), data.draw(st.integers(0, 3)), data.draw(st.integers(0, 30)))
        assume(new not in SCHEMA_KEYS)
        parent = at(doc, steps[:-1])
        parent[new] = parent.pop(steps[-1])
        expected = key_path([*steps[:-1], new])
    elif mutation == "drop":
        required = [s for s, _ in everything if REQUIRED.match(key_path(s))]
        steps = data.draw(st.sampled_from(required))
        del at(doc, steps[:-1])[steps[-1]]
        expected = key_path(steps)
    else:
        steps, value = data.draw(st.sampled_from(everything))
        replacement = data.draw(
            st.sampled_from([v for v in OTHER_KINDS if yaml_kind(v) != yaml_kind(value)])
        )
        at(doc, steps[:-1])[steps[-1]] = copy.deepcopy(replacement)
        expected = key_path(steps)
    text = yaml.safe_dump(doc, sort_keys=False)
    with pytest.raises(WorkflowError) as err:
        check_agents(parse_workflow(text, name))  # what `kernelflow workflow validate` runs
    assert f"{name}: {expected}" in str(err.value), (text, str(err.value))
