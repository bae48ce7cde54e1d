"""``kernelflow.integrations.verl.compute_score``: a correct Triton kernel passes the
sandboxed verifier (Triton interpreted on the CPU), a cheat is refused, prompt answers are
scored by the recorded reward functions, and verl's own reward code calls it: its loader
(``custom_reward_function``) and both of its naive reward managers, the batch one and
the reward loop's, which scores samples from several threads at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelflow.integrations.verl import compute_score
from tests.conftest import EXAMPLES
from tests.verl_tokenizer import tiny_tokenizer

TASK = (EXAMPLES / "tasks" / "relu.py").read_text()
GOOD = (EXAMPLES / "candidates" / "solutions" / "relu.py").read_text()
CHEAT = (EXAMPLES / "candidates" / "cheats" / "torch_compute.py").read_text()
KERNEL_INFO = {
    "kernelflow": {
        "kind": "kernel",
        "backend": "triton",
        "reward_fn": "binary@1",
        "rewards": ["binary@1", "speedup@1", "cheat_penalty@1"],
    }
}
PROMPT_INFO = {
    "split": "train",
    "kernelflow": {
        "kind": "prompt",
        "reward_fn": "judge@1",
        "rewards": ["judge@1", "numeric_match@1"],
    },
}


def fenced(code: str) -> str:
    return f"Here is the kernel.\n```python\n{code}```\n"


def test_a_correct_kernel_passes_and_a_cheat_is_refused() -> None:
    passed = compute_score("kernelflow/triton", fenced(GOOD), TASK, KERNEL_INFO, trials=1)
    assert passed == {"score": 1.0, "acc": 1.0, "verdict": "pass", "reward_fn": "binary@1"}
    cheat = compute_score("kernelflow/triton", fenced(CHEAT), TASK, KERNEL_INFO)
    assert cheat["verdict"] == "rejected_static" and cheat["score"] == 0.0
    penalised = compute_score(
        "kernelflow/triton", fenced(CHEAT), TASK, KERNEL_INFO, reward="cheat_penalty"
    )
    assert penalised["score"] == -1.0 and penalised["reward_fn"] == "cheat_penalty@1"
    nothing = compute_score("kernelflow/triton", "I cannot write this kernel.", TASK, None)
    assert nothing == {"score": 0.0, "acc": 0.0, "verdict": "no_code", "reward_fn": "binary@1"}


def test_answers_are_scored_by_the_recorded_reward_functions() -> None:
    # The row's own reward is the judge's (it needs an LLM): its next one scores it.
    right = compute_score("openai/gsm8k", "Thought: easy.\nFinal Answer: 42.0", "42", PROMPT_INFO)
    assert right == {"score": 1.0, "acc": 1.0, "verdict": "correct", "reward_fn": "numeric_match@1"}
    wrong = compute_score("openai/gsm8k", "Final Answer: 41", "42", PROMPT_INFO)
    assert wrong["score"] == 0.0 and wrong["verdict"] == "wrong"
    exact = compute_score("kernelflow/prompt", "Final Answer: 42.0", "42", None)
    assert exact["reward_fn"] == "exact_match@1" and exact["score"] == 0.0
    with pytest.raises(ValueError, match="cannot score an answer"):
        compute_score("kernelflow/prompt", "42", "42", None, reward="binary")


def test_other_data_sources_go_to_verls_own_scoring() -> None:
    pytest.importorskip("verl")
    assert compute_score("openai/gsm8k", "so #### 42", "42", {}) == 1.0
    with pytest.raises(NotImplementedError):
        compute_score("somebody/else", "42", "42", {})


# --------------------------------------------------------------------------- through verl

ITEMS: list[tuple[str, str, Any, dict[str, Any], float]] = [
    ("kernelflow/triton", fenced(GOOD), TASK, KERNEL_INFO, 1.0),
    ("kernelflow/triton", fenced(CHEAT), TASK, KERNEL_INFO, 0.0),
    ("openai/gsm8k", "Final Answer: 42", "42", PROMPT_INFO, 1.0),
    ("openai/gsm8k", "Final Answer: 7", "42", PROMPT_INFO, 0.0),
]


@pytest.fixture
def verl_config() -> Any:
    pytest.importorskip("verl")
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://kernelflow.integrations.verl",
                    "name": "compute_score",
                    "reward_kwargs": {"trials": 1},
                },
                "reward_manager": {"source": "register", "name": "naive"},
            }
        }
    )


@pytest.fixture
def event_loop_for_verl() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()


def batch(tokenizer: Any, items: list[tuple[str, str, Any, dict[str, Any], float]]) -> Any:
    """verl's rollout batch: left-padded prompts, right-padded responses, their mask."""
    import torch
    from verl import DataProto

    prompts = [tokenizer("Write it.", add_special_tokens=False)["input_ids"] for _ in items]
    answers = [tokenizer(text, add_special_tokens=False)["input_ids"] for _, text, *_ in items]
    width_p, width_r = max(map(len, prompts)), max(map(len, answers))
    pad = tokenizer.pad_token_id
    prompt_ids = torch.tensor([[pad] * (width_p - len(p)) + p for p in prompts])
    response_ids = torch.tensor([a + [pad] * (width_r - len(a)) for a in answers])
    mask = torch.tensor(
        [
            [0] * (width_p - len(p)) + [1] * len(p) + [1] * len(a) + [0] * (width_r - len(a))
            for p, a in zip(prompts, answers, strict=True)
        ]
    )
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "attention_mask": mask},
        non_tensors={
            "data_source": np.array([i[0] for i in items], dtype=object),
            "reward_model": np.array([{"ground_truth": i[2]} for i in items], dtype=object),
            "extra_info": np.array([dict(i[3]) for i in items], dtype=object),
        },
    )


def test_verls_reward_loop_calls_it_from_many_threads(
    verl_config: Any, tmp_path: Path, event_loop_for_verl: asyncio.AbstractEventLoop
) -> None:
    from verl.trainer.ppo.reward import load_reward_manager

    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    manager = load_reward_manager(verl_config, tokenizer)
    data = batch(tokenizer, ITEMS)

    async def score_all() -> list[dict[str, Any]]:
        # As verl's reward loop workers do: every sample at once, each in an executor thread.
        return list(
            await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(ITEMS))))
        )

    results = event_loop_for_verl.run_until_complete(score_all())
    assert [r["reward_score"] for r in results] == [i[4] for i in ITEMS]
    verdicts = [r["reward_extra_info"]["verdict"] for r in results]
    assert verdicts == ["pass", "rejected_static", "correct", "wrong"]


def test_verls_batch_reward_manager_calls_it(verl_config: Any, tmp_path: Path) -> None:
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager.naive import NaiveRewardManager

    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    manager = NaiveRewardManager(tokenizer, 0, compute_score=get_custom_reward_fn(verl_config))
    data = batch(tokenizer, ITEMS[1:])  # the cheat and the answers: no sandbox run needed
    out = manager(data, return_dict=True)
    rewards = out["reward_tensor"].sum(dim=-1).tolist()
    assert rewards == [i[4] for i in ITEMS[1:]]
    assert out["reward_extra_info"]["verdict"] == ["rejected_static", "correct", "wrong"]
