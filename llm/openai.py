"""Any OpenAI-compatible chat-completions server (vLLM, SGLang, Ollama, a gateway).

Spec: ``openai:URL[#MODEL]`` (``URL`` is the API base, e.g. ``http://host:8000/v1``;
without ``#MODEL`` the server's first model from ``GET /models`` is used). The key, if the
server wants one, comes from ``KF_OPENAI_API_KEY`` or ``OPENAI_API_KEY``; a URL with
credentials in it (``http://user:pass@host/v1``) is refused.

It asks for token log-probabilities (``logprobs``) and for token ids (vLLM's and SGLang's
extensions, ``TOKEN_ID_EXTENSIONS``); what the server returns is recorded: token ids as
vLLM and SGLang give them, or in the log-probabilities (vLLM's ``token_id:N`` tokens,
llama.cpp's ``id``). A server that refuses the extensions (HTTP 400) is asked again
without them, and not asked for them again. ``probe`` checks, before anything runs, that
the server answers and serves the model (docs/llm.md has what each server returns).

Tools are offered as ``{"type": "function", "function": ...}``; the tool calls in an
answer become ``ToolUse`` (arguments that are not a JSON object are kept as
``{"_unparsed_arguments": RAW}``, for the tool runner to refuse).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

import httpx2

from kernelflow.common.suggest import did_you_mean
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
from kernelflow.llm.config import OpenAIOptions, credential_free
from kernelflow.llm.gateway import (
    Gateway,
    Transient,
    estimate_tokens,
    parse_retry_after,
    redact,
    shown_texts,
)

log = logging.getLogger("kernelflow.llm")
RETRYABLE_STATUS = {408, 409, 429}
TOKEN_ID_PREFIX = "token_id:"
# What servers are asked for to return token ids (docs/llm.md, "Token ids and
# log-probabilities"): vLLM's answer's and prompt's ids, and its logprobs' tokens as ids;
# SGLang's prompt ids (its answer's come with return_token_ids too). A server ignores the
# ones it does not know, or refuses them all (HTTP 400: not asked again).
TOKEN_ID_EXTENSIONS = ("return_token_ids", "return_tokens_as_token_ids", "return_prompt_token_ids")


class OpenAIProvider:
    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None,
        gateway: Gateway,
        options: OpenAIOptions | None = None,
        *,
        api_key: str | None = None,
    ) -> None:
        self.base_url = credential_free(base_url, "openai", "KF_OPENAI_API_KEY").rstrip("/")
        self.model = model or None
        self.gateway = gateway
        self.options = options or OpenAIOptions()
        self._api_key = (
            api_key or os.environ.get("KF_OPENAI_API_KEY") or os.environ.get("OPENAI_API_KEY")
        )
        if self._api_key:
            gateway.secrets.append(self._api_key)
        self._extensions = self.options.token_ids
        self._client: httpx2.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx2.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:  # its connections are the loop's
            self._loop = loop
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            self._client = httpx2.AsyncClient(
                headers=headers,
                timeout=self.gateway.limits.timeout_s,
                limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64),
            )
        return self._client

    async def _model(self) -> str:
        if self.model is None:
            try:
                reply = await self._http().get(f"{self.base_url}/models")
                reply.raise_for_status()
                self.model = str(reply.json()["data"][0]["id"])
            except (httpx2.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                raise LLMError(
                    f"openai: no model given ({self.base_url}#MODEL) and none could be read "
                    f"from {self.base_url}/models: {redact(str(exc), self.gateway.secrets)}"
                ) from None
        return self.model

    async def probe(self, *, call: bool = False) -> str:
        """Whether the server answers (``Probed``): its model list, with ``#MODEL`` one of
        its models; with ``call``, a one-token completion, saying whether it returned
        token ids and log-probabilities (what training data needs: docs/llm.md)."""
        listing = f"{self.base_url}/models"
        try:
            reply = await self._http().get(listing, timeout=PROBE_TIMEOUT_S)
        except httpx2.TimeoutException:
            raise EndpointUnreachable(
                f"{self.base_url} did not answer within {PROBE_TIMEOUT_S:g}s"
            ) from None
        except httpx2.HTTPError as exc:
            raise EndpointUnreachable(
                f"nothing answers at {self.base_url} ({transport_reason(exc)})"
            ) from None
        if reply.status_code in (401, 403):
            why = redact(_error_message(reply), self.gateway.secrets)
            raise EndpointUnreachable(
                f"{listing} refused the key (HTTP {reply.status_code}: {why}; "
                "KF_OPENAI_API_KEY or OPENAI_API_KEY holds it)"
            )
        served = _model_ids(reply)  # none where the server lists none: it answered
        if self.model and served and self.model not in served:
            raise EndpointUnreachable(
                f"{self.base_url} serves no model {self.model!r}"
                f"{did_you_mean(self.model, served)} (it serves: {', '.join(served[:5])})"
            )
        said = f"{self.base_url} answers" + (f", serving {', '.join(served[:3])}" if served else "")
        if not call:
            return said
        body: dict[str, Any] = {
            "model": await self._model(),
            "messages": [{"role": "user", "content": "Say OK."}],
            "max_tokens": 1,
        }
        if self.options.logprobs:
            body["logprobs"] = True
        started = time.monotonic()
        try:
            answer, _ = await asyncio.wait_for(self._attempt(body), PROBE_CALL_TIMEOUT_S)
        except (Transient, LLMError, TimeoutError) as exc:
            why = redact(
                str(exc) or f"no answer within {PROBE_CALL_TIMEOUT_S:g}s", self.gateway.secrets
            )
            raise EndpointUnreachable(
                f"a one-token completion at {self.base_url} failed: {why}"
            ) from None
        token_ids, logprobs = _tokens(_read_answer(answer)[0])
        return (
            f"{said}; a one-token completion in {time.monotonic() - started:.2f}s, "
            f"token ids: {'yes' if token_ids else 'no'}, "
            f"log-probabilities: {'yes' if logprobs else 'no'}"
        )

    async def complete(self, request: LLMRequest) -> LLMResponse:
        started = time.monotonic()
        model = await self._model()
        params = request.params
        max_tokens = int(params.get("max_tokens") or 8192)
        body: dict[str, Any] = {
            "model": model,
            "messages": [_message(m) for m in request.messages],
            "max_tokens": max_tokens,
        }
        if request.tools:
            body["tools"] = [{"type": "function", "function": t} for t in request.tools]
        if params.get("temperature") is not None:
            body["temperature"] = float(params["temperature"])
        if self.options.logprobs:
            body["logprobs"] = True
            if self.options.top_logprobs:
                body["top_logprobs"] = self.options.top_logprobs
        estimate = estimate_tokens(shown_texts(request), max_tokens)
        (answer, request_id), retries = await self.gateway.call(
            lambda: self._attempt(body), estimated_tokens=estimate
        )
        choice, usage = _read_answer(answer)
        self.gateway.used_tokens(estimate, usage.total_tokens)
        token_ids, logprobs = _tokens(choice)
        prompt_ids = answer.get("prompt_token_ids") or choice.get("prompt_token_ids")
        return LLMResponse(
            text=str(choice["message"].get("content") or ""),
            provider=self.name,
            model=str(answer.get("model") or model),
            stop_reason=str(choice.get("finish_reason") or ""),
            usage=usage,
            latency_s=time.monotonic() - started,
            token_ids=token_ids,
            logprobs=logprobs,
            prompt_token_ids=_int_list(prompt_ids),
            params={
                "model": model,
                "max_tokens": max_tokens,
                "base_url": self.base_url,
                **({"temperature": body["temperature"]} if "temperature" in body else {}),
                **({"logprobs": True} if self.options.logprobs else {}),
            },
            retries=retries,
            request_id=request_id or str(answer.get("id") or ""),
            tool_calls=_tool_calls(choice["message"]),
        )

    async def _attempt(self, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        sent = dict(body)
        if self._extensions:
            sent.update(dict.fromkeys(TOKEN_ID_EXTENSIONS, True))
        try:
            reply = await self._http().post(f"{self.base_url}/chat/completions", json=sent)
        except httpx2.TimeoutException:
            raise Transient("request timed out") from None
        except httpx2.TransportError as exc:
            raise Transient(f"connection failed: {type(exc).__name__}: {exc}") from None
        status = reply.status_code
        if status >= 400:
            what = f"HTTP {status}: {_error_message(reply)}"
            if status == 400 and self._extensions:
                log.warning(
                    "openai: %s refused the token-id extensions (%s); not asking again",
                    self.base_url,
                    redact(what, self.gateway.secrets),
                )
                self._extensions = False
                return await self._attempt(body)
            if status in RETRYABLE_STATUS or status >= 500:
                raise Transient(what, parse_retry_after(reply.headers))
            raise LLMError(f"openai: {redact(what, self.gateway.secrets)}")
        try:
            answer = reply.json()
            _read_answer(answer)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise Transient(f"malformed response body ({type(exc).__name__})") from None
        request_id = reply.headers.get("x-request-id") or reply.headers.get("request-id") or ""
        return answer, request_id


def _message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.tool_calls:
        return {
            "role": m.role,
            "content": m.content or None,  # an assistant that only called tools said nothing
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.dumps(c.args)},
                }
                for c in m.tool_calls
            ],
        }
    return {"role": m.role, "content": m.content}


def _read_answer(answer: Any) -> tuple[dict[str, Any], Usage]:
    """The first choice and the usage; raises on a body that is not a chat completion."""
    choice = answer["choices"][0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise TypeError("choice without a message")
    _tool_calls(choice["message"])
    raw = answer.get("usage") or {}
    return choice, Usage(
        input_tokens=int(raw.get("prompt_tokens") or 0),
        output_tokens=int(raw.get("completion_tokens") or 0),
    )


def _tool_calls(message: dict[str, Any]) -> list[ToolUse]:
    """The answer's tool calls; raises on entries that are not function calls (a malformed
    body, retried like one)."""
    calls = []
    for n, raw in enumerate(message.get("tool_calls") or []):
        function = raw["function"]
        name = function["name"]
        if not isinstance(name, str):
            raise TypeError("tool call without a function name")
        args = _arguments(function.get("arguments"))
        calls.append(ToolUse(id=str(raw.get("id") or f"call_{n}"), name=name, args=args))
    return calls


def _arguments(raw: object) -> dict[str, Any]:
    """A call's arguments. Ones that are not a JSON object are the model's mistake, not the
    server's: kept raw, for the tool runner to tell the model."""
    if isinstance(raw, dict):  # some servers send the object itself
        return raw
    if raw is None or not str(raw).strip():
        return {}  # a call of a function without parameters
    try:
        args = json.loads(str(raw))
    except ValueError:
        args = None
    return args if isinstance(args, dict) else {"_unparsed_arguments": str(raw)}


