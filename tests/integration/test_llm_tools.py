"""Native tool use through each provider: the real SDK / HTTP client against local servers
that speak the real APIs, so the translated requests are checked in each API's own shape."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.events.codec import decode_event, encode
from kernelflow.events.model import ChatMessage, LLMCalled, ToolUse
from kernelflow.llm import LLMError, make_provider
from kernelflow.llm.base import LLMRequest, LLMResponse, llm_called
from kernelflow.llm.config import Limits, LLMConfig
from kernelflow.llm.recording import request_key
from kernelflow.llm.router import ProviderRouter
from kernelflow.llm.scripted import ScriptedProvider, ScriptError
from tests.fake_llm_servers import FakeAnthropic, FakeOpenAI, Reply, ScriptedAnswers, ToolCall

KEY = "sk-ant-api03-TOOLSECRET-0123456789abcdef"
OPENAI_KEY = "sk-proj-TOOLSECRET-9876543210"
FAST = Limits(backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=2.0, max_retries=2)

READ = {"path": {"type": "string"}}
TOOLS = [
    {
        "name": "read_file",
        "description": "Read a file of the workspace.",
        "parameters": {"type": "object", "properties": READ, "required": ["path"]},
    },
    {"name": "list_files", "description": "List the workspace."},  # takes no arguments
    {"name": "write_file", "parameters": {"type": "object", "properties": {}}},
]
WRITE_ARGS = {"path": "k.py", "content": "import triton\n"}
# A multi-turn conversation: two calls answered by two results (one empty) and a user
# text, then a call without text; one id is of a call parsed from text (``<event>#<n>``).
CONVERSATION = [
    ChatMessage(role="system", content="You are the coder. Static rules."),
    ChatMessage(role="user", content="write a relu kernel"),
    ChatMessage(
        role="assistant",
        content="Let me look.",
        tool_calls=[
            ToolUse(id="toolu_01", name="read_file", args={"path": "ref.py"}),
            ToolUse(id="t-9:4#1", name="list_files"),
        ],
    ),
    ChatMessage(role="tool", content="def ref(x): ...", tool_call_id="toolu_01"),
    ChatMessage(role="tool", content="", tool_call_id="t-9:4#1"),
    ChatMessage(role="user", content="The verifier is ready."),
    ChatMessage(
        role="assistant",
        content="",
        tool_calls=[ToolUse(id="call_2_0", name="write_file", args=WRITE_ARGS)],
    ),
    ChatMessage(role="tool", content="written", tool_call_id="call_2_0"),
]
ANSWER = Reply("Reading it.", [ToolCall("read_file", {"path": "k.py"}, id="toolu_02")])


def request(
    messages: list[ChatMessage] = CONVERSATION, tools: list[dict[str, object]] = TOOLS
) -> LLMRequest:
    return LLMRequest("t-tools", "coder", 3, messages, tools=tools)


def run(provider: ProviderRouter, req: LLMRequest) -> LLMResponse:
    return asyncio.run(provider.complete(req))


def router(spec: str) -> ProviderRouter:
    return make_provider(spec, LLMConfig(limits=FAST))


@pytest.fixture
def anthropic_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic(lambda body: ANSWER, api_key=KEY) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        yield server


def recorded_event(req: LLMRequest, answer: LLMResponse) -> LLMCalled:
    """The answer's ``llm_called`` event, through the codec as the log stores it."""
    event = decode_event(encode(llm_called(req, answer, dispatch_id="d", cause="c")))
    assert isinstance(event, LLMCalled)
    return event


# --------------------------------------------------------------------------- anthropic


