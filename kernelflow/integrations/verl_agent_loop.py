"""kernelflow as verl's multi-turn rollout engine (docs/verl.md, "Agent loop"): an agent
loop that runs each prompt through a kernelflow workflow, with the policy served by verl's
own rollout server, token in, token out.

Registered in verl's agent-loop registry as ``kernelflow_agent`` when this module is
imported (``actor_rollout_ref.model.external_lib=kernelflow.integrations.verl_agent_loop``
imports it in every agent-loop worker), or loaded by verl's agent-loop config file
(``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

    - name: kernelflow_agent
      _target_: kernelflow.integrations.verl_agent_loop.KernelflowAgentLoop
      kernelflow: {agent_type: react, tools: [calculator], max_steps: 4}

``kernelflow`` takes the ``RolloutConfig`` fields in ``LOOP_SETTINGS``. Each sample is one
kernelflow task, recorded in the log like any other: the workflow ``Rollout`` runs (one
``solver`` agent of the chosen kind), the sample's verl ``uid`` as its group id, and the
task's recorded reward as the sample's reward. The solver's LLM calls go to verl's server
manager: the agent's messages become prompt ids through verl's Continuous Token builder
(the first turn through the chat template, later ones by appending only the new messages'
tokens to the ids the server returned), the response ids and log-probs are the server's,
decoded to text only for kernelflow's parsers. The output concatenates the turns as verl's
``ToolAgentLoop`` does: mask 1 for generated tokens, 0 for what the environment added.

The NATS is kernelflow's usual one (``KF_NATS_URL``, else the embedded server of
``KF_DATA_DIR``): each worker process hosts a daemon (a conductor and its own solver role,
``solver-<hex>``, so that only the process holding a sample's policy takes its LLM calls).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

# verl (and its omegaconf) are not kernelflow dependencies: type-checked where installed.
from omegaconf import DictConfig, OmegaConf  # type: ignore[import-not-found,unused-ignore]
from verl.experimental.agent_loop.agent_loop import (  # type: ignore[import-not-found,unused-ignore]
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)
from verl.utils.profiler import simple_timer  # type: ignore[import-not-found,unused-ignore]

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import CONDUCTOR_ROLE, Daemon, DaemonConfig
from kernelflow.events import subjects
from kernelflow.events.codec import checked_command
from kernelflow.events.errors import TransportError
from kernelflow.events.model import (
    CancelTask,
    ChatMessage,
    SubmitTask,
    TaskFinished,
    TaskRejected,
)
from kernelflow.host.runtime import connected
from kernelflow.host.settings import Settings
from kernelflow.llm.base import LLMError, LLMRequest
from kernelflow.llm.token_server import TokenServerProvider, TokenTurn
from kernelflow.projections.rewards import JUDGE_REWARD, UnknownReward, get_reward, reward_input
from kernelflow.projections.task_state import TaskState, apply
from kernelflow.prompt_datasets import prompt_item
from kernelflow.rollout import SOLVER, RolloutConfig, rollout_complete

AGENT_LOOP_NAME = "kernelflow_agent"
# The RolloutConfig fields the loop's ``kernelflow`` setting may give. Sampling is verl's
# (temperature, top_p, validation's greedy decoding), and so is the model.
LOOP_SETTINGS = (
    "agent_type",
    "tools",
    "max_steps",
    "max_tokens_per_step",
    "agent_config",
    "max_concurrency",
    "rewards",
    "deadline_s",
)


def loop_settings(raw: Mapping[str, Any] | DictConfig | None) -> RolloutConfig:
    """The loop's ``kernelflow`` setting as a ``RolloutConfig``; raises ValueError."""
    plain = OmegaConf.to_container(raw) if isinstance(raw, DictConfig) else raw
    if plain is not None and not isinstance(plain, Mapping):
        raise ValueError(f"{AGENT_LOOP_NAME}: kernelflow: must be a mapping of settings")
    given = dict(plain or {})
    unknown = sorted(str(k) for k in given if k not in LOOP_SETTINGS)
    if unknown:
        raise ValueError(
            f"{AGENT_LOOP_NAME}: unknown kernelflow setting {unknown[0]!r}; "
            f"known: {', '.join(LOOP_SETTINGS)}"
        )
    for key in ("tools", "rewards"):
        if key in given:
            given[key] = tuple(given[key])
    config = RolloutConfig(**given)
    if not config.rewards:
        raise ValueError(f"{AGENT_LOOP_NAME}: rewards: name at least one reward function")
    try:
        functions = [get_reward(name) for name in config.rewards]
    except UnknownReward as exc:
        raise ValueError(f"{AGENT_LOOP_NAME}: rewards: {exc}") from exc
    if any(f.name == JUDGE_REWARD for f in functions):
        raise ValueError(
            f"{AGENT_LOOP_NAME}: the {JUDGE_REWARD!r} reward needs an LLM judge of its own, "
            "which this loop does not host; use exact_match or numeric_match"
        )
    return config


