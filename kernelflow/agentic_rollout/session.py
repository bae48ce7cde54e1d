"""How an agent's calls reach the journal of the run that makes them (docs/agents.md,
"AgenticRollout"): the model function an agent is handed, its tools, and the user's own
model function or a provider behind both.

A run of ``run_trajectory`` has a journal (``kernelflow.actors.kinds.durable.Journal``):
in a standalone run a recorder that makes each call and records it, in a daemon the
replay of the dispatch's record. The journal of the run is a context variable, so it
follows the run into the tasks it starts, and concurrent runs of one agent each have
their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from kernelflow.actors.kinds.durable import Journal, ModelCall
from kernelflow.agentic_rollout.limits import RetryPolicy, ToolLimits, ToolResultCache
from kernelflow.agentic_rollout.tools import ToolExecutionError
from kernelflow.events.model import ChatMessage, Usage
from kernelflow.llm.base import LLMProvider, LLMRequest, LLMResponse
from kernelflow.tools.base import CallWindow

# What ``llm_generate_func`` is: ``await fn(messages, **kwargs)`` gives text, or a dict
# with the text and what the model says of its tokens (``RESPONSE_KEYS``).
ModelFunction = Callable[..., Any]
RESPONSE_KEYS = (
    "text",
    "token_ids",
    "logprobs",
    "prompt_token_ids",
    "usage",
    "model",
    "stop_reason",
)

_ACTIVE: ContextVar[Journal | None] = ContextVar("kernelflow_agent_journal", default=None)


def active_journal() -> Journal | None:
    """The journal of the run this code is part of (None: outside any run)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def journaling(journal: Journal) -> Iterator[None]:
    token = _ACTIVE.set(journal)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class ProviderModel:
    """A kernelflow LLM provider (``AgenticRolloutConfig.llm``, a provider spec) as an
    ``llm_generate_func``: inside a run its calls are the provider's, recorded with all it
    answers; called directly, it answers with the text."""

    def __init__(self, provider: LLMProvider, agent: str) -> None:
        self.provider = provider
        self.agent = agent
        self._direct_calls = 0

    async def __call__(self, messages: Sequence[Any], **kwargs: Any) -> str:
        request = LLMRequest(
            task_id="direct",
            agent=self.agent,
            call_index=self._direct_calls,
            messages=chat_messages(messages),
            params=kwargs,
        )
        self._direct_calls += 1
        return (await self.provider.complete(request)).text


def model_call(
    fn: ModelFunction | None,
    messages: Sequence[Any],
    kwargs: dict[str, Any],
    retry: RetryPolicy | None = None,
) -> ModelCall:
    """How a run's journal makes one call of ``fn`` with ``messages`` (as the agent gave
    them) and ``kwargs``: tried again by ``retry`` when it fails in a transient way (the
    failures counted in the recorded call's ``retries``). A provider retries by itself."""
    if isinstance(fn, ProviderModel):
        return fn.provider.complete

    async def once() -> Any:
        if fn is None:
            raise TypeError("no model: pass llm_generate_func (or set AgenticRolloutConfig.llm)")
        return await _awaited(fn(list(messages), **kwargs))

    async def call(request: LLMRequest) -> LLMResponse:
        started = time.monotonic()
        answer, failures = await (retry or RetryPolicy(max_attempts=1)).run(once)
        response = response_of(answer, time.monotonic() - started, _name_of(fn))
        return dataclasses.replace(response, retries=failures)

    return call


def journaled_model(
    journal: Journal, fn: ModelFunction | None, retry: RetryPolicy | None = None
) -> Callable[..., Awaitable[str]]:
    """The model function an agent is handed for a run: each call goes through
    ``journal`` and answers with the reply's text."""

    async def generate(messages: Sequence[Any], **kwargs: Any) -> str:
        recorded = await journal.llm(
            chat_messages(messages), dict(kwargs), model_call(fn, messages, kwargs, retry)
        )
        return recorded.response_text

    return generate


