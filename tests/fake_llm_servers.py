"""Local HTTP servers that speak the Anthropic Messages API and the OpenAI
chat-completions API (as vLLM serves it), error bodies and headers included.

They listen on 127.0.0.1 on a free port, in a background thread, and are driven by the
tests: ``fail_next(...)`` queues what the next completion requests get (an HTTP error with
its real error body and ``retry-after``, a hang, a garbled body); everything else gets an
answer from ``responder`` after ``delay_s``: a text, or a ``Reply`` with tool calls. Each
lists its models (``GET /v1/models``) as the real server does. Every request is kept for
inspection (``seen``; ``completions`` are the bodies of the completion calls).

The OpenAI-compatible one answers as the server it is told to be (``SERVERS``: vLLM,
SGLang, Ollama, llama.cpp's llama-server, or api.openai.com itself): the request fields
each takes, and the token ids and log-probabilities each returns, in its own places
(docs/llm.md, "Serving a model of your own", says the same of the real ones).

Like the real APIs, they refuse (HTTP 400, with the API's message) conversations whose
tool calls and tool results do not fit together, so a provider's translation is checked.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import zlib
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml


@dataclass
class ToolCall:
    """A tool call a scripted answer makes."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)
    id: str | None = None  # None: an id in the API's style
    raw_arguments: str | None = None  # OpenAI: sent instead of json.dumps(args)


@dataclass
class Reply:
    """A scripted answer with tool calls (a responder may also answer a plain text)."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


Responder = Callable[[dict[str, Any]], str | Reply]
ANTHROPIC_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
ANTHROPIC_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Refused(Exception):
    """A request the API answers with HTTP 400 ``invalid_request_error``."""


def word_count(content: object) -> int:
    """A stand-in token count of a message's content, however it is structured."""
    return len((content if isinstance(content, str) else json.dumps(content)).split())


ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass
class Failure:
    status: int = 0  # HTTP status of an error answer
    retry_after: str | None = None
    hang_s: float = 0.0  # wait this long before answering normally
    malformed: bool = False  # 200 with a body that is not the API's JSON


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


def token_ids(text: str) -> list[int]:
    """A stand-in tokenizer: one id per whitespace-separated word."""
    return [zlib.crc32(w.encode()) % 50_000 for w in text.split()]


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # listen backlog: a burst of connections must not wait a SYN retry
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients closing keep-alive connections are normal, not worth a traceback


class FakeLLMServer:
    api = ""
    completion_path = ""

    def __init__(self, responder: Responder | None = None, *, api_key: str | None = None):
        self.responder: Responder = responder or (lambda body: "hello from the fake server")
        self.api_key = api_key
        self.delay_s = 0.0
        self.failures: deque[Failure] = deque()
        self.seen: list[Seen] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # TCP_NODELAY, as production servers set it

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner._handle(self, "GET")

            def do_POST(self) -> None:
                owner._handle(self, "POST")

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        # A short poll interval: shutting down waits up to one interval (0.5 s by default).
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FakeLLMServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def completions(self) -> list[dict[str, Any]]:
        """The bodies of the completion requests received, in order."""
        return [s.body for s in self.seen if s.path.rstrip("/") == self.completion_path]

    def fail_next(self, *failures: Failure) -> None:
        self.failures.extend(failures)

    def next_id(self) -> int:
        return next(self._ids)

    # ------------------------------------------------------------------ HTTP

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("content-length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            self._send(handler, 400, self.error_body(400, "request body is not JSON"))
            return
        headers = {k.lower(): v for k, v in handler.headers.items()}
        completion = handler.path.rstrip("/") == self.completion_path
        with self._lock:
            self.seen.append(Seen(handler.path, headers, body))
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            failure = self.failures.popleft() if self.failures and completion else None
        try:
            auth_error = self.check_auth(headers)
            if auth_error is not None:
                self._send(handler, 401, self.error_body(401, auth_error))
                return
            if failure is not None and failure.status:
                extra = {"retry-after": failure.retry_after} if failure.retry_after else {}
                self._send(handler, failure.status, self.error_body(failure.status), extra)
                return
            if failure is not None and failure.hang_s:
                time.sleep(failure.hang_s)
            if failure is not None and failure.malformed:
                self._send(handler, 200, b'{"id": "oops", "content": [{"type": "te')
                return
            if self.delay_s:
                time.sleep(self.delay_s)
            try:
                status, answer = self.answer(method, handler.path, body)
            except Refused as exc:
                self._send(handler, 400, self.error_body(400, str(exc)))
                return
            self._send(handler, status, json.dumps(answer).encode(), self.answer_headers())
        finally:
            with self._lock:
                self.in_flight -= 1

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        payload: bytes,
        headers: dict[str, str] | None = None,
    ) -> None:
        try:
            handler.send_response(status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(payload)))
            for k, v in (headers or {}).items():
                handler.send_header(k, v)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its timeout): as a real server, carry on

    # ------------------------------------------------------------------ per API

    def check_auth(self, headers: dict[str, str]) -> str | None:
        raise NotImplementedError

    def error_body(self, status: int, message: str | None = None) -> bytes:
        raise NotImplementedError

    def answer_headers(self) -> dict[str, str]:
        return {}

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raise NotImplementedError