# --------------------------------------------------------------------------- the host


@dataclass
class _Host:
    """What one worker process shares among its samples: a bridge to NATS, and a daemon
    whose solver role only this process hosts."""

    bridge: Bridge
    daemon: Daemon
    provider: TokenServerProvider
    role: str
    exit: contextlib.ExitStack

    def close(self) -> None:
        self.daemon.stop()
        # The role dies with the process: its durable consumer would outlive it in NATS.
        with contextlib.suppress(Exception):
            self.daemon.remove_consumer(self.role)
        self.exit.close()


_host: _Host | None = None
_host_lock = threading.Lock()


def kernelflow_host(pool: int) -> _Host:
    """This process's host, started on first use (``pool``: solver actors, i.e. LLM calls
    in flight at once)."""
    global _host
    with _host_lock:
        if _host is None:
            with contextlib.ExitStack() as stack:  # undone if the start fails half-way
                settings = Settings()
                bridge = stack.enter_context(connected(settings))
                provider = TokenServerProvider()
                role = f"{SOLVER}-{uuid.uuid4().hex[:8]}"
                config = DaemonConfig(
                    roles=(CONDUCTOR_ROLE, role),
                    pool_sizes={role: pool, CONDUCTOR_ROLE: min(pool, 8)},
                    ack_wait_s=settings.ack_wait_s,
                    llm=provider,
                )
                daemon = Daemon(bridge, config).start()
                _host = _Host(bridge, daemon, provider, role, stack.pop_all())
        return _host


def shutdown() -> None:
    """Stop this process's host, if it runs (at exit; a test's end)."""
    global _host
    with _host_lock:
        if _host is not None:
            _host.close()
            _host = None


atexit.register(shutdown)


# --------------------------------------------------------------------------- token sequence


@dataclass(frozen=True)
class _Sequence:
    """The sample's token sequence so far, as verl's multi-turn loops keep it."""

    ids: list[int]  # prompt and response tokens
    mask: list[int]  # per response token: 1 generated, 0 added by the environment
    logprobs: list[float] | None  # per response token (None: the server returns none)
    messages: list[dict[str, Any]]  # the conversation these tokens are
    turns: int  # chat turns in it, as verl counts them (user, assistant, tool)


def _message(m: ChatMessage) -> dict[str, Any]:
    if m.tool_calls or m.tool_call_id:
        raise ValueError("native tool calls cannot be served token in, token out")
    return {"role": m.role, "content": m.content}


