"""The wire format: every command and event round-trips; bad payloads are refused."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelflow.events.codec import (
    MalformedMessage,
    checked_command,
    decode_command,
    decode_event,
    encode,
    json_schema,
)
from kernelflow.events.model import (
    COMMAND_TYPES,
    EVENT_TYPES,
    ROUTING_VERSION,
    TERMINAL_EVENTS,
    AgentDispatched,
    AgentFailed,
    CancelTask,
    ChatMessage,
    ConductorDecided,
    KernelReverified,
    LLMCalled,
    OutputParsed,
    ParseFailed,
    RewardAssigned,
    SubmitTask,
    TaskCancelled,
    TaskFinished,
    TaskRejected,
    TaskSubmitted,
    ToolCalled,
    ToolUse,
    Usage,
    VerificationCompleted,
    VerificationReport,
    ends_task,
)

T = "t-1"
EVENT_SAMPLES = [
    TaskSubmitted(
        task_id=T,
        seq=1,
        at=1.5,
        cause="cmd:1",
        task_name="relu",
        task_source="x",
        workflow_name="default",
        workflow_yaml="a: 1",
        backend="triton",
        group_id="g",
        candidate_code=None,
        metadata={"k": "v"},
    ),
    TaskRejected(task_id=T, reason="bad file", task_name="relu"),
    TaskCancelled(task_id=T, reason="user"),
    TaskFinished(
        task_id=T, status="success", reason="passed", final_code="c", verdict="pass", speedup=1.5
    ),
    AgentDispatched(task_id=T, agent="coder", step=2, dispatch_id="t-1:d2", suggestion="fix"),
    LLMCalled(
        task_id=T,
        agent="coder",
        dispatch_id="t-1:d2",
        provider="openai",
        model="m",
        messages=[ChatMessage(role="user", content="hi")],
        params={"temperature": 0.2},
        response_text="ok",
        stop_reason="stop",
        usage=Usage(input_tokens=3, output_tokens=1),
        latency_s=0.1,
        token_ids=[1, 2],
        logprobs=[-0.1, -0.2],
    ),
    LLMCalled(
        task_id=T,
        agent="solver",
        dispatch_id="t-1:d1",
        provider="anthropic",
        model="m",
        messages=[
            ChatMessage(role="user", content="2+2?"),
            ChatMessage(
                role="assistant",
                content="",
                tool_calls=[ToolUse(id="c1", name="calculator", args={"expression": "2+2"})],
            ),
            ChatMessage(role="tool", content="4", tool_call_id="c1"),
        ],
        response_text="Final Answer: 4",
        tools=[{"name": "calculator", "description": "d", "parameters": {"type": "object"}}],
        tool_calls=[ToolUse(id="c2", name="calculator", args={"expression": "4"})],
    ),
    ToolCalled(
        task_id=T,
        agent="solver",
        dispatch_id="t-1:d1",
        call_id="c2",
        tool="calculator",
        args={"expression": "4"},
        ok=True,
        output="4",
        duration_s=0.01,
    ),
    OutputParsed(task_id=T, agent="coder", dispatch_id="t-1:d2", fields={"code": "x"}),
    ParseFailed(task_id=T, agent="coder", dispatch_id="t-1:d2", reason="no code"),
    AgentFailed(task_id=T, agent="coder", dispatch_id="t-1:d2", error="down"),
    VerificationCompleted(
        task_id=T,
        agent="verifier",
        dispatch_id="t-1:d3",
        code="c",
        report=VerificationReport(
            verdict="mismatch", summary="s", errors=["e"], max_abs_err=0.5, mismatches=["[0, 1]"]
        ),
    ),
    ConductorDecided(
        task_id=T,
        after_agent="verifier",
        options=["coder"],
        mode="llm",
        chosen="coder",
        reason="r",
        suggestion="s",
    ),
    RewardAssigned(
        task_id=T,
        cause="t-1:9",
        reward_fn="speedup",
        version=1,
        value=1.5,
        inputs={"status": "success", "speedup": 1.5, "cap": 10.0},
    ),
    KernelReverified(
        task_id=T,
        cause="t-1:8",
        kernel_of="t-1:8",
        report=VerificationReport(
            verdict="rejected_static",
            summary="static check: torch_compute",
            verifier_version=2,
            checks=["static_gate", "judge_isolation"],
            environment={"device_name": "cpu"},
        ),
        previous_verdict="pass",
        previous_version=1,
    ),
]


def test_samples_cover_every_event_type() -> None:
    assert {type(e) for e in EVENT_SAMPLES} == set(EVENT_TYPES)


@pytest.mark.parametrize("event", EVENT_SAMPLES, ids=lambda e: e.kind)
def test_every_event_round_trips(event) -> None:  # type: ignore[no-untyped-def]
    data = encode(event)
    assert decode_event(data) == event
    wire = json.loads(data)
    version = 2 if isinstance(event, TaskSubmitted) else 1  # task_submitted v2: routing_version
    assert wire["kind"] == event.kind and wire["v"] == version and wire["task_id"] == T


def test_a_task_recorded_before_routing_versions_reads_as_routing_version_1() -> None:
    """It is decided by the rules it ran under (docs/workflows.md, "Routing")."""
    today = TaskSubmitted(
        task_id=T, task_name="n", task_source="", workflow_name="w", workflow_yaml="",
        backend="triton", group_id="g",
    )  # fmt: skip
    wire = json.loads(encode(today))
    assert wire["routing_version"] == ROUTING_VERSION == 2
    del wire["routing_version"]
    old = decode_event(json.dumps({**wire, "v": 1}).encode())
    assert isinstance(old, TaskSubmitted) and (old.v, old.routing_version) == (2, 1)
    assert decode_event(encode(today)) == today


@given(st.text(), st.text(), st.integers(min_value=0, max_value=2**40))
def test_text_fields_survive_any_content(reason: str, cause: str, seq: int) -> None:
    event = TaskRejected(task_id=T, seq=seq, cause=cause, reason=reason)
    assert decode_event(encode(event)) == event


def test_commands_round_trip() -> None:
    assert {SubmitTask, CancelTask} == set(COMMAND_TYPES)
    for command in (
        SubmitTask(task_source="s", task_id="abc", workflow_name="coder_only"),
        CancelTask(task_id="abc"),
    ):
        assert decode_command(encode(command)) == command


@pytest.mark.parametrize(
    "payload",
    [
        b'{"kind": "submit_task", "task_source": "s", "workflow": "coder_only"}',
        b'{"kind": "submit_task", "v": 1, "task_source": "s", "workflow": "coder_only"}',
        b'{"kind": "submit_task", "v": 2, "task_source": "s", "workflow_name": "coder_only"}',
        b'{"kind": "submit_task", "task_source": "s", "workflow_name": "coder_only"}',
    ],
    ids=["no-v", "v1", "v2", "v2-no-v"],
)
def test_a_submit_names_its_workflow_as_the_event_does_and_old_ones_still_read(
    payload: bytes,
) -> None:
    """v2's ``workflow_name`` is ``TaskSubmitted``'s name; a publisher of v1 (or of JSON
    written by hand without ``v``) wrote ``workflow``, which must not fall to the default."""
    command = decode_command(payload)
    assert isinstance(command, SubmitTask)
    assert (command.workflow_name, command.v) == ("coder_only", 2)


def test_a_v1_submit_that_breaks_the_schema_is_refused_in_words() -> None:
    with pytest.raises(MalformedMessage, match=r"^not a kernelflow command: deadline_s: "):
        decode_command(
            b'{"kind": "submit_task", "task_source": "s", "workflow": "w", "deadline_s": -1}'
        )


def test_minimal_submit_from_any_client() -> None:
    command = decode_command(b'{"kind": "submit_task", "task_source": "import torch"}')
    assert isinstance(command, SubmitTask)
    assert (
        command.workflow_name == "default"
        and command.backend == "triton"
        and command.task_id is None
    )


@pytest.mark.parametrize(
    "payload, problem",
    [
        (b"not json", "malformed"),
        (b'{"kind": "launch_missiles"}', "launch_missiles"),
        (b'{"task_source": "x"}', "kind"),
        (b'{"kind": "submit_task"}', "task_source"),
        (b'{"kind": "submit_task", "task_source": "x", "task_id": "a.b"}', "task_id"),
        (b'{"kind": "submit_task", "task_source": "x", "backend": "COBOL 85!"}', "backend"),
        (b'{"kind": "submit_task", "task_source": "x", "deadline_s": 0}', "deadline_s"),
    ],
)
def test_bad_commands_are_refused_with_the_reason(payload: bytes, problem: str) -> None:
    with pytest.raises(MalformedMessage) as err:
        decode_command(payload)
    assert problem in str(err.value).lower() or problem in str(err.value)


def test_a_publisher_checks_a_command_as_a_daemon_will_read_it() -> None:
    ok = SubmitTask(task_source="x", task_id="ok-1", deadline_s=60.0)
    assert checked_command(ok) == ok
    for bad, field in [
        (SubmitTask(task_source="x", task_id="a.b"), "task_id"),
        (SubmitTask(task_source="x", deadline_s=-5.0), "deadline_s"),
    ]:
        with pytest.raises(MalformedMessage, match=field):
            checked_command(bad)


def test_ends_task_answers_as_isinstance_for_every_event_type() -> None:
    # ends_task looks up the exact type: right only while no event class is subclassed.
    assert all(not t.__subclasses__() for t in EVENT_TYPES)
    for event in EVENT_SAMPLES:
        assert ends_task(event) == isinstance(event, TERMINAL_EVENTS), event.kind
    assert {type(e) for e in EVENT_SAMPLES if ends_task(e)} == set(TERMINAL_EVENTS)


def test_events_are_not_commands() -> None:
    with pytest.raises(MalformedMessage):
        decode_command(encode(EVENT_SAMPLES[0]))
    with pytest.raises(MalformedMessage):
        decode_event(encode(SubmitTask(task_source="x")))


def test_events_are_frozen() -> None:
    with pytest.raises(AttributeError):
        EVENT_SAMPLES[0].seq = 5  # type: ignore[misc]
    assert msgspec.structs.replace(EVENT_SAMPLES[0], seq=5).seq == 5


def test_schema_documents_what_publishers_send() -> None:
    schema = json_schema()
    text = json.dumps(schema)
    assert "submit_task" in text and "cancel_task" in text and "task_source" in text
    assert "llm_called" in json.dumps(json_schema(events=True))