class FakeAnthropic(FakeLLMServer):
    """``POST /v1/messages`` as api.anthropic.com answers it (non-streaming)."""

    api = "anthropic"
    completion_path = "/v1/messages"

    def __init__(self, responder: Responder | None = None, *, api_key: str | None = None):
        super().__init__(responder, api_key=api_key)
        self.cached_prefixes: set[str] = set()

    def check_auth(self, headers: dict[str, str]) -> str | None:
        if "anthropic-version" not in headers:
            return "anthropic-version header is required"
        # The SDK sends the key as x-api-key or (newer versions) as a bearer token.
        keys = {headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer ")}
        if self.api_key is not None and self.api_key not in keys:
            return "invalid x-api-key"
        return None

    def error_body(self, status: int, message: str | None = None) -> bytes:
        kind = ANTHROPIC_ERROR_TYPES.get(status, "api_error")
        text = message or {
            429: "Number of request tokens has exceeded your per-minute rate limit",
            529: "Overloaded",
            500: "Internal server error",
        }.get(status, kind)
        body = {
            "type": "error",
            "error": {"type": kind, "message": text},
            "request_id": f"req_err{self.next_id():06d}",
        }
        return json.dumps(body).encode()

    def answer_headers(self) -> dict[str, str]:
        return {"request-id": f"req_{self.next_id():06d}"}

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path.split("?")[0].rstrip("/") == "/v1/models":
            model = {"type": "model", "id": "claude-sonnet-4-5", "display_name": "Claude"}
            return 200, {"data": [model], "has_more": False, "first_id": model["id"]}
        if method != "POST" or path.rstrip("/") != "/v1/messages":
            return 404, {"type": "error", "error": {"type": "not_found_error", "message": path}}
        for key in ("model", "max_tokens", "messages"):
            if key not in body:
                return 400, {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": f"{key}: Field required"},
                }
        check_anthropic_tools(body.get("tools") or [])
        check_anthropic_messages(body["messages"])
        system = body.get("system") or []
        if isinstance(system, str):
            system = [{"type": "text", "text": system}]
        cached = "".join(b["text"] for b in system if "cache_control" in b)
        prompt_words = sum(len(b["text"].split()) for b in system) + sum(
            word_count(m["content"]) for m in body["messages"]
        )
        write = read = 0
        if cached:
            words = len(cached.split())
            with self._lock:
                if cached in self.cached_prefixes:
                    read = words
                else:
                    self.cached_prefixes.add(cached)
                    write = words
        reply = self.responder(body)
        if isinstance(reply, str):
            reply = Reply(reply)
        content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
        content += [
            {
                "type": "tool_use",
                "id": call.id or f"toolu_{self.next_id():024d}",
                "name": call.name,
                "input": call.args,
            }
            for call in reply.tool_calls
        ]
        return 200, {
            "id": f"msg_{self.next_id():08d}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": content,
            "stop_reason": "tool_use" if reply.tool_calls else "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": prompt_words - write - read,
                "output_tokens": word_count(reply.text)
                + sum(word_count(c.args) for c in reply.tool_calls),
                "cache_creation_input_tokens": write,
                "cache_read_input_tokens": read,
            },
        }


