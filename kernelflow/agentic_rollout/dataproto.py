"""verl's ``DataProto`` in and out of ``AgenticRollout.generate_sequences`` (docs/agents.md,
"AgenticRollout"; docs/verl.md).

In: one prompt per row, read from ``raw_prompt`` (verl's chat, ``data.return_raw_chat``)
or, with a tokenizer, decoded from ``input_ids``; the row's ``reward_model.ground_truth``
is the reference answer its rewards compare with and its ``uid`` the group its rollouts
share.

Out: per row, the task its run was recorded as (``kernelflow_task_id``), the final response,
the reward the log records for the run (``final_reward``) and, with
``include_trajectory_in_output``, the agent's trajectory (``trajectory``: its ``to_dict``),
in a batch of the rows' size that joins verl's (``DataProto.union``). With a tokenizer,
the tensors verl's trainer reads after a rollout, laid out as verl's own agent loops lay
them out: ``prompts`` (left-padded), ``responses`` (each
LLM turn's tokens, and between turns the tokens of the messages the agent added,
right-padded), ``response_mask`` (1 for the model's tokens only), ``input_ids``,
``attention_mask``, ``position_ids``, and ``rollout_log_probs`` when every turn's
log-probs were recorded. A turn's tokens are the ids its call returned where it returned
them, else its text tokenized. torch, numpy and verl are imported only here, when used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernelflow.events.model import ChatMessage, Event, LLMCalled
from kernelflow.projections.trajectory import Trajectory
from kernelflow.rollout import SOLVER


def prompts_of(batch: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """The prompts of a ``DataProto``, as agents take them (``content``, ``messages``,
    ``ground_truth``, ``uid``, ``request_id``)."""
    columns = batch.non_tensor_batch or {}
    raw = columns.get("raw_prompt")
    tensors = batch.batch
    if raw is None and (tokenizer is None or tensors is None or "input_ids" not in tensors):
        raise ValueError(
            "generate_sequences: the prompts' text is needed: a raw_prompt column (verl: "
            "data.return_raw_chat=True), or input_ids and a tokenizer"
        )
    prompts = []
    for i in range(len(batch)):
        prompt: dict[str, Any] = {}
        if raw is not None:
            messages = [dict(m) for m in raw[i]]
            users = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
            prompt.update(content=users[-1] if users else "", messages=messages)
        else:
            ids = tensors["input_ids"][i][tensors["attention_mask"][i].bool()]
            prompt["content"] = tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        reward_model = columns.get("reward_model")
        if reward_model is not None and isinstance(reward_model[i], Mapping):
            truth = reward_model[i].get("ground_truth")
            if truth is not None:
                prompt["ground_truth"] = str(truth)
        uid = columns.get("uid")
        if uid is not None:
            prompt["uid"] = str(uid[i])
        prompt["request_id"] = str(prompt.get("uid") or f"sample-{i}")
        prompts.append(prompt)
    return prompts


def to_data_proto(
    trajectories: Sequence[Trajectory],
    prompts: Any,
    events_of: Callable[[str], list[Event]],
    tokenizer: Any,
    include_trajectories: bool,
) -> Any:
    """The output of ``generate_sequences`` for ``trajectories`` (in the order of the rows
    of ``prompts``); ``events_of`` gives a recorded task's events."""
    import numpy as np
    from verl import DataProto

    def column(values: list[Any]) -> Any:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    # A run that raised has no trajectory of its own, and shows no turns here.
    task_ids = [str(t.metadata.get("task_id", "")) for t in trajectories]
    non_tensors = {
        "kernelflow_task_id": column(task_ids),
        "final_response": column([t.get_final_response() for t in trajectories]),
        "final_reward": column([t.final_reward for t in trajectories]),
    }
    if include_trajectories:
        non_tensors["trajectory"] = column([t.to_dict() for t in trajectories])
    meta: dict[str, Any] = {}
    if tokenizer is None:
        # No tensors, but a batch of the rows' size: what verl's ``union`` joins.
        from tensordict import TensorDict  # type: ignore[import-untyped,unused-ignore]

        rows = TensorDict({}, batch_size=[len(trajectories)])
        return DataProto(batch=rows, non_tensor_batch=non_tensors, meta_info=meta)
    turns = [_turns(events_of(task_id)) if task_id else [] for task_id in task_ids]
    tensors = _tensors(prompts, turns, tokenizer)
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def _turns(events: list[Event]) -> list[LLMCalled]:
    return [e for e in events if isinstance(e, LLMCalled) and e.agent == SOLVER]


