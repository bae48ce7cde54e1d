"""``AgenticRollout.generate_sequences`` on verl's own ``DataProto`` (docs/agents.md,
"AgenticRollout"): a batch built as verl's dataset builds one, and what comes back read by
verl's own code (its reward manager, its GRPO advantage and its batch metrics)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl")

import numpy as np
import torch
from verl import DataProto
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from verl.trainer.ppo.metric_utils import compute_data_metrics
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.reward_manager.naive import NaiveRewardManager

from kernelflow.agentic_rollout import AgenticRollout, AgenticRolloutConfig, CalculatorTool
from kernelflow.events.model import LLMCalled
from tests.verl_tokenizer import tiny_tokenizer

QUESTIONS = [("What is 6 times 7?", "42"), ("What is 19 plus 23?", "42")]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def column(values: list[Any]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array


def verl_batch(n: int) -> tuple[DataProto, DataProto]:
    """A batch as verl 0.9's dataset and trainer make one (``RLHFDataset`` rows through its
    ``collate_fn``, a uid per prompt), and what its trainer hands the rollout: the rows'
    non-tensors (``_get_gen_batch``), each repeated ``n`` times (``rollout.n``)."""
    rows = [
        {
            "raw_prompt": [{"role": "user", "content": question}],
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "data_source": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"index": i},
            "index": i,
        }
        for i, (question, answer) in enumerate(QUESTIONS)
    ]
    batch = DataProto.from_single_dict(collate_fn(rows))
    batch.non_tensor_batch["uid"] = np.array([f"u{i}" for i in range(len(rows))], dtype=object)
    reward_keys = {"data_source", "reward_model", "extra_info", "uid"}
    gen = batch.pop(
        batch_keys=[], non_tensor_batch_keys=list(set(batch.non_tensor_batch) - reward_keys)
    )
    gen.non_tensor_batch.update(batch.non_tensor_batch)
    return batch.repeat(repeat_times=n, interleave=True), gen.repeat(
        repeat_times=n, interleave=True
    )


def policy(tokenizer: Any) -> Any:
    """A policy that returns token ids and log-probs: the first sample of each group uses
    the calculator and answers 42, the second guesses 41."""
    seen: dict[str, int] = {}

    async def generate(messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:
        question = messages[-1]["content"] if len(messages) == 2 else messages[1]["content"]
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn == 0:
            seen[question] = seen.get(question, 0) + 1
        guess = seen[question] % 2 == 0
        if turn == 0 and not guess:
            text = "Thought: compute it.\nAction: calculator(expression='6 * 7')"
        else:
            text = f"Thought: done.\nFinal Answer: {41 if guess else 42}"
        ids = tokenizer.encode(text, add_special_tokens=False)
        return {"text": text, "token_ids": ids, "logprobs": [-0.5] * len(ids)}

    return generate


def test_generate_sequences_gives_verl_a_batch_its_trainer_reads(
    tokenizer: Any, tmp_path: Path
) -> None:
    config = AgenticRolloutConfig(
        agent_type="react",
        max_steps=4,
        concurrent_requests=1,  # samples in order: the policy alternates within a group
        save_trajectories=True,
        trajectory_save_path=str(tmp_path),
    )
    rollout = AgenticRollout(config, llm_generate_func=policy(tokenizer), tokenizer=tokenizer)
    rollout.agent.set_tools({"calculator": CalculatorTool()})
    batch, gen = verl_batch(n=2)
    out = asyncio.run(rollout.generate_sequences(gen))

    assert len(out) == 4
    out.check_consistency()  # verl's own check of a batch's shapes
    # As verl's workers split a batch and gather their parts.
    parts = out.chunk(2)
    rejoined = DataProto.concat(parts)
    assert torch.equal(rejoined.batch["responses"], out.batch["responses"])
    assert list(rejoined.non_tensor_batch["final_response"]) == ["42", "41", "42", "41"]
    assert list(out.non_tensor_batch["final_response"]) == ["42", "41", "42", "41"]
    trajectories = out.non_tensor_batch["trajectory"]
    assert trajectories[0]["steps"][0]["content"] == "What is 6 times 7?"
    responses, mask = out.batch["responses"], out.batch["response_mask"]
    prompt = out.batch["prompts"][0][out.batch["attention_mask"][0, : -responses.shape[1]].bool()]
    assert tokenizer.decode(prompt) == "<user>What is 6 times 7?<end><assistant>"  # chat template
    assert out.batch["input_ids"].shape[1] == out.batch["prompts"].shape[1] + responses.shape[1]
    # The model's tokens are masked in, the observation between its two turns out.
    first = responses[0][mask[0].bool()].tolist()
    assert tokenizer.decode(first).endswith("Final Answer: 42")
    assert 0 < mask[0].sum() < out.batch["attention_mask"][0, -responses.shape[1] :].sum()
    assert "Observation (calculator): 42" in tokenizer.decode(responses[0][~mask[0].bool()])
    assert torch.all(out.batch["rollout_log_probs"][mask.bool()] == -0.5)

    # verl's trainer: the batch with the rollout's output, scored by its reward manager...
    merged = batch.union(out)
    assert merged.meta_info["timing"]["agentic_rollout"] > 0
    rewards = NaiveRewardManager(
        tokenizer,
        num_examine=0,
        compute_score=lambda data_source, solution_str, ground_truth, extra_info=None: float(
            solution_str.endswith(f"Final Answer: {ground_truth}")
        ),
    )(merged)
    assert rewards.sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    # ...its GRPO advantage over each uid's group, and its batch metrics.
    advantages, returns = compute_grpo_outcome_advantage(
        rewards, merged.batch["response_mask"], merged.non_tensor_batch["uid"]
    )
    assert advantages[0][mask[0].bool()].min() > 0 > advantages[1][mask[1].bool()].max()
    merged.batch["token_level_scores"] = rewards
    merged.batch["token_level_rewards"] = rewards
    merged.batch["advantages"], merged.batch["returns"] = advantages, returns
    metrics = compute_data_metrics(merged, use_critic=False)
    assert metrics["critic/score/mean"] == 0.5

    # Saved: the trajectories, and the log their runs were recorded in.
    [saved] = sorted(tmp_path.glob("trajectories-*.jsonl"))
    assert len(saved.read_text().splitlines()) == 4
    [log] = sorted(tmp_path.glob("events-*.jsonl"))
    assert json.loads(log.read_text().splitlines()[0])["format"] == "kernelflow-log"
    assert sum('"kind":"llm_called"' in line for line in log.read_text().splitlines()) == 6


def test_prompts_given_as_ids_are_read_with_the_tokenizer(tokenizer: Any) -> None:
    """Without a tokenizer the batch carries no tensors (a batch of the rows' size that
    joins verl's); prompts given only as ids (older verl rollouts) are read with it, and
    refused without it."""
    rollout = AgenticRollout(AgenticRolloutConfig(max_steps=4), llm_generate_func=policy(tokenizer))
    rollout.agent.set_tools({"calculator": CalculatorTool()})
    _, gen = verl_batch(n=1)
    out = asyncio.run(rollout.generate_sequences(gen))
    assert list(out.batch.keys()) == [] and out.batch.batch_size == torch.Size([2])
    assert list(out.non_tensor_batch["final_response"]) == ["42", "42"]
    task = out.non_tensor_batch["kernelflow_task_id"][0]
    calls = [e for e in rollout.run_log.events(task) if isinstance(e, LLMCalled)]
    assert calls[0].token_ids == tokenizer.encode(calls[0].response_text, add_special_tokens=False)

    ids = tokenizer.encode("What is 6 times 7?", add_special_tokens=False)
    as_ids = DataProto.from_dict(
        tensors={
            "input_ids": torch.tensor([[0, *ids]]),
            "attention_mask": torch.tensor([[0] + [1] * len(ids)]),
        }
    )
    with pytest.raises(ValueError, match=r"raw_prompt column .* or input_ids and a tokenizer"):
        asyncio.run(rollout.generate_sequences(as_ids))
    rollout.tokenizer = tokenizer
    out = asyncio.run(rollout.generate_sequences(as_ids))
    assert out.non_tensor_batch["trajectory"][0]["steps"][0]["content"] == "What is 6 times 7?"
    assert torch.equal(out.batch["prompts"], as_ids.batch["input_ids"])
