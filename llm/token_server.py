"""A policy served token in, token out (an RL trainer's rollout server), as a provider.

A trainer that runs kernelflow rollouts with the policy it trains (verl's agent loop,
``kernelflow.integrations.verl_agent_loop``) attaches a ``TokenPolicy`` to each task it
submits, for the agent being trained. The policy turns the agent's messages into token ids
(the one place text becomes tokens: later turns continue the same token sequence), asks its
server, and answers with the ids and log-probs the server returned and their decoded text;
the call is recorded in the log with them (``LLMCalled.prompt_token_ids``, ``token_ids``,
``logprobs``), like any provider's.

It is not chosen by a ``--llm`` spec: a policy is a live object of the process that
submitted the task, so only that process can serve its calls. The policy runs on the
trainer's event loop (where its server client lives); the provider is called on the
bridge's and hands each call over.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from kernelflow.events.model import Usage
from kernelflow.llm.base import LLMError, LLMRequest, LLMResponse


@dataclass(frozen=True)
class TokenTurn:
    """One generation, exactly as the server saw and answered it."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None
    text: str  # the response ids decoded, for kernelflow's parsers
    model: str
    stop_reason: str = ""


class TokenPolicy(Protocol):
    async def generate(self, request: LLMRequest) -> TokenTurn: ...


class TokenServerProvider:
    name = "token_server"

    def __init__(self) -> None:
        # (task id, agent) -> the policy serving that agent's calls, and the loop it runs on.
        self._policies: dict[tuple[str, str], tuple[TokenPolicy, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()  # attached from the trainer's thread, read on the bridge's

    def attach(
        self, task_id: str, agent: str, policy: TokenPolicy, loop: asyncio.AbstractEventLoop
    ) -> None:
        with self._lock:
            self._policies[task_id, agent] = (policy, loop)

    def detach(self, task_id: str, agent: str) -> None:
        with self._lock:
            self._policies.pop((task_id, agent), None)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        with self._lock:
            found = self._policies.get((request.task_id, request.agent))
        if found is None:
            raise LLMError(
                f"no token policy serves agent {request.agent!r} of task {request.task_id}: "
                "only the process that submitted the task (and attached its policy) can"
            )
        policy, loop = found
        started = time.monotonic()
        try:
            turn = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(policy.generate(request), loop)
            )
        except LLMError:
            raise
        except Exception as exc:  # recorded as the agent's failure, not retried forever
            raise LLMError(f"token policy failed: {type(exc).__name__}: {exc}") from exc
        return LLMResponse(
            text=turn.text,
            provider=self.name,
            model=turn.model,
            stop_reason=turn.stop_reason,
            usage=Usage(input_tokens=len(turn.prompt_ids), output_tokens=len(turn.response_ids)),
            latency_s=time.monotonic() - started,
            token_ids=turn.response_ids,
            logprobs=turn.logprobs,
            prompt_token_ids=turn.prompt_ids,
        )
