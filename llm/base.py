"""The interface every LLM provider implements. Calls are async and run on the bridge's
event loop, so one daemon can keep many calls in flight without a thread per call."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelflow.events.model import ChatMessage, LLMCalled, ToolUse, Usage

# An AgentFailed whose error starts with this ended because a token or cost budget is
# spent; the conductor then finishes the task with status "budget_exceeded".
BUDGET_EXHAUSTED = "budget exhausted:"


class LLMError(RuntimeError):
    """The provider could not answer (after its own retries)."""


class EndpointUnreachable(LLMError):
    """A provider's server cannot be used (``probe``): nothing answers at its URL, it
    refuses the key, it serves no such model. The message names the URL and why."""


# How long a probe waits for a server to answer at all, and for a one-token completion
# (a cold server may load its model first).
PROBE_TIMEOUT_S = 5.0
PROBE_CALL_TIMEOUT_S = 60.0


def transport_reason(exc: BaseException) -> str:
    """Why a connection failed, in words ("connection refused", not a client's class
    and errno): the operating system's reason where one is in the chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, socket.gaierror) and seen.strerror:  # a name not found
            return seen.strerror.lower()
        if isinstance(seen, OSError) and seen.errno and seen.errno > 0:
            return os.strerror(seen.errno).lower()
        seen = seen.__cause__ or seen.__context__
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "No route to host"):
        if marker in text:
            return marker.lower()
    return text or type(exc).__name__


class BudgetExceeded(LLMError):
    """A token or cost budget is spent; the message starts with ``BUDGET_EXHAUSTED``."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{BUDGET_EXHAUSTED} {detail}")


def is_budget_error(error: str) -> bool:
    return error.startswith(BUDGET_EXHAUSTED)


@dataclass(frozen=True)
class LLMRequest:
    task_id: str
    agent: str
    # How many calls this agent already made for this task: lets deterministic providers
    # (scripted, replay) answer the same request the same way after a crash.
    call_index: int
    messages: list[ChatMessage]
    params: dict[str, Any] = field(default_factory=dict)
    # Tools the model may call natively, in the OpenAI function format
    # ({"name", "description", "parameters": JSON Schema}); each provider translates them
    # to its API. Empty: a plain completion.
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class LLMResponse:
    text: str
    provider: str
    model: str
    stop_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    latency_s: float = 0.0
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    # The parameters the call was really made with (model, temperature, max_tokens...),
    # recorded on top of the request's own. Never credentials.
    params: dict[str, Any] = field(default_factory=dict)
    cost_usd: float | None = None
    retries: int = 0
    request_id: str = ""
    prompt_token_ids: list[int] | None = None
    # Native tool calls the model made (empty when it answered in text only).
    tool_calls: list[ToolUse] = field(default_factory=list)


class LLMProvider(Protocol):
    name: str

    async def complete(self, request: LLMRequest) -> LLMResponse: ...


class Probed(Protocol):
    """A provider with a server to reach."""

    async def probe(self, *, call: bool = False) -> str:
        """Whether its server answers, at once and without retries; with ``call``, a
        one-token completion too. What answered; EndpointUnreachable saying why not."""
        ...


def llm_called(
    request: LLMRequest, response: LLMResponse, *, dispatch_id: str, cause: str
) -> LLMCalled:
    """The event that records one call in the log, exactly as it was made and answered."""
    return LLMCalled(
        task_id=request.task_id,
        cause=cause,
        agent=request.agent,
        dispatch_id=dispatch_id,
        provider=response.provider,
        model=response.model,
        messages=request.messages,
        params={**request.params, **response.params},
        response_text=response.text,
        stop_reason=response.stop_reason,
        usage=response.usage,
        latency_s=response.latency_s,
        token_ids=response.token_ids,
        logprobs=response.logprobs,
        cost_usd=response.cost_usd,
        retries=response.retries,
        request_id=response.request_id,
        prompt_token_ids=response.prompt_token_ids,
        tools=request.tools,
        tool_calls=response.tool_calls,
    )
