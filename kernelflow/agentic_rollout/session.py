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

import contextlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from kernelflow.actors.kinds.durable import Journal, ModelCall
from kernelflow.events.model import ChatMessage, Usage
from kernelflow.llm.base import LLMProvider, LLMRequest, LLMResponse

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
    fn: ModelFunction | None, messages: Sequence[Any], kwargs: dict[str, Any]
) -> ModelCall:
    """How a run's journal makes one call of ``fn`` with ``messages`` (as the agent gave
    them) and ``kwargs``."""
    if isinstance(fn, ProviderModel):
        return fn.provider.complete

    async def call(request: LLMRequest) -> LLMResponse:
        if fn is None:
            raise TypeError("no model: pass llm_generate_func (or set AgenticRolloutConfig.llm)")
        started = time.monotonic()
        answer = fn(list(messages), **kwargs)
        if inspect.isawaitable(answer):
            answer = await answer
        return response_of(answer, time.monotonic() - started, _name_of(fn))

    return call


def journaled_model(journal: Journal, fn: ModelFunction | None) -> Callable[..., Awaitable[str]]:
    """The model function an agent is handed for a run: each call goes through
    ``journal`` and answers with the reply's text."""

    async def generate(messages: Sequence[Any], **kwargs: Any) -> str:
        recorded = await journal.llm(
            chat_messages(messages), dict(kwargs), model_call(fn, messages, kwargs)
        )
        return recorded.response_text

    return generate


class JournaledTool:
    """One of an agent's tools (``BaseAgent.set_tools``): its calls within a run go
    through the run's journal; everything else is the tool's own (``tool``)."""

    def __init__(self, name: str, tool: Any) -> None:
        self.name = name
        self.tool = tool

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.tool, attribute)

    async def execute(self, **kwargs: Any) -> Any:
        journal = active_journal()
        if journal is None:
            return await _awaited(self.tool.execute(**kwargs))
        return await journal.tool(self.name, kwargs, lambda: _awaited(self.tool.execute(**kwargs)))


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
