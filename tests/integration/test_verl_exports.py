"""verl reads kernelflow's exports as they are, checked with verl's own code: a verl-format
dataset (system messages, a multi-turn prompt, data_source / ability / reward_model /
extra_info) goes through ``kernelflow rollout`` against an OpenAI-compatible server that
answers some samples right and some wrong (one with a calculator call first), then
``export grpo`` in its three modes; verl's ``RLHFDataset`` loads the prompts, its
``MultiTurnSFTDataset`` the conversations, and its ``compute_grpo_outcome_advantage``
over ``uid`` gives the samples' advantages."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kernelflow.prompt_datasets import DatasetError, load_dataset
from tests.conftest import as_user, keyed_nats, run_cli
from tests.fake_llm_servers import FakeOpenAI
from tests.verl_tokenizer import tiny_tokenizer

SOURCE_ROWS: list[dict[str, Any]] = [
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "You are a careful calculator. Cost: $5."},
            {"role": "user", "content": "What is 6 times 7?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "extra_info": {"split": "train", "index": 7, "answer": "6*7 = 42", "question": "6x7"},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "You answer with integers only."},
            {"role": "user", "content": "Remember: answers are integers."},
            {"role": "assistant", "content": "Understood."},
            {"role": "user", "content": "What is 2 to the power of 10?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1024"},
        "extra_info": {"split": "train", "index": 8, "answer": "2**10", "question": "2^10"},
    },
    {
        "data_source": "lighteval/MATH",
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 19 plus 23?"},
        ],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": "42"},
        "extra_info": {"split": "test", "index": 9, "answer": "19+23", "question": "19+23"},
    },
]
# What the policy does with each question, sample after sample: answer right or wrong at
# once, or call the calculator first (then answer right). The fifth "6 times 7" is the
# group of one.
QUESTIONS = {
    "6 times 7": ("42", "41", "6 * 7", ["tool", "wrong", "right", "wrong", "right"]),
    "power of 10": ("1024", "1000", "2 ** 10", ["right"] * 4),
    "19 plus 23": ("42", "24", "19 + 23", ["wrong", "wrong", "tool", "right"]),
}


class Policy:
    """The server's answers: by question, in the order the samples ask."""

    def __init__(self) -> None:
        self.asked: Counter[str] = Counter()
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> str:
        text = "\n".join(m["content"] or "" for m in body["messages"] if m["role"] == "user")
        key = next(k for k in QUESTIONS if k in text)
        right, wrong, expression, plans = QUESTIONS[key]
        if body["messages"][-1]["content"].startswith("Observation (calculator)"):
            return f"Thought: The calculator agrees.\nFinal Answer: {right}"
        with self.lock:
            plan = plans[self.asked[key] % len(plans)]
            self.asked[key] += 1
        if plan == "tool":
            return f"Thought: Let me compute it.\nAction: calculator(expression='{expression}')"
        return f"Thought: I know this.\nFinal Answer: {right if plan == 'right' else wrong}"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Rollouts of the dataset (4 samples a prompt, then 1 more of the first prompt alone,
    a group of one) from the fake policy server, and the exports of their log."""
    tmp = tmp_path_factory.mktemp("verl-exports")
    dataset = tmp / "train.parquet"
    pq.write_table(pa.Table.from_pylist(SOURCE_ROWS), dataset)
    out: dict[str, Any] = {"dir": tmp, "dataset": dataset}
    with keyed_nats(tmp / "nats") as nats_url, FakeOpenAI(Policy()) as server:
        common = ["--tools", "calculator", "--llm", f"openai:{server.url}/v1#policy-7b"]
        for extra in (["--n", "4"], ["--n", "1", "--limit", "1"]):
            run = run_cli(
                "rollout", "--dataset", str(dataset), *common, *extra,
                *as_user("daemon", nats_url), "--json",
            )  # fmt: skip
            assert run.returncode == 0, run.stdout + run.stderr[-3000:]
        out["requests"] = [c["messages"] for c in server.completions]
        exports = {
            "prompts": ["--mode", "verl"],
            "prompts_coder": ["--mode", "verl", "--agents", "coder"],
            "samples": [],
            "samples_turn": ["--normalize", "turn", "--singleton", "raw"],
            "sft": ["--mode", "sft"],
        }
        for name, args in exports.items():
            path = tmp / f"{name}.parquet"
            run = run_cli("export", "grpo", "--out", str(path), *args, *as_user("reader", nats_url))
            assert run.returncode == 0, run.stderr
            out[name] = path
    return out


def test_the_policy_saw_the_datasets_system_message(exported: dict[str, Any]) -> None:
    firsts = [m for m in exported["requests"] if len(m) == 2]
    assert firsts, "no first turns"
    for messages in exported["requests"]:
        system = messages[0]
        assert system["role"] == "system"
        assert any(system["content"].startswith(r["prompt"][0]["content"]) for r in SOURCE_ROWS)


def test_prompts_load_in_rlhf_dataset_one_row_per_prompt_as_the_source_had_it(
    exported: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    config = OmegaConf.create(
        {
            "prompt_key": "prompt",
            "max_prompt_length": 4096,
            "filter_overlong_prompts": True,
            "filter_overlong_prompts_workers": 1,
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    for name in ("prompts", "prompts_coder"):  # --agents does not empty prompt tasks' rows
        ds = RLHFDataset(str(exported[name]), tokenizer, config)
        assert len(ds) == len(SOURCE_ROWS)
        rows = [ds[i] for i in range(len(ds))]
        for source in SOURCE_ROWS:
            (row,) = [r for r in rows if r["raw_prompt"] == source["prompt"]]
            assert row["raw_prompt"][0]["role"] == "system"  # the system message is kept
            assert row["data_source"] == source["data_source"]
            assert row["ability"] == source["ability"]
            assert row["reward_model"] == source["reward_model"]
            extra = row["extra_info"]
            assert {k: extra[k] for k in source["extra_info"]} == source["extra_info"]
            assert row["index"] == source["extra_info"]["index"]
            assert extra["kernelflow"]["kind"] == "prompt"
            assert extra["kernelflow"]["reward_fn"] == "exact_match@1"


def test_samples_carry_what_a_trainer_needs_and_match_verls_grpo(
    exported: dict[str, Any],
) -> None:
    pytest.importorskip("verl")
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rows = pq.read_table(exported["samples_turn"]).to_pylist()
    # The rollouts' own recorded reward (exact_match), not a kernel reward that scores 0.
    assert {(r["reward_fn"], r["reward_source"]) for r in rows} == {("exact_match@1", "recorded")}
    assert {r["reward"] for r in rows} == {0.0, 1.0}
    assert {r["data_source"] for r in rows} == {"openai/gsm8k", "lighteval/MATH"}
    assert {r["reward_model"]["ground_truth"] for r in rows} == {"42", "1024"}
    # The server returned token ids: each turn has them, and a mask over its response.
    for r in rows:
        assert r["token_ids_recorded"] and r["response_token_ids"] and r["prompt_token_ids"]
        assert r["response_mask"] == [1] * len(r["response_token_ids"])
    # verl's estimator over the rows grouped by uid: the same advantages.
    width = max(len(r["response_mask"]) for r in rows)
    scores = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width)
    for i, r in enumerate(rows):
        n = len(r["response_mask"])
        mask[i, :n] = 1.0
        scores[i, n - 1] = r["reward"]
    uids = np.array([r["uid"] for r in rows], dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(scores, mask, uids)
    ours = [r["advantage"] for r in rows]
    assert advantages[:, 0].tolist() == pytest.approx(ours, abs=1e-5)
    assert sum(1 for a in ours if abs(a) > 0.1) >= 6
    (alone,) = [r for r in rows if Counter(x["uid"] for x in rows)[r["uid"]] == 1]
    assert alone["reward"] == 1.0 and alone["advantage"] == pytest.approx(1.0)  # verl's

    # Normalised over rollouts (the default): verl's estimator with one row per rollout,
    # and a group of one gets advantage 0 (kernelflow's default; ``--singleton raw`` for
    # verl's).
    rows = pq.read_table(exported["samples"]).to_pylist()
    per_rollout = {r["rollout_id"]: r for r in rows}
    firsts = list(per_rollout.values())
    scores = torch.tensor([[r["reward"]] for r in firsts])
    uids = np.array([r["uid"] for r in firsts], dtype=object)
    advantages, _ = compute_grpo_outcome_advantage(scores, torch.ones_like(scores), uids)
    sizes = Counter(r["uid"] for r in firsts)
    for r, verl_advantage in zip(firsts, advantages[:, 0].tolist(), strict=True):
        expected = 0.0 if sizes[r["uid"]] == 1 else verl_advantage
        assert r["advantage"] == pytest.approx(expected, abs=1e-5)
    meta = json.loads(Path(f"{exported['samples']}.meta.json").read_text())
    assert meta["token_ids"]["rows_without"] == 0 and meta["reward_fns"] == {"exact_match@1": 13}


def test_sft_conversations_load_in_multiturn_sft_dataset(
    exported: dict[str, Any], tmp_path: Path
) -> None:
    pytest.importorskip("verl")
    from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset

    rows = pq.read_table(exported["sft"]).to_pylist()
    samples = pq.read_table(exported["samples"]).to_pylist()
    correct = {r["rollout_id"] for r in samples if r["reward"] > 0}
    assert {r["rollout_id"] for r in rows} == correct  # the successful ones, each once
    for r in rows:
        roles = [m["role"] for m in r["messages"]]
        assert roles[0] == "system" and roles[-1] == "assistant" and r["correct"]
        assert "Final Answer" in r["messages"][-1]["content"]
    tool_users = [r for r in rows if r["llm_calls"] == 2]
    assert tool_users and "Observation (calculator)" in tool_users[0]["messages"][-2]["content"]

    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    ds = MultiTurnSFTDataset(str(exported["sft"]), tokenizer, {"max_length": 2048})
    assert len(ds) == len(rows)
    item = ds[0]
    assert item["input_ids"].shape == item["loss_mask"].shape
    assert 0 < int(item["loss_mask"].sum()) < int(item["attention_mask"].sum())


def test_a_verl_row_is_read_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in SOURCE_ROWS) + "\n")
    first, multi, _ = load_dataset(path)
    assert first.system == "You are a careful calculator. Cost: $5."
    assert first.prompt == "What is 6 times 7?" and first.reference == "42"
    assert first.row is not None and first.row.extra_info == SOURCE_ROWS[0]["extra_info"]
    assert multi.row is not None and multi.row.prompt == SOURCE_ROWS[1]["prompt"]
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"prompt": "2+2?", "answer": 4}) + "\n")
    (item,) = load_dataset(plain)
    assert item.row is None and item.system is None and item.reference == "4"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"prompt": [{"role": "user", "content": [{"type": "image"}]}]}, "with text 'role'"),
        ({"prompt": [{"role": "system", "content": "only me"}]}, "no message but the system"),
        ({"prompt": "hi", "extra_info": "x"}, "'extra_info' must be an object"),
        ({"prompt": "hi", "data_source": 3}, "'data_source' must be text"),
    ],
)
def test_unusable_verl_rows_are_refused_with_one_line(
    row: dict[str, Any], problem: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(DatasetError, match=re.escape(problem)):
        load_dataset(path)