@dataclass
class _Conversation:
    """The token policy of one sample: serves its solver's calls through verl's server
    manager, continuing one token sequence."""

    loop: KernelflowAgentLoop
    sampling_params: dict[str, Any]
    request_id: str
    max_tokens_per_step: int | None
    # The sequence after each call, in call order.
    served: list[_Sequence] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    failure: Exception | None = None  # what broke the loop (not a spent token budget)

    async def generate(self, request: LLMRequest) -> TokenTurn:
        try:
            return await self._generate(request)
        except LLMError:
            raise
        except Exception as exc:
            self.failure = exc
            raise

    async def _generate(self, request: LLMRequest) -> TokenTurn:
        if request.tools:
            raise ValueError(
                f"{AGENT_LOOP_NAME} serves tool calls in text only (tool_format: text)"
            )
        if request.call_index > len(self.served):
            raise ValueError(f"call {request.call_index} came before call {len(self.served)}")
        # A call made again (its answer never reached the log) replaces it and what followed.
        del self.served[request.call_index :]
        before = await self._context([_message(m) for m in request.messages], request)
        budget = self.loop.response_length - len(before.mask)
        if budget <= 0:  # verl's multi-turn loops stop here too
            raise LLMError(f"response_length ({self.loop.response_length} tokens) reached")
        params = dict(self.sampling_params)
        params["max_tokens"] = min(budget, self.max_tokens_per_step or budget)
        with simple_timer("generate_sequences", self.metrics):
            out = await self.loop.server_manager.generate(
                request_id=self.request_id, prompt_ids=before.ids, sampling_params=params
            )
        merged, mask, logprobs = await self.loop.ct_merge_assistant_token(
            before.ids,
            out.token_ids,
            before.mask,
            (before.logprobs or []) if out.log_probs is not None else before.logprobs,
            assistant_logprobs=out.log_probs,
        )
        tokenizer: Any = self.loop.tokenizer
        text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
        reply = {"role": "assistant", "content": text}
        self.served.append(
            _Sequence(merged.token_ids, mask, logprobs, [*before.messages, reply], before.turns + 1)
        )
        return TokenTurn(
            prompt_ids=list(before.ids),
            response_ids=list(out.token_ids),
            logprobs=None if out.log_probs is None else list(out.log_probs),
            text=text,
            model=self.loop.model_name,
            stop_reason=out.stop_reason or "",
        )

    async def _context(self, messages: list[dict[str, Any]], request: LLMRequest) -> _Sequence:
        """The sequence the model continues for this call: the chat template's rendering of
        the first call's messages; after that the last call's tokens (the server's) and the
        tokens of the messages added since."""
        if not self.served:
            ids = await self.loop.ct_build_initial_tokens(messages)
            return _Sequence(list(ids), [], None, messages, turns=1)
        last = self.served[-1]
        if messages[: len(last.messages)] != last.messages:
            raise ValueError(
                f"call {request.call_index} of agent {request.agent!r} does not continue its "
                "conversation: verl trains one token sequence per sample, so the workflow's "
                "LLM calls must each extend the one before"
            )
        if len(messages) == len(last.messages):
            # The reply before was only a thought: the model speaks again, after the chat
            # template's generation prompt (the builder's own hooks, as its merges use them).
            builder = self.loop.continuous_token_builder
            prompt = builder._tokenize_generation_prompt_delta(messages)
            merged = builder._merge_context_token_ids(
                last.ids, prompt, previous_messages=last.messages, appended_messages=[]
            )
            mask, logprobs = builder.align_response_metadata(merged, last.mask, last.logprobs)
            return _Sequence(merged.token_ids, mask, logprobs, messages, last.turns)
        merged, mask, logprobs = await self.loop.ct_merge_context_msg(
            last.messages, messages, last.ids, last.mask, last.logprobs
        )
        return _Sequence(merged.token_ids, mask, logprobs, messages, last.turns + 1)


# --------------------------------------------------------------------------- the loop


