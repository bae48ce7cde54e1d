"""Claude through the official ``anthropic`` SDK (``AsyncAnthropic``), on the bridge loop.

The SDK's own retries are off: the gateway retries (so every retry is counted and
recorded, and a ``retry-after`` holds back every call to the endpoint). Leading system
messages become the ``system`` blocks, the last one marked for prompt caching: prompts put
their static part (role, rules, DSL guidance) there.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from actors.llm.base import LLMError, LLMRequest, LLMResponse
from actors.llm.config import DEFAULT_ANTHROPIC_MODEL
from actors.llm.gateway import Gateway, Transient, estimate_tokens, parse_retry_after, redact
from events.model import Usage

RETRYABLE_STATUS = {408, 409, 429}  # and every 5xx, 529 "overloaded" included


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
        self._api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or None
        gateway.secrets.extend(
            s for s in (self._api_key, os.environ.get("ANTHROPIC_AUTH_TOKEN")) if s
        )
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

    async def complete(self, request: LLMRequest) -> LLMResponse:
        started = time.monotonic()
        params = request.params
        max_tokens = int(params.get("max_tokens") or 8192)
        system: list[dict[str, Any]] = [
            {"type": "text", "text": m.content} for m in request.messages if m.role == "system"
        ]
        if system:
            system[-1]["cache_control"] = {"type": "ephemeral"}
        messages = [
            {"role": m.role, "content": m.content} for m in request.messages if m.role != "system"
        ]
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "messages": messages}
        if system:
            body["system"] = system
        temperature = params.get("temperature")
        if temperature is not None:
            # Sent as a raw body field: not every SDK version still types it, every API
            # version takes it.
            body["extra_body"] = {"temperature": float(temperature)}
        estimate = estimate_tokens((m.content for m in request.messages), max_tokens)
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