@dataclass(frozen=True)
class Server:
    """What one OpenAI-compatible server takes and gives back, as far as kernelflow asks
    (docs/llm.md, "Serving a model of your own"): the extension fields it knows, where it
    puts token ids, how its log-probabilities name tokens."""

    name: str
    # Request fields beyond the standard ones it knows; any other is ignored, or refused
    # with HTTP 400 where ``strict`` (api.openai.com).
    extensions: frozenset[str] = frozenset()
    strict: bool = False
    answer_ids: str | None = None  # the field that returns the answer's token ids
    prompt_ids: str | None = None  # the one that returns the prompt's
    prompt_ids_on_choice: bool = False  # the prompt's ids on the choice (else top level)
    logprobs: bool = True  # it returns log-probabilities when asked
    # How an entry of its log-probabilities names its token: its text, its text with an
    # ``id`` field (llama.cpp), or ``token_id:N`` when asked (vLLM's extension).
    logprob_ids: str = "text"


STANDARD_FIELDS = frozenset(
    {"model", "messages", "max_tokens", "temperature", "logprobs", "top_logprobs", "tools"}
)
SERVERS = {
    "vllm": Server(
        "vllm",
        frozenset({"return_token_ids", "return_tokens_as_token_ids"}),
        answer_ids="return_token_ids",
        prompt_ids="return_token_ids",
        logprob_ids="return_tokens_as_token_ids",
    ),
    "sglang": Server(
        "sglang",
        frozenset({"return_token_ids", "return_prompt_token_ids"}),
        answer_ids="return_token_ids",
        prompt_ids="return_prompt_token_ids",
        prompt_ids_on_choice=True,
    ),
    "ollama": Server("ollama"),
    "llama.cpp": Server("llama.cpp", logprob_ids="id"),
    "openai": Server("openai", strict=True),
}


class FakeOpenAI(FakeLLMServer):
    """``/v1/chat/completions`` and ``/v1/models`` as the OpenAI-compatible ``server`` of
    ``SERVERS`` answers them (vLLM by default); ``strict=True`` is api.openai.com, which
    refuses fields it does not know."""

    api = "openai"
    completion_path = "/v1/chat/completions"

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        api_key: str | None = None,
        model: str = "policy-7b",
        strict: bool = False,
        server: str = "vllm",
    ):
        super().__init__(responder, api_key=api_key)
        self.server = SERVERS["openai" if strict else server]
        self.model = model

    def check_auth(self, headers: dict[str, str]) -> str | None:
        if self.api_key is not None and headers.get("authorization") != f"Bearer {self.api_key}":
            return "Incorrect API key provided"
        return None

    def error_body(self, status: int, message: str | None = None) -> bytes:
        kinds = {429: "rate_limit_exceeded", 401: "invalid_api_key", 400: "invalid_request_error"}
        body = {
            "error": {
                "message": message or f"error {status}",
                "type": kinds.get(status, "server_error"),
                "param": None,
                "code": None,
            }
        }
        return json.dumps(body).encode()

    def answer_headers(self) -> dict[str, str]:
        return {"x-request-id": f"oa-{self.next_id():06d}"}

    def answer(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path.rstrip("/") == "/v1/models":
            return 200, {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        if method != "POST" or path.rstrip("/") != "/v1/chat/completions":
            return 404, json.loads(self.error_body(404, f"no route {path}"))
        server = self.server
        unknown = set(body) - STANDARD_FIELDS - {"tool_choice"} - server.extensions
        if server.strict and unknown:
            message = f"Unrecognized request argument supplied: {sorted(unknown)[0]}"
            return 400, json.loads(self.error_body(400, message))
        check_openai_tools(body.get("tools") or [])
        check_openai_messages(body["messages"])
        reply = self.responder(body)
        if isinstance(reply, str):
            reply = Reply(reply)
        text = reply.text
        prompt = " ".join(
            c if isinstance(c := m.get("content"), str) else json.dumps(c) for m in body["messages"]
        )
        ids = token_ids(text)
        answer_words = text.split()
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reply.tool_calls:
            message["content"] = text or None
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{self.next_id():024d}",
                    "type": "function",
                    "function": {
                        "name": call.name,
                        "arguments": call.raw_arguments
                        if call.raw_arguments is not None
                        else json.dumps(call.args),
                    },
                }
                for call in reply.tool_calls
            ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": "tool_calls" if reply.tool_calls else "stop",
        }
        if body.get("logprobs") and server.logprobs:
            choice["logprobs"] = {
                "content": [
                    self._logprob(body, n, token_id, word)
                    for n, (token_id, word) in enumerate(zip(ids, answer_words, strict=True))
                ]
            }
        answer: dict[str, Any] = {
            "id": f"chatcmpl-{self.next_id():08d}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": len(answer_words),
                "total_tokens": len(prompt.split()) + len(answer_words),
            },
        }
        if server.answer_ids and body.get(server.answer_ids):
            choice["token_ids"] = ids
        if server.prompt_ids and body.get(server.prompt_ids):
            (choice if server.prompt_ids_on_choice else answer)["prompt_token_ids"] = token_ids(
                prompt
            )
        return 200, answer

    def _logprob(self, body: dict[str, Any], n: int, token_id: int, word: str) -> dict[str, Any]:
        """One entry of ``logprobs.content``, naming its token as this server does."""
        as_id = self.server.logprob_ids == "return_tokens_as_token_ids" and body.get(
            "return_tokens_as_token_ids"
        )
        entry: dict[str, Any] = {
            "token": f"token_id:{token_id}" if as_id else word,
            "logprob": -0.01 * (n % 7),
            "bytes": list(word.encode()),
            "top_logprobs": [],
        }
        if self.server.logprob_ids == "id":
            entry["id"] = token_id
        return entry