@register(AGENT_LOOP_NAME)
class KernelflowAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, kernelflow: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.settings = loop_settings(kernelflow)
        self.response_length: int = self.rollout_config.response_length
        self.model_name = str(self.config.actor_rollout_ref.model.path)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        loop = asyncio.get_running_loop()
        host = await loop.run_in_executor(None, kernelflow_host, self.settings.max_concurrency)
        command = self.submit_command(kwargs, host.role)
        task_id = command.task_id or ""
        conversation = _Conversation(
            self, sampling_params, task_id, self.settings.max_tokens_per_step
        )
        bridge = host.bridge
        host.provider.attach(task_id, host.role, conversation, loop)
        started = time.monotonic()
        try:
            await asyncio.wrap_future(
                bridge.spawn(bridge.commands.publish(command, subjects.SUBMIT))
            )
            state = await asyncio.wrap_future(bridge.spawn(_rewarded(bridge, task_id)))
        except asyncio.CancelledError:  # verl gave up on the sample: so does kernelflow
            cancel = CancelTask(task_id=task_id, reason=f"{AGENT_LOOP_NAME}: rollout stopped")
            bridge.spawn(bridge.commands.publish(cancel, subjects.CANCEL))
            raise
        finally:
            host.provider.detach(task_id, host.role)
        # What would make every sample a useless one is said, not trained on.
        if isinstance(state.terminal, TaskRejected):
            raise RuntimeError(
                f"{AGENT_LOOP_NAME}: task {task_id} refused: {state.terminal.reason}"
            )
        if conversation.failure is not None:
            raise RuntimeError(
                f"{AGENT_LOOP_NAME}: task {task_id}: {conversation.failure}"
            ) from conversation.failure
        return await self._output(conversation, state, kwargs, time.monotonic() - started)

    def submit_command(self, sample: Mapping[str, Any], role: str) -> SubmitTask:
        """The task for one sample: ``Rollout``'s workflow with its solver as ``role``, in
        the group of the sample's verl ``uid`` (the n rollouts of a prompt)."""
        doc = yaml.safe_load(self.settings.workflow_yaml())
        doc["agent_info"] = {role: doc["agent_info"][SOLVER]}
        doc["start_agent"] = role
        task_id = f"verl-{uuid.uuid4().hex[:16]}"
        uid = sample.get("uid")
        # The verl row the sample came from, recorded so that exports give it back as it was.
        item = prompt_item(
            {**_plain(sample), "prompt": _plain(sample["raw_prompt"])}, f"verl sample {uid}"
        )
        metadata = {"verl_uid": str(uid)} if uid is not None else {}
        if sample.get("index") is not None:
            metadata["verl_index"] = str(sample["index"])
        if sample.get("data_source") is not None:
            metadata["data_source"] = str(sample["data_source"])
        metadata |= item.metadata
        command = checked_command(
            SubmitTask(
                task_id=task_id,
                task_name=metadata.get("verl_index", ""),
                task_source="",
                prompt=item.prompt,
                reference_answer=item.reference,
                workflow_name=f"verl_{self.settings.agent_type}",
                workflow_yaml=yaml.safe_dump(doc, sort_keys=False),
                group_id=str(uid) if uid is not None else task_id,
                rewards=list(self.settings.rewards),
                deadline_s=self.settings.deadline_s,
                metadata=metadata,
            )
        )
        assert isinstance(command, SubmitTask)
        return command

    async def _output(
        self,
        conversation: _Conversation,
        state: TaskState,
        sample: Mapping[str, Any],
        elapsed_s: float,
    ) -> AgentLoopOutput:
        if conversation.served:
            final = conversation.served[-1]
        else:  # no call was made (the task was refused, or out of time): the prompt only
            messages = list(sample["raw_prompt"])
            final = _Sequence(await self.ct_build_initial_tokens(messages), [], None, [], 1)
        cut, length = len(final.ids) - len(final.mask), self.response_length
        # As recorded; one a task did not record (cancelled from outside kernelflow) is
        # computed by the same function, as kernelflow's exports do.
        functions = [get_reward(name) for name in self.settings.rewards]
        inputs = reward_input(state)
        rewards = {
            f.name: state.rewards[f.name].value if f.name in state.rewards else f(inputs)
            for f in functions
        }
        generating = conversation.metrics.get("generate_sequences", 0.0)
        end = state.terminal
        return AgentLoopOutput(
            prompt_ids=final.ids[:cut],
            response_ids=final.ids[cut:][:length],
            response_mask=final.mask[:length],
            response_logprobs=None if final.logprobs is None else final.logprobs[:length],
            reward_score=rewards[functions[0].name],
            num_turns=final.turns,
            # verl's "tool_calls" time: all the rollout did besides generating.
            metrics=AgentLoopMetrics(
                generate_sequences=generating, tool_calls=elapsed_s - generating
            ),
            extra_fields={
                "turn_scores": [],
                "tool_rewards": [],
                "reward_extra_info": rewards,
                "kernelflow_task_id": state.task_id,
                "kernelflow_status": (
                    end.status if isinstance(end, TaskFinished) else type(end).__name__
                ),
            },
        )


async def _rewarded(bridge: Bridge, task_id: str) -> TaskState:
    """Fold the task's events until it is over with all its rewards recorded."""
    state, position = TaskState(task_id), 1
    while True:
        try:
            reading = bridge.log.read(
                start_seq=position, subject=subjects.task_events(task_id), follow=True
            )
            async with contextlib.aclosing(reading):
                async for seq, event in reading:
                    position = seq + 1
                    apply(state, event)
                    if rollout_complete(state):
                        return state
        except (TransportError, TimeoutError):
            await asyncio.sleep(0.5)  # a slow or restarting server: go on where we were


def _plain(value: Any) -> Any:
    """A sample's value as JSON would give it (verl's rows may hold numpy arrays)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return _plain(value.tolist())
    return value


__all__ = [
    "AGENT_LOOP_NAME",
    "LOOP_SETTINGS",
    "KernelflowAgentLoop",
    "kernelflow_host",
    "loop_settings",
    "shutdown",
]