def _model_ids(reply: httpx2.Response) -> list[str]:
    """The model ids of a ``GET /models`` answer (none for one that is not a list)."""
    try:
        data = reply.json()["data"] if reply.status_code < 400 else []
        return [str(m["id"]) for m in data]
    except (ValueError, KeyError, TypeError):
        return []


def _int_list(value: object) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _tokens(choice: dict[str, Any]) -> tuple[list[int] | None, list[float] | None]:
    """Token ids and log-probabilities of the answer, where the server gave them."""
    token_ids = _int_list(choice.get("token_ids"))
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list) or not content:
        return token_ids, None
    logprobs: list[float] | None = []
    from_tokens: list[int] | None = []
    for entry in content:
        lp = entry.get("logprob") if isinstance(entry, dict) else None
        if logprobs is not None and isinstance(lp, int | float):
            logprobs.append(float(lp))
        else:
            logprobs = None
        token_id = _logprob_token_id(entry)
        if from_tokens is not None and token_id is not None:
            from_tokens.append(token_id)
        else:
            from_tokens = None
    return token_ids if token_ids is not None else from_tokens, logprobs


def _logprob_token_id(entry: object) -> int | None:
    """The token id of one log-probability entry, where the server gives it: vLLM's
    ``token_id:N`` tokens, llama.cpp's ``id``."""
    if not isinstance(entry, dict):
        return None
    if isinstance(entry.get("id"), int) and not isinstance(entry["id"], bool):
        return int(entry["id"])
    token = entry.get("token")
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        digits = token[len(TOKEN_ID_PREFIX) :]
        return int(digits) if digits.isdigit() else None
    return None


def _error_message(reply: httpx2.Response) -> str:
    try:
        body = reply.json()
    except (ValueError, json.JSONDecodeError):
        return reply.text[:300] or reply.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or error)[:300]
    if isinstance(error, str):
        return error[:300]
    return str(body)[:300]