def check_anthropic_tools(tools: list[dict[str, Any]]) -> None:
    for n, tool in enumerate(tools):
        if not ANTHROPIC_TOOL_NAME.match(str(tool.get("name", ""))):
            raise Refused(
                f"tools.{n}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise Refused(f"tools.{n}.custom.input_schema: Field required")
        if schema.get("type") != "object":
            raise Refused(f"tools.{n}.custom.input_schema.type: Input should be 'object'")


def check_anthropic_messages(messages: list[dict[str, Any]]) -> None:
    """The Messages API's rules for turns and tool blocks, with its error messages."""
    pending: list[str] = []  # tool_use ids the next message must answer first
    for n, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise Refused(f"messages.{n}.role: Input should be 'user' or 'assistant'")
        if n == 0 and role != "user":
            raise Refused('messages: first message must use the "user" role')
        if n and messages[n - 1].get("role") == role:
            raise Refused(
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row'
            )
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise Refused(f"messages.{n}.content: Input should be a valid list")
        texts = [b.get("text", "") for b in blocks if b.get("type") == "text"]
        if not isinstance(content, str) and "" in texts:
            raise Refused("messages: text content blocks must be non-empty")
        if not isinstance(content, str) and any(not t.strip() for t in texts):
            raise Refused("messages: text content blocks must contain non-whitespace text")
        results = [b for b in blocks if b.get("type") == "tool_result"]
        leading = list(itertools.takewhile(lambda b: b.get("type") == "tool_result", blocks))
        for m, block in enumerate(results):
            if block.get("tool_use_id") not in pending:
                raise Refused(
                    f"messages.{n}.content.{m}: unexpected `tool_use_id` found in `tool_result` "
                    f"blocks: {block.get('tool_use_id')}. Each `tool_result` block must have a "
                    "corresponding `tool_use` block in the previous message."
                )
            if block.get("content") == "":
                raise Refused(f"messages.{n}.content.{m}: tool_result content cannot be empty")
        if pending and len(leading) < len(pending):
            if not results:
                raise Refused(
                    f"messages.{n - 1}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {pending[0]}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
            raise Refused(
                f"messages.{n}: Did not find {len(pending)} `tool_result` block(s) at the "
                "beginning of this message. Messages following `tool_use` blocks must begin "
                "with a matching number of `tool_result` blocks."
            )
        pending = []
        for m, block in enumerate(blocks):
            if block.get("type") != "tool_use":
                continue
            if role != "assistant":
                raise Refused(f"messages.{n}.content.{m}: tool_use blocks are for the assistant")
            if not ANTHROPIC_ID.match(str(block.get("id", ""))):
                raise Refused(
                    f"messages.{n}.content.{m}.tool_use.id: String should match pattern "
                    "'^[a-zA-Z0-9_-]+$'"
                )
            if not isinstance(block.get("input"), dict):
                raise Refused(f"messages.{n}.content.{m}.tool_use.input: Input should be an object")
            pending.append(block["id"])
    if pending:
        raise Refused(
            f"messages.{len(messages) - 1}: `tool_use` ids were found without `tool_result` "
            f"blocks immediately after: {pending[0]}. Each `tool_use` block must have a "
            "corresponding `tool_result` block in the next message."
        )


def check_openai_tools(tools: list[dict[str, Any]]) -> None:
    for n, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise Refused(f"Invalid value for 'tools[{n}].type': expected 'function'.")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise Refused(f"Missing required parameter: 'tools[{n}].function.name'.")


def check_openai_messages(messages: list[dict[str, Any]]) -> None:
    """The chat-completions rules for tool calls and tool messages, with its error messages."""
    pending: list[str] = []  # tool_call_ids still to be answered by tool messages
    for n, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            if "tool_call_id" not in message:
                raise Refused(f"Missing required parameter: 'messages[{n}].tool_call_id'.")
            if message["tool_call_id"] not in pending:
                raise Refused(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'."
                )
            pending.remove(message["tool_call_id"])
            continue
        if pending:
            raise Refused(
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(pending)}"
            )
        if message.get("content") is None and not message.get("tool_calls"):
            raise Refused(f"Invalid value for 'messages[{n}].content': expected a string.")
        for m, call in enumerate(message.get("tool_calls") or []):
            if role != "assistant":
                raise Refused(f"Invalid parameter: 'messages[{n}].tool_calls' is for assistants.")
            arguments = (call.get("function") or {}).get("arguments")
            if call.get("type") != "function" or not isinstance(arguments, str):
                raise Refused(
                    f"Invalid type for 'messages[{n}].tool_calls[{m}].function.arguments': "
                    "expected a string."
                )
            pending.append(call.get("id"))
    if pending:
        raise Refused(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(pending)}"
        )


