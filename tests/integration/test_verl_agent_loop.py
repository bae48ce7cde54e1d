"""kernelflow as verl's multi-turn rollout engine: verl's own AgentLoopWorker runs batches
through the ``kernelflow_agent`` loop (loaded from verl's registry and its agent-loop
config file), against a stand-in for verl's rollout server that runs a tiny randomly
initialised Llama on the CPU, and a real nats-server holding the log.

What the stand-in replaces is verl's vLLM/SGLang server (GPU only); the tokenizer, the
Continuous Token builder, the agent-loop worker and its post-processing are verl's own.
"""

from __future__ import annotations

import asyncio
import itertools
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("verl.experimental.agent_loop")  # verl with ray, hydra-core, ...

import numpy as np
import torch
import verl
import yaml
from omegaconf import OmegaConf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.protocol import DataProto
from verl.workers.rollout.llm_server import LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from kernelflow.events.model import ChatMessage, Event, LLMCalled, RewardAssigned, TaskSubmitted
from kernelflow.integrations import verl_agent_loop
from kernelflow.projections.verl_format import dataset_row
from tests.conftest import creds
from tests.daemons import task_events

PROMPT_LENGTH, RESPONSE_LENGTH = 2048, 512
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ANSWER_TOKEN, THOUGHT_TOKEN = "Final Answer: ", "Thought: "


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level tokenizer with a chat template, and a 2-layer Llama over its few hundred
    tokens with random weights, saved where verl's model config loads them from."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    tokenizer.add_tokens([ANSWER_TOKEN, THOUGHT_TOKEN])
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=PROMPT_LENGTH + RESPONSE_LENGTH,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("policy")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class TinyPolicyServer(LLMServerClient):
    """verl's server client, answering from a model run with torch on the CPU: token
    ids in, sampled token ids and their log-probs out (what vLLM returns)."""

    def __init__(self, config: Any, model: LlamaForCausalLM) -> None:
        super().__init__(config)
        self.model = model.eval()
        self.eos = model.config.eos_token_id
        self.calls: list[tuple[list[int], list[int], list[float]]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        temperature = sampling_params["temperature"]
        # Seeded by the prompt: the same batch samples the same answers on every run.
        generator = torch.Generator().manual_seed(zlib.crc32(str(prompt_ids).encode()))
        tokens, logprobs, past, step = [], [], None, torch.tensor([prompt_ids])
        with torch.no_grad():
            for _ in range(sampling_params["max_tokens"]):
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logp = torch.log_softmax(out.logits[0, -1].float() / temperature, -1)
                token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                tokens.append(token)
                logprobs.append(float(logp[token]))
                if token == self.eos:
                    break
                step = torch.tensor([[token]])
        self.calls.append((list(prompt_ids), tokens, logprobs))
        return TokenOutput(
            token_ids=tokens, log_probs=logprobs if sampling_params["logprobs"] else None
        )


def verl_config(policy_dir: Path, agent_loops: Path | None = None) -> Any:
    config = OmegaConf.load(
        Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    )
    config.actor_rollout_ref.model.path = str(policy_dir)
    config.actor_rollout_ref.rollout.name = "vllm"  # the server this test stands in for
    config.actor_rollout_ref.rollout.calculate_log_probs = True
    config.actor_rollout_ref.rollout.agent.agent_loop_config_path = (
        str(agent_loops) if agent_loops else None
    )
    config.data.max_prompt_length = PROMPT_LENGTH
    config.data.max_response_length = RESPONSE_LENGTH
    return config


def batch(agent: str, prompts: list[str], answers: list[str], uids: list[str]) -> DataProto:
    def column(values: list[Any]) -> np.ndarray:
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": column([[{"role": "user", "content": p}] for p in prompts]),
            "reward_model": column([{"style": "rule", "ground_truth": a} for a in answers]),
            "uid": column(uids),
            "agent_name": column([agent] * len(prompts)),
        }
    )


@pytest.fixture
def kernelflow_nats(
    private_nats: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The NATS the loop's host connects to (kernelflow's usual settings, with the key of
    the daemon it hosts), stopped after."""
    monkeypatch.setenv("KF_NATS_URL", private_nats)
    monkeypatch.setenv("KF_NATS_CREDS", str(creds(private_nats, "daemon")))
    monkeypatch.setenv("KF_DATA_DIR", str(tmp_path / "data"))
    yield private_nats
    verl_agent_loop.shutdown()


def agent_loops_file(tmp_path: Path, name: str, settings: dict[str, Any]) -> Path:
    """verl's agent-loop config file, naming the class and the loop's kernelflow settings."""
    path = tmp_path / "agent_loops.yaml"
    target = "kernelflow.integrations.verl_agent_loop.KernelflowAgentLoop"
    path.write_text(yaml.safe_dump([{"name": name, "_target_": target, "kernelflow": settings}]))
    return path


def answering(policy_dir: Path, *reply: str) -> LlamaForCausalLM:
    """The tiny model made to reply ``reply`` (token by token) to any prompt: attention and
    MLP outputs zeroed, each token's logits depend on the token before only, chained from
    the generation prompt's newline through the reply to the end of turn."""
    model = LlamaForCausalLM.from_pretrained(policy_dir)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(policy_dir)
    chain = [
        *tokenizer.encode("\n"),
        *tokenizer.convert_tokens_to_ids(list(reply)),
        tokenizer.eos_token_id,
    ]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        for dim, (token, following) in enumerate(itertools.pairwise(chain)):
            model.model.embed_tokens.weight[token] = 0.0
            model.model.embed_tokens.weight[token, dim] = 1.0
            model.lm_head.weight[following] = 100.0 * model.model.embed_tokens.weight[token]
    return model