def test_anthropic_sends_tools_and_tool_turns_in_the_messages_api_shape(
    anthropic_server: FakeAnthropic,
) -> None:
    answer = run(router("anthropic:claude-tools"), request())
    [body] = anthropic_server.completions
    assert body["tools"] == [
        {
            "name": "read_file",
            "description": "Read a file of the workspace.",
            "input_schema": TOOLS[0]["parameters"],
        },
        {
            "name": "list_files",
            "description": "List the workspace.",
            "input_schema": {"type": "object", "properties": {}},
        },
        {"name": "write_file", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert body["system"] == [
        {
            "type": "text",
            "text": "You are the coder. Static rules.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": "write a relu kernel"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "read_file",
                    "input": {"path": "ref.py"},
                },
                # The API's id pattern is [a-zA-Z0-9_-]+: other characters become "_".
                {"type": "tool_use", "id": "t-9_4_1", "name": "list_files", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "def ref(x): ..."},
                {"type": "tool_result", "tool_use_id": "t-9_4_1"},  # empty: no content
                {"type": "text", "text": "The verifier is ready."},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_2_0", "name": "write_file", "input": WRITE_ARGS}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "call_2_0", "content": "written"}],
        },
    ]
    assert answer.text == "Reading it." and answer.stop_reason == "tool_use"
    assert answer.tool_calls == [ToolUse(id="toolu_02", name="read_file", args={"path": "k.py"})]
    event = recorded_event(request(), answer)
    assert event.tools == TOOLS and event.tool_calls == answer.tool_calls
    assert event.messages == CONVERSATION
    assert KEY not in encode(event).decode()


def test_anthropic_answer_with_only_tool_calls(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.responder = lambda body: Reply(
        tool_calls=[ToolCall("list_files"), ToolCall("read_file", {"path": "a.py"})]
    )
    plain = [CONVERSATION[0], CONVERSATION[1]]
    answer = run(router("anthropic:m"), request(plain))
    assert answer.text == "" and [c.name for c in answer.tool_calls] == ["list_files", "read_file"]
    assert all(c.id.startswith("toolu_") for c in answer.tool_calls)
    assert answer.tool_calls[1].args == {"path": "a.py"}
    assert answer.usage.output_tokens > 0
    # Without tools the request is the plain completion it always was.
    run(router("anthropic:m"), request(plain, tools=[]))
    assert "tools" not in anthropic_server.completions[-1]


def test_a_tool_call_left_unanswered_is_refused_as_the_api_does(
    anthropic_server: FakeAnthropic,
) -> None:
    with pytest.raises(LLMError, match=r"HTTP 400 invalid_request_error.*without `tool_result`"):
        run(router("anthropic:m"), request(CONVERSATION[:3]))
    assert len(anthropic_server.seen) == 1  # a client error: not retried


# --------------------------------------------------------------------------- openai


def test_openai_sends_tools_and_tool_messages_in_the_chat_completions_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    with FakeOpenAI(lambda body: ANSWER, api_key=OPENAI_KEY, strict=True) as server:
        answer = run(router(f"openai:{server.url}/v1#policy"), request())
        # strict: the token-id extensions are refused once, then the call goes through.
        body = server.completions[-1]
    assert body["tools"] == [{"type": "function", "function": t} for t in TOOLS]
    assert body["messages"] == [
        {"role": "system", "content": "You are the coder. Static rules."},
        {"role": "user", "content": "write a relu kernel"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "ref.py"}'},
                },
                {
                    "id": "t-9:4#1",
                    "type": "function",
                    "function": {"name": "list_files", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "def ref(x): ..."},
        {"role": "tool", "tool_call_id": "t-9:4#1", "content": ""},
        {"role": "user", "content": "The verifier is ready."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_2_0",
                    "type": "function",
                    "function": {"name": "write_file", "arguments": json.dumps(WRITE_ARGS)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_2_0", "content": "written"},
    ]
    assert answer.text == "Reading it." and answer.stop_reason == "tool_calls"
    assert answer.tool_calls == [ToolUse(id="toolu_02", name="read_file", args={"path": "k.py"})]
    assert answer.logprobs is not None and len(answer.logprobs) == 2  # unchanged by tools
    event = recorded_event(request(), answer)
    assert event.tools == TOOLS and event.tool_calls == answer.tool_calls
    assert OPENAI_KEY not in encode(event).decode()


def test_openai_token_ids_still_come_with_tool_calls() -> None:
    with FakeOpenAI(lambda body: ANSWER) as server:
        answer = run(router(f"openai:{server.url}/v1#policy"), request())
    assert answer.token_ids is not None and len(answer.token_ids) == 2
    assert answer.prompt_token_ids and answer.tool_calls[0].name == "read_file"


@pytest.mark.parametrize(
    ("raw", "args"),
    [
        ('{"path": "k.py"', {"_unparsed_arguments": '{"path": "k.py"'}),  # cut short
        ("[1, 2]", {"_unparsed_arguments": "[1, 2]"}),  # JSON, but not an object
        ("", {}),  # a call of a function without parameters
    ],
)
def test_openai_malformed_arguments_are_kept_for_the_tool_runner(
    raw: str, args: dict[str, object]
) -> None:
    reply = Reply(tool_calls=[ToolCall("read_file", id="call_x", raw_arguments=raw)])
    with FakeOpenAI(lambda body: reply) as server:
        answer = run(router(f"openai:{server.url}/v1#policy"), request())
    assert answer.retries == 0 and answer.text == ""
    assert answer.tool_calls == [ToolUse(id="call_x", name="read_file", args=args)]
    assert recorded_event(request(), answer).tool_calls == answer.tool_calls


# --------------------------------------------------------------------------- scripted


SCRIPT = """
coder:
  - text: Let me look first.
    tool_calls:
      - {name: read_file, args: {path: ref.py}}
      - {name: list_files}
  - tool_calls:
      - {name: write_file, args: {path: k.py, content: "x = 1"}, id: my-call}
  - The kernel is written.
"""


def test_scripted_tool_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "tools.yaml"
    script.write_text(SCRIPT)
    provider = router(f"scripted:{script}")
    first, second, third = (
        run(provider, LLMRequest("t", "coder", n, CONVERSATION[:2], tools=TOOLS)) for n in range(3)
    )
    assert first.text == "Let me look first." and first.stop_reason == "tool_use"
    assert first.tool_calls == [
        ToolUse(id="call_0_0", name="read_file", args={"path": "ref.py"}),
        ToolUse(id="call_0_1", name="list_files", args={}),
    ]
    assert second.text == "" and second.tool_calls == [
        ToolUse(id="my-call", name="write_file", args={"path": "k.py", "content": "x = 1"})
    ]
    assert third.tool_calls == [] and third.stop_reason == "end_turn"
    # The HTTP fakes play the same script, tool calls included, through the real APIs.
    with FakeAnthropic(ScriptedAnswers(script)) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        answer = run(router("anthropic:m"), request(CONVERSATION[:2]))
    assert answer.text == first.text
    assert [(c.name, c.args) for c in answer.tool_calls] == [
        (c.name, c.args) for c in first.tool_calls
    ]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("{tool_calls: [{args: {}}]}", "coder[0].tool_calls[0].name: must be a non-empty string"),
        ("{tool_calls: [{name: f, args: [1]}]}", "coder[0].tool_calls[0].args: must be a mapping"),
        ("{tool_calls: [{name: f, arguments: {}}]}", "coder[0].tool_calls[0]: unknown key 'arg"),
        ("{tool_calls: {name: f}}", "coder[0].tool_calls: must be a list"),
        ("{tool_calls: [{name: f, id: 7}]}", "coder[0].tool_calls[0].id: must be a string"),
        (
            "{latency_s: 1}",
            "coder[0]: must be a string or a mapping with 'text', 'tool_calls' or 'choices'",
        ),
    ],
)
def test_scripted_tool_call_errors_name_the_file_and_entry(
    tmp_path: Path, entry: str, problem: str
) -> None:
    script = tmp_path / "bad.yaml"
    script.write_text(f"coder:\n  - {entry}\n")
    with pytest.raises(ScriptError, match=re.escape(f"{script}: {problem}")):
        ScriptedProvider(script)


# --------------------------------------------------------------------------- record/replay


def test_record_then_replay_with_tools(anthropic_server: FakeAnthropic, tmp_path: Path) -> None:
    records = tmp_path / "records"
    recorded = run(router(f"record:{records}:anthropic:claude-rec"), request())
    record = json.loads((records / f"{request_key(request())}.json").read_text())
    assert record["tools"] == TOOLS
    assert record["response"]["tool_calls"] == [
        {"id": "toolu_02", "name": "read_file", "args": {"path": "k.py"}}
    ]
    served = len(anthropic_server.seen)
    replayed = run(router(f"replay:{records}"), request())
    assert len(anthropic_server.seen) == served  # nothing reached the API
    assert replayed.tool_calls == recorded.tool_calls and replayed.text == recorded.text
    assert replayed.stop_reason == "tool_use" and replayed.provider == "replay"
    # Other tools offered, or results answering other calls: another request.
    for other in (
        request(tools=TOOLS[:1]),
        request([*CONVERSATION[:3], CONVERSATION[4], CONVERSATION[3], *CONVERSATION[5:]]),
    ):
        with pytest.raises(LLMError, match="no recorded answer"):
            run(router(f"replay:{records}"), other)


def test_request_keys_ignore_tool_call_id_values_but_not_their_pairing() -> None:
    def renamed(prefix: str) -> list[ChatMessage]:
        """The conversation with every tool call id renamed (another task's event ids)."""
        return [
            ChatMessage(
                role=m.role,
                content=m.content,
                tool_calls=[
                    ToolUse(id=prefix + c.id, name=c.name, args=c.args) for c in m.tool_calls
                ]
                if m.tool_calls
                else None,
                tool_call_id=prefix + m.tool_call_id if m.tool_call_id else None,
            )
            for m in CONVERSATION
        ]

    assert request_key(request(renamed("other-task:"))) == request_key(request())
    swapped = [*CONVERSATION[:3], CONVERSATION[4], CONVERSATION[3], *CONVERSATION[5:]]
    assert request_key(request(swapped)) != request_key(request())
    args_changed = [
        *CONVERSATION[:6],
        ChatMessage(
            role="assistant",
            content="",
            tool_calls=[ToolUse(id="call_2_0", name="write_file", args={"path": "other.py"})],
        ),
        CONVERSATION[7],
    ]
    assert request_key(request(args_changed)) != request_key(request())
    # A plain request keeps the key it had before tools existed: old records still replay.
    plain = request(CONVERSATION[:2], tools=[])
    before = {"agent": "coder", "messages": [[m.role, m.content] for m in CONVERSATION[:2]]}
    expected = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert request_key(plain) == expected