class ScriptedAnswers:
    """Answers from a scripted-responses file (examples/scripted/*.yaml): the agent is read
    from the system prompt ("You are the coder ..."), and its n-th request gets entry n
    (its tool calls too)."""

    def __init__(self, path: Path) -> None:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        self.script = {
            agent: [
                Reply(e)
                if isinstance(e, str)
                else Reply(e.get("text", ""), [ToolCall(**c) for c in e.get("tool_calls", [])])
                for e in entries
            ]
            for agent, entries in doc.items()
        }
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str | Reply:
        system = body.get("system") or [
            {"text": m["content"]} for m in body.get("messages", []) if m["role"] == "system"
        ]
        text = system if isinstance(system, str) else " ".join(b["text"] for b in system)
        agent = next((a for a in self.script if f"You are the {a}" in text), None)
        if agent is None:
            return "I do not know which agent you are."
        with self._lock:
            n = self.calls[agent]
            self.calls[agent] += 1
        entries = self.script[agent]
        return entries[min(n, len(entries) - 1)]


def main() -> None:
    """Serve one fake API in its own process (the benchmark's server):
    ``python -m tests.fake_llm_servers anthropic|openai [--delay S] [--api-key K]``;
    prints the URL, serves until killed."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("api", choices=["anthropic", "openai"])
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--api-key")
    args = parser.parse_args()
    kind = FakeAnthropic if args.api == "anthropic" else FakeOpenAI
    with kind(api_key=args.api_key) as server:
        server.delay_s = args.delay
        print(server.url, flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