def unpadded(output: DataProto, row: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """Row ``row``'s prompt ids, response ids, response mask and log-probs, padding removed."""
    attention = output.batch["attention_mask"][row].bool()
    prompt = output.batch["prompts"][row][attention[:PROMPT_LENGTH]].tolist()
    n = int(attention[PROMPT_LENGTH:].sum())
    response = output.batch["responses"][row][:n].tolist()
    mask = output.batch["response_mask"][row][:n].tolist()
    logprobs = output.batch["rollout_log_probs"][row][:n].tolist()
    return prompt, response, mask, logprobs


def checked_row(
    output: DataProto, row: int, nats_url: str, server: TinyPolicyServer
) -> tuple[list[Event], list[LLMCalled]]:
    """Check row ``row`` against its rollout, read back from the log; its events and its
    LLM calls."""
    prompt, response, mask, logprobs = unpadded(output, row)
    events = task_events(nats_url, output.non_tensor_batch["kernelflow_task_id"][row])
    calls = [e for e in events if isinstance(e, LLMCalled)]
    assert calls and all(c.agent.startswith("solver-") for c in calls)
    # The log holds what the server saw and returned, log-probs included.
    served = {(tuple(p), tuple(r)): lp for p, r, lp in server.calls}
    for c in calls:
        assert c.prompt_token_ids is not None and c.token_ids is not None
        assert served[tuple(c.prompt_token_ids), tuple(c.token_ids)] == c.logprobs
    # One token sequence, continued turn after turn: each call's prompt is the sequence so
    # far, its response the server's ids (never re-tokenized), and the last ends it.
    sequence = prompt + response
    assert prompt == calls[0].prompt_token_ids
    for c in calls:
        assert c.prompt_token_ids is not None and c.token_ids is not None
        start = len(c.prompt_token_ids)
        assert sequence[:start] == c.prompt_token_ids
        assert sequence[start : start + len(c.token_ids)] == c.token_ids
    assert len(sequence) == len(calls[-1].prompt_token_ids or []) + len(calls[-1].token_ids or [])
    # Mask 1 exactly on the generated tokens, their log-probs aligned; 0 elsewhere.
    generated = [t for c in calls for t in c.token_ids or []]
    assert [t for t, m in zip(response, mask, strict=True) if m] == generated
    model_logprobs = [lp for c in calls for lp in c.logprobs or []]
    assert [lp for lp, m in zip(logprobs, mask, strict=True) if m] == pytest.approx(
        model_logprobs, abs=1e-6
    )
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
    # The reward is kernelflow's, recorded in the log, on verl's last response token.
    rewards = {e.reward_fn: e.value for e in events if isinstance(e, RewardAssigned)}
    assert output.batch["rm_scores"][row][len(response) - 1] == rewards["exact_match"]
    assert output.batch["rm_scores"][row].sum() == rewards["exact_match"]
    assert output.non_tensor_batch["numeric_match"][row] == rewards["numeric_match"]
    return events, calls


def test_verl_runs_a_batch_of_multi_turn_kernelflow_rollouts(
    policy_dir: Path, kernelflow_nats: str, tmp_path: Path
) -> None:
    # Loaded the way verl loads custom loops: from its agent-loop config file.
    settings = {"agent_type": "react", "max_steps": 3, "max_tokens_per_step": 24}
    config = verl_config(policy_dir, agent_loops_file(tmp_path, "kernelflow_react", settings))
    server = TinyPolicyServer(config, LlamaForCausalLM.from_pretrained(policy_dir))
    worker = AgentLoopWorker(config, server)
    uids = ["q1", "q1", "q2"]  # two rollouts of one prompt: one GRPO group
    prompts = ["What is 2+2?", "What is 2+2?", "What is 3+4?"]
    answers = ["4", "4", "7"]
    output = asyncio.run(
        worker.generate_sequences(batch("kernelflow_react", prompts, answers, uids))
    )

    assert output.batch["prompts"].shape == (3, PROMPT_LENGTH)
    for key in ("responses", "response_mask", "rollout_log_probs", "rm_scores"):
        assert output.batch[key].shape == (3, RESPONSE_LENGTH)
    assert output.batch["input_ids"].shape == (3, PROMPT_LENGTH + RESPONSE_LENGTH)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(policy_dir)
    all_calls = []
    for row in range(3):
        events, calls = checked_row(output, row, kernelflow_nats, server)
        (submitted,) = [e for e in events if isinstance(e, TaskSubmitted)]
        assert submitted.group_id == uids[row] and submitted.prompt == prompts[row]
        # The verl row is recorded, so `export grpo --mode verl` gives it back as it was.
        recorded = dataset_row(submitted)
        assert recorded is not None and recorded.prompt == [
            {"role": "user", "content": prompts[row]}
        ]
        assert recorded.reward_model == {"style": "rule", "ground_truth": answers[row]}
        # verl counts the prompt, each reply and each message the environment added.
        added = calls[-1].messages[len(calls[0].messages) :]
        observations = [m for m in added if m.role != "assistant"]
        assert output.non_tensor_batch["__num_turns__"][row] == 1 + len(calls) + len(observations)
        all_calls += calls
    assert len(all_calls) > 3  # the environment's tokens (mask 0) sit between turns
    # Random bytes are not text: decoded and encoded again, they would not be what the
    # model generated, which is what verl trains on.
    assert any(tokenizer.encode(c.response_text) != c.token_ids for c in all_calls)
    assert output.meta_info["reward_extra_keys"] == ["exact_match", "numeric_match"]


def test_the_reward_is_the_one_kernelflow_records(policy_dir: Path, kernelflow_nats: str) -> None:
    config = verl_config(policy_dir)
    server = TinyPolicyServer(config, answering(policy_dir, ANSWER_TOKEN, "4"))
    worker = AgentLoopWorker(config, server)
    # Registered under its default name when its module is imported.
    data = batch("kernelflow_agent", ["What is 2+2?", "What is 2+3?"], ["4", "5"], ["a", "b"])
    output = asyncio.run(worker.generate_sequences(data))

    tokenizer = PreTrainedTokenizerFast.from_pretrained(policy_dir)
    for row, expected in enumerate([1.0, 0.0]):
        events, calls = checked_row(output, row, kernelflow_nats, server)
        assert len(calls) == 1 and calls[0].response_text == "Final Answer: 4"
        assert output.non_tensor_batch["kernelflow_status"][row] == "success"
        (reward,) = [
            e for e in events if isinstance(e, RewardAssigned) and e.reward_fn == "exact_match"
        ]
        assert reward.value == expected
        _, response, _, _ = unpadded(output, row)
        assert tokenizer.decode(response, skip_special_tokens=True) == "Final Answer: 4"


def test_a_reply_that_only_thinks_is_followed_by_the_generation_prompt(
    policy_dir: Path, kernelflow_nats: str, tmp_path: Path
) -> None:
    # Nothing is said to a react agent after a bare thought: its next prompt is the same
    # conversation, which the chat template continues with its generation prompt.
    settings = {"agent_type": "react", "max_steps": 2}
    config = verl_config(policy_dir, agent_loops_file(tmp_path, "kernelflow_thinker", settings))
    server = TinyPolicyServer(config, answering(policy_dir, THOUGHT_TOKEN, "4"))
    worker = AgentLoopWorker(config, server)
    output = asyncio.run(
        worker.generate_sequences(batch("kernelflow_thinker", ["2+2?"], ["4"], ["a"]))
    )

    _, calls = checked_row(output, 0, kernelflow_nats, server)
    assert [c.response_text for c in calls] == ["Thought: 4", "Thought: 4"]
    first, second = calls
    assert second.messages == [*first.messages, ChatMessage(role="assistant", content="Thought: 4")]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(policy_dir)
    added = (second.prompt_token_ids or [])[
        len(first.prompt_token_ids or []) + len(first.token_ids or []) :
    ]
    assert tokenizer.decode(added) == "<|im_start|>assistant\n"
    assert output.non_tensor_batch["__num_turns__"][0] == 3  # user, assistant, assistant


def test_a_sample_kernelflow_refuses_fails_the_batch(
    policy_dir: Path, kernelflow_nats: str, tmp_path: Path
) -> None:
    settings = {"agent_type": "oracle"}  # no such agent kind: the task is rejected
    config = verl_config(policy_dir, agent_loops_file(tmp_path, "kernelflow_oracle", settings))
    server = TinyPolicyServer(config, LlamaForCausalLM.from_pretrained(policy_dir))
    worker = AgentLoopWorker(config, server)
    with pytest.raises(RuntimeError, match=r"refused: .*oracle"):
        asyncio.run(worker.generate_sequences(batch("kernelflow_oracle", ["2+2?"], ["4"], ["a"])))
    assert not server.calls


def test_the_loop_settings_are_checked() -> None:
    assert verl_agent_loop.loop_settings({"tools": ["calculator"]}).tools == ("calculator",)
    with pytest.raises(ValueError, match="unknown kernelflow setting 'temperature'"):
        verl_agent_loop.loop_settings({"temperature": 0.5})
    with pytest.raises(ValueError, match="needs an LLM judge"):
        verl_agent_loop.loop_settings({"rewards": ["exact_match", "judge"]})
    with pytest.raises(ValueError, match="unknown reward function 'speed'"):
        verl_agent_loop.loop_settings({"rewards": ["speed"]})
    with pytest.raises(ValueError, match="must be a mapping"):
        verl_agent_loop.loop_settings(OmegaConf.create(["react"]))