def _tensors(prompts: Any, turns: list[list[LLMCalled]], tokenizer: Any) -> dict[str, Any]:
    import torch

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    given = prompts.batch
    if given is not None and "input_ids" in given:
        prompt_ids, prompt_mask = given["input_ids"], given["attention_mask"]
    else:
        rows = [
            _chat_ids(tokenizer, [dict(m) for m in chat])
            for chat in prompts.non_tensor_batch["raw_prompt"]
        ]
        prompt_ids, prompt_mask = _padded(rows, pad, left=True)
    responses = [_response(calls, tokenizer) for calls in turns]
    limit = prompts.meta_info.get("response_length")
    if limit is not None:
        responses = [
            (ids[:limit], mask[:limit], lp[:limit] if lp else lp) for ids, mask, lp in responses
        ]
    response_ids, real = _padded([r[0] for r in responses], pad)
    width = response_ids.shape[1]
    response_mask = torch.tensor(
        [r[1] + [0] * (width - len(r[1])) for r in responses], dtype=torch.long
    )
    attention = torch.cat([prompt_mask.long(), real], dim=1)
    out = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "response_mask": response_mask.reshape(len(responses), width),
        "input_ids": torch.cat([prompt_ids, response_ids], dim=1),
        "attention_mask": attention,
        "position_ids": torch.clip(torch.cumsum(attention, dim=1) - 1, min=0),
    }
    if responses and all(r[2] is not None for r in responses):
        out["rollout_log_probs"] = torch.tensor(
            [list(r[2] or []) + [0.0] * (width - len(r[2] or [])) for r in responses],
            dtype=torch.float32,
        ).reshape(len(responses), width)
    return out


def _response(
    calls: list[LLMCalled], tokenizer: Any
) -> tuple[list[int], list[int], list[float] | None]:
    """One row's response: per turn, the tokens of the messages added since the turn
    before (mask 0), then the reply's (mask 1); and the log-probs, if every turn has them."""
    ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] | None = []
    before: list[ChatMessage] = []
    for call in calls:
        if before:
            added = call.messages[_shared(before, call.messages) :]
            context = _chat_ids(tokenizer, [{"role": m.role, "content": m.content} for m in added])
            ids += context
            mask += [0] * len(context)
            if logprobs is not None:
                logprobs += [0.0] * len(context)
        reply = call.token_ids or tokenizer.encode(call.response_text, add_special_tokens=False)
        ids += reply
        mask += [1] * len(reply)
        if logprobs is not None and call.logprobs is not None and len(call.logprobs) == len(reply):
            logprobs += call.logprobs
        else:
            logprobs = None
        before = [*call.messages, ChatMessage(role="assistant", content=call.response_text)]
    return ids, mask, logprobs


def _shared(before: list[ChatMessage], now: list[ChatMessage]) -> int:
    """How many of the first messages ``now`` shares with ``before``."""
    n = 0
    for old, new in zip(before, now, strict=False):
        if old != new:
            break
        n += 1
    return n


def _chat_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    if not messages:
        return []
    if getattr(tokenizer, "chat_template", None):
        encoded = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return list(encoded["input_ids"])
    return list(
        tokenizer.encode("\n".join(m["content"] for m in messages), add_special_tokens=False)
    )


def _padded(rows: list[list[int]], pad: int, *, left: bool = False) -> tuple[Any, Any]:
    """Rows padded to the longest (at least one column), and which positions are real."""
    import torch

    width = max([len(r) for r in rows] + [1])
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if not row:
            continue
        span = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, span] = torch.tensor(row, dtype=torch.long)
        real[i, span] = 1
    return ids, real
