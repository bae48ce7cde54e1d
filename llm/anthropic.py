"""Claude through the official ``anthropic`` SDK (``AsyncAnthropic``), on the bridge loop.

The SDK's own retries are off: the gateway retries (so every retry is counted and
recorded, and a ``retry-after`` holds back every call to the endpoint). Leading system
messages become the ``system`` blocks, the last one marked for prompt caching: prompts put
their static part (role, rules, DSL guidance) there; the tools, sent before the system
prompt, are cached with it.

The provider-neutral chat (OpenAI's shape) is translated to the Messages API's: an
assistant's tool calls become ``tool_use`` blocks, and the ``tool`` messages answering them
become one user turn of ``tool_result`` blocks (with the user's next text, if any, after
them), as the API wants every ``tool_use`` answered at the start of the next message.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from typing import Any

from kernelflow.events.model import ChatMessage, ToolUse, Usage
from kernelflow.llm.base import (
    PROBE_CALL_TIMEOUT_S,
    PROBE_TIMEOUT_S,
    EndpointUnreachable,
    LLMError,
    LLMRequest,
    LLMResponse,
    transport_reason,
)
from kernelflow.llm.config import (
    DEFAULT_ANTHROPIC_MODEL,
    ProviderSpecError,
    credential_free,
)
from kernelflow.llm.gateway import (
    Gateway,
    Transient,
    estimate_tokens,
    parse_retry_after,
    redact,
    shown_texts,
)

RETRYABLE_STATUS = {408, 409, 429}  # and every 5xx, 529 "overloaded" included
# The API refuses tool ids with other characters; calls parsed from text have ids like
# ``<event id>#<n>``.
_NOT_IN_TOOL_ID = re.compile(r"[^a-zA-Z0-9_-]")


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self,
        model: str | None,
        gateway: Gateway,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.model = model or DEFAULT_ANTHROPIC_MODEL
        self.gateway = gateway
        self.base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
        if self.base_url:
            credential_free(self.base_url, "anthropic: ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")
        self._api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or None
        auth_token = os.environ.get("ANTHROPIC_AUTH_TOKEN")
        if not self._api_key and not auth_token:
            # The SDK would only say so at the first call, from inside an agent, as a
            # TypeError that fails the agent's dispatch again at every redelivery.
            raise ProviderSpecError(
                "anthropic: no credentials: set ANTHROPIC_API_KEY (or ANTHROPIC_AUTH_TOKEN)"
            )
        gateway.secrets.extend(s for s in (self._api_key, auth_token) if s)
        self._client: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _sdk(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:  # its connections are the loop's
            import anthropic

            self._loop = loop

            self._client = anthropic.AsyncAnthropic(
                api_key=self._api_key,
                base_url=self.base_url,
                max_retries=0,
                timeout=self.gateway.limits.timeout_s,
            )
        return self._client

    async def probe(self, *, call: bool = False) -> str:
        """Whether the API answers and takes the key (``Probed``): its model list, which
        costs nothing; with ``call``, a one-token message."""
        import anthropic

        where = self.base_url or "the Anthropic API"
        client = self._sdk().with_options(timeout=PROBE_TIMEOUT_S)
        try:
            await client.models.list(limit=1)
            if not call:
                return f"{where} answers and takes the key"
            started = time.monotonic()
            await client.with_options(timeout=PROBE_CALL_TIMEOUT_S).messages.create(
                model=self.model,
                max_tokens=1,
                messages=[{"role": "user", "content": "Say OK."}],
            )
        except anthropic.APIConnectionError as exc:
            raise EndpointUnreachable(
                f"nothing answers at {where} ({transport_reason(exc)})"
            ) from None
        except anthropic.APIStatusError as exc:
            if not call and exc.status_code not in (401, 403):  # up; the calls will tell
                return f"{where} answers (HTTP {exc.status_code} to its model list)"
            what = f"HTTP {exc.status_code}: {exc.api_message or exc.type or ''}"
            raise EndpointUnreachable(f"{where}: {redact(what, self.gateway.secrets)}") from None
        return f"{where} answers; a one-token message in {time.monotonic() - started:.2f}s"

    async def complete(self, request: LLMRequest) -> LLMResponse:
        started = time.monotonic()
        params = request.params
        max_tokens = int(params.get("max_tokens") or 8192)
        system: list[dict[str, Any]] = [
            {"type": "text", "text": m.content} for m in request.messages if m.role == "system"
        ]
        if system:
            system[-1]["cache_control"] = {"type": "ephemeral"}
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "messages": _messages(request.messages),
        }
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = [_tool(t) for t in request.tools]
        temperature = params.get("temperature")
        if temperature is not None:
            # Sent as a raw body field: not every SDK version still types it, every API
            # version takes it.
            body["extra_body"] = {"temperature": float(temperature)}
        estimate = estimate_tokens(shown_texts(request), max_tokens)
        self._sdk()  # import and build the client outside the timed attempts
        (message, request_id), retries = await self.gateway.call(
            lambda: self._attempt(body), estimated_tokens=estimate
        )
        usage = _usage(message)
        self.gateway.used_tokens(estimate, usage.total_tokens)
        text = "".join(
            getattr(block, "text", "")
            for block in message.content
            if getattr(block, "type", "") == "text"
        )
        tool_calls = [
            _tool_use(block)
            for block in message.content
            if getattr(block, "type", "") == "tool_use"
        ]
        return LLMResponse(
            text=text,
            provider=self.name,
            model=str(getattr(message, "model", "") or self.model),
            stop_reason=str(message.stop_reason or ""),
            usage=usage,
            latency_s=time.monotonic() - started,
            params={
                "model": self.model,
                "max_tokens": max_tokens,
                **({"temperature": float(temperature)} if temperature is not None else {}),
                **({"base_url": self.base_url} if self.base_url else {}),
            },
            retries=retries,
            request_id=request_id or str(getattr(message, "id", "") or ""),
            tool_calls=tool_calls,
        )

    async def _attempt(self, body: dict[str, Any]) -> tuple[Any, str]:
        import anthropic

        try:
            raw = await self._sdk().messages.with_raw_response.create(**body)
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            what = f"HTTP {status} {exc.type or ''}: {exc.api_message or ''}".strip()
            if status in RETRYABLE_STATUS or status >= 500:
                raise Transient(what, parse_retry_after(exc.response.headers)) from None
            raise LLMError(f"anthropic: {redact(what, self.gateway.secrets)}") from None
        except anthropic.APITimeoutError:
            raise Transient("request timed out") from None
        except anthropic.APIConnectionError as exc:
            raise Transient(f"connection failed: {exc}") from None
        except anthropic.APIResponseValidationError as exc:
            raise Transient(f"malformed response: {exc}") from None
        except anthropic.AnthropicError as exc:
            # Missing credentials and other client-side problems: retrying cannot help.
            raise LLMError(f"anthropic: {redact(str(exc), self.gateway.secrets)}") from None
        try:
            message = await raw.parse()
            content = list(message.content)
            _ = message.usage.input_tokens
        except Exception as exc:  # the SDK's parse raises many kinds on a garbled body
            raise Transient(f"malformed response body ({type(exc).__name__})") from None
        if not content and message.stop_reason is None:
            raise Transient("malformed response: no content and no stop_reason")
        return message, str(raw.headers.get("request-id") or "")


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-format function as an Anthropic tool (which must have an input schema)."""
    out: dict[str, Any] = {"name": tool["name"]}
    if tool.get("description"):
        out["description"] = tool["description"]
    out["input_schema"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return out


def _tool_id(call_id: str | None) -> str:
    return _NOT_IN_TOOL_ID.sub("_", call_id or "") or "_"


def _messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The non-system messages as Messages API turns (system ones go to ``system``)."""
    turns: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # the tool-result turn being filled
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _tool_id(m.tool_call_id)}
            if m.content:  # the API refuses an empty result text; no content is fine
                block["content"] = m.content
            if results is None:
                results = []
                turns.append({"role": "user", "content": results})
            results.append(block)
            continue
        if m.role == "user" and results is not None:
            if m.content.strip():  # the API refuses blank text blocks
                results.append({"type": "text", "text": m.content})
        elif m.role == "assistant" and m.tool_calls:
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": m.content}] if m.content.strip() else []
            )
            blocks.extend(
                {"type": "tool_use", "id": _tool_id(c.id), "name": c.name, "input": c.args}
                for c in m.tool_calls
            )
            turns.append({"role": "assistant", "content": blocks})
        else:
            turns.append({"role": m.role, "content": m.content})
        results = None
    return turns


def _tool_use(block: Any) -> ToolUse:
    # The SDK does not validate answers: an input that is not an object is kept for the
    # tool runner to refuse, as the OpenAI provider keeps unparsable arguments.
    raw = block.input
    args = raw if isinstance(raw, dict) else {"_unparsed_arguments": json.dumps(raw)}
    return ToolUse(id=str(block.id), name=str(block.name), args=args)


def _usage(message: Any) -> Usage:
    u = message.usage

    def count(name: str) -> int:
        value = getattr(u, name, None)
        return int(value) if isinstance(value, int) else 0

    return Usage(
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_creation_input_tokens=count("cache_creation_input_tokens"),
        cache_read_input_tokens=count("cache_read_input_tokens"),
    )