class JournaledTool:
    """One of an agent's tools as its code calls it (``agent.tools[name]``; ``tool`` is
    the object given to ``set_tools``, and every other attribute is that tool's): a call
    within a run goes through the run's journal, so it is recorded, or read back from
    the log that holds it. Where it is made it is answered from the agent's cache if that
    holds it, else refused beyond the tool's ``rate_limit`` and stopped after its
    ``max_execution_time``; a transient failure is tried again (``retry``), each attempt a
    call of its own (docs/agents.md, "Tool limits, retries and the cache")."""

    def __init__(
        self,
        name: str,
        tool: Any,
        limits: ToolLimits,
        retry: RetryPolicy,
        cache: ToolResultCache | None,
    ) -> None:
        self.name = name
        self.tool = tool
        self.limits = limits
        self.retry = retry
        self.cache = cache
        self.window = CallWindow()

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.tool, attribute)

    def __repr__(self) -> str:
        return f"JournaledTool({self.name!r}, {self.tool!r})"

    async def execute(self, **kwargs: Any) -> Any:
        result, _ = await self.retry.run(lambda: self._call(kwargs))
        return result

    async def _call(self, kwargs: dict[str, Any]) -> Any:
        journal = active_journal()
        if journal is None:
            return await self._make(kwargs)
        return await journal.tool(self.name, kwargs, lambda: self._make(kwargs))

    async def _make(self, kwargs: dict[str, Any]) -> Any:
        key = ToolResultCache.key(self.name, kwargs)
        if self.cache is not None:
            hit, result = self.cache.get(key)
            if hit:
                return result
        wait = self.window.take(time.monotonic(), self.limits.rate_limit)
        if wait is not None:
            raise ToolExecutionError(
                f"rate limit: {self.name} allows {self.limits.rate_limit} calls per minute "
                f"(the next in {wait:.0f}s)"
            )
        limit = self.limits.max_execution_time
        try:
            result = await asyncio.wait_for(_awaited(self.tool.execute(**kwargs)), limit)
        except TimeoutError:
            raise TimeoutError(f"{self.name} timed out after {limit:g}s") from None
        if self.cache is not None:
            self.cache.put(key, result)
        return result


def tool_spec(name: str, tool: Any) -> dict[str, Any]:
    """A tool as the OpenAI function format gives it (what prompts list): its
    ``description`` and ``parameters_schema`` where it has them as plain data."""
    description = getattr(tool, "description", "")
    schema = getattr(tool, "parameters_schema", None)
    return {
        "name": name,
        "description": description if isinstance(description, str) else "",
        "parameters": schema if isinstance(schema, dict) else {"type": "object"},
    }


def chat_messages(messages: Sequence[Any]) -> list[ChatMessage]:
    """Chat messages as the log records them: dicts with a role and a content (a content
    that is not text, a multimodal list say, is kept as its JSON)."""
    out = []
    for m in messages:
        if isinstance(m, ChatMessage):
            out.append(m)
            continue
        content = m.get("content", "")
        text = content if isinstance(content, str) else json.dumps(content, default=str)
        out.append(ChatMessage(role=str(m.get("role", "user")), content=text))
    return out


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as a model function is given them."""
    return [{"role": m.role, "content": m.content} for m in messages]


def response_of(answer: Any, latency_s: float, model: str) -> LLMResponse:
    """What a model function answered, as a provider's response: its text, or a dict
    with ``text`` and any of ``RESPONSE_KEYS``."""
    if isinstance(answer, str):
        return LLMResponse(text=answer, provider="function", model=model, latency_s=latency_s)
    if not isinstance(answer, Mapping) or not isinstance(answer.get("text"), str):
        raise TypeError(
            "llm_generate_func must return the reply's text, or a dict with it under 'text' "
            f"(got {type(answer).__name__})"
        )
    unknown = sorted(str(k) for k in answer if k not in RESPONSE_KEYS)
    if unknown:
        raise TypeError(
            f"llm_generate_func returned unknown key {unknown[0]!r}; "
            f"known: {', '.join(RESPONSE_KEYS)}"
        )
    token_ids = _ints(answer.get("token_ids"))
    prompt_ids = _ints(answer.get("prompt_token_ids"))
    return LLMResponse(
        text=answer["text"],
        provider="function",
        model=str(answer.get("model") or model),
        stop_reason=str(answer.get("stop_reason") or ""),
        usage=_usage(answer.get("usage"), prompt_ids, token_ids),
        latency_s=latency_s,
        token_ids=token_ids,
        logprobs=None if answer.get("logprobs") is None else [float(x) for x in answer["logprobs"]],
        prompt_token_ids=prompt_ids,
    )


def _usage(given: Any, prompt_ids: list[int] | None, token_ids: list[int] | None) -> Usage:
    """The tokens a call took: as the function says (``input_tokens`` and
    ``output_tokens``, or OpenAI's ``prompt_tokens`` and ``completion_tokens``), else
    counted from the ids it returned."""
    if given is None:
        return Usage(input_tokens=len(prompt_ids or ()), output_tokens=len(token_ids or ()))
    if not isinstance(given, Mapping):
        raise TypeError(f"llm_generate_func: usage must be a dict, got {type(given).__name__}")
    return Usage(
        input_tokens=int(given.get("input_tokens", given.get("prompt_tokens", 0))),
        output_tokens=int(given.get("output_tokens", given.get("completion_tokens", 0))),
    )


def _ints(values: Any) -> list[int] | None:
    return None if values is None else [int(x) for x in values]


def _name_of(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
