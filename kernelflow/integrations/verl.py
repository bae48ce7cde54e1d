"""A reward function verl calls: ``compute_score`` scores one response to one row of a
dataset kernelflow exported (``export grpo --mode verl``), as a kernelflow run would.

verl's config::

    reward:
      custom_reward_function:
        path: pkg://kernelflow.integrations.verl
        name: compute_score
        reward_kwargs: {trials: 3, timeout_s: 300}   # optional: see compute_score

- A **kernel** row (``extra_info.kernelflow.kind == "kernel"``, or a ``data_source`` of
  ``kernelflow/<backend>``): the code is taken from the response the way a coder's answer
  is read in a run (a ``Final Answer:`` marker, then a JSON ``code`` field, ``<code>``
  tags or the last fenced block) and checked by the sandboxed verifier against the row's
  ground truth, the task's reference source, exactly as ``kernelflow verify`` checks it:
  the static reward-hack gate, then a sandbox of its own (a fresh interpreter in a private
  temp dir per call; on a machine without a GPU, Triton runs in its CPU interpreter). The
  verdict scores it with the row's reward function (``binary@1`` unless the export chose
  another kernel reward): a cheat is refused (``rejected_static`` / ``rejected_runtime``)
  and scores 0 (``cheat_penalty@1``: -1).
- A **prompt** row (``kind == "prompt"``, or ``data_source == "kernelflow/prompt"``): the
  answer (after the last ``Final Answer:``, else the whole response) is compared with the
  ground truth by the row's reward function (``exact_match@1``, ``numeric_match@1``...).
  The ``judge`` needs an LLM: such a row is scored by its first other recorded reward.
- Any other ``data_source``: verl's own ``default_compute_score``.

It returns ``{"score", "acc", "verdict", "reward_fn"}``: verl takes ``score`` as the
reward and keeps the rest as extra information (``acc`` = 1.0 when correct, for its
validation metrics). Nothing is shared between calls but read-only tables, and each
verification works in a temp dir of its own, so verl's reward workers may call it from
many threads and processes at once.

**From the verifier pool.** ``compute_score_async`` (same arguments, same result; verl's
reward loop awaits it) sends a kernel row's verification to the daemons' verifiers over
NATS instead (:mod:`kernelflow.rewards`): the pool that owns the GPUs judges it, warm, in
the log like every verification, and a response judged before is answered from the log.
``compute_score`` does the same where ``KF_REWARD_POOL=1`` (or ``pool: true`` in
``reward_kwargs``). The connection is the environment's (``KF_NATS_URL``, or the embedded
server of ``KF_DATA_DIR``), shared by the process's calls, at most
``KF_REWARD_MAX_IN_FLIGHT`` (64) in flight; ``device`` is then the pool's, not a choice.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from dataclasses import dataclass
from typing import Any, NamedTuple

from kernelflow.actors.kinds.formats import final_answer
from kernelflow.host.settings import Settings
from kernelflow.projections.rewards import (
    JUDGE_REWARD,
    KERNEL_REWARDS,
    PROMPT_REWARDS,
    RewardFn,
    RewardInput,
    get_reward,
)
from kernelflow.projections.speedups import report_conclusive
from kernelflow.projections.verl_format import KERNEL_SOURCE_PREFIX, PROMPT_SOURCE
from kernelflow.rewards import RewardRequest, shared_client
from kernelflow.rewards.request import code_in, kernel_reward
from kernelflow.verification.backends import backend_names
from kernelflow.verification.engine import VerifierConfig, verify
from kernelflow.verification.policy import DEFAULT_POLICY

__all__ = ["compute_score", "compute_score_async"]

_KERNEL_REWARD_NAMES = frozenset(get_reward(k).name for k in KERNEL_REWARDS)


@dataclass(frozen=True)
class _Row:
    """What kernelflow recorded about a row (``extra_info["kernelflow"]``)."""

    kind: str  # "kernel" or "prompt"
    backend: str
    reward_fn: str
    rewards: tuple[str, ...]


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    reward: str | None = None,
    trials: int = 3,
    timeout_s: float = 300.0,
    device: str | None = None,
    policy: str = DEFAULT_POLICY,
    pool: bool | None = None,
    **verl_context: Any,
) -> dict[str, Any] | float:
    """The reward of ``solution_str`` for the row (``data_source``, ``ground_truth``,
    ``extra_info``). ``reward`` overrides the row's reward function; ``trials``,
    ``timeout_s``, ``device`` ("cpu" / "cuda"; default: what is here) and ``policy`` are
    the verifier's. ``pool``: ask the verifier pool (default: ``KF_REWARD_POOL``).
    ``verl_context`` (keywords verl adds, such as a reward model's router address) is
    passed on to verl's own function for rows that are not kernelflow's."""
    row = _row_of(data_source, extra_info)
    if row is None:
        default = importlib.import_module("verl.utils.reward_score").default_compute_score
        result: dict[str, Any] | float = default(
            data_source, solution_str, ground_truth, extra_info, **verl_context
        )
        return result
    kernel = _kernel_to_verify(row, solution_str, ground_truth, reward)
    if not isinstance(kernel, _ToVerify):
        return kernel
    fn, code = kernel
    if pool if pool is not None else Settings().reward_pool:
        request = _request(row, code, str(ground_truth), fn, trials, timeout_s, policy)
        return shared_client().score_sync(request).as_verl()
    return _score_locally(row, code, str(ground_truth), fn, trials, timeout_s, device, policy)


async def compute_score_async(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    *,
    reward: str | None = None,
    trials: int = 3,
    timeout_s: float = 300.0,
    policy: str = DEFAULT_POLICY,
    **verl_context: Any,
) -> dict[str, Any] | float:
    """:func:`compute_score`, the verification sent to the verifier pool and awaited (a
    kernel row; the others are scored here, verl's own rows in a thread). Raises
    ``kernelflow.rewards.RewardUnjudged`` where the pool cannot judge the response: no
    daemon or no verifier for the backend (``NoVerifierPool``), no reward within
    ``KF_REWARD_DEADLINE`` (``RewardTimeout``), a reference that fails."""
    row = _row_of(data_source, extra_info)
    if row is None:
        return await asyncio.to_thread(
            compute_score, data_source, solution_str, ground_truth, extra_info, **verl_context
        )
    kernel = _kernel_to_verify(row, solution_str, ground_truth, reward)
    if not isinstance(kernel, _ToVerify):
        return kernel
    request = _request(row, kernel.code, str(ground_truth), kernel.fn, trials, timeout_s, policy)
    return (await shared_client().score(request)).as_verl()


def _row_of(data_source: str, extra_info: dict[str, Any] | None) -> _Row | None:
    info = (extra_info or {}).get("kernelflow")
    if isinstance(info, dict) and info.get("kind") in ("kernel", "prompt"):
        rewards = tuple(str(r) for r in info.get("rewards") or ())
        return _Row(
            kind=str(info["kind"]),
            backend=str(info.get("backend") or "triton"),
            reward_fn=str(info.get("reward_fn") or (rewards[0] if rewards else "")),
            rewards=rewards,
        )
    if data_source == PROMPT_SOURCE:
        return _Row("prompt", "", PROMPT_REWARDS[0], PROMPT_REWARDS)
    backend = data_source.removeprefix(KERNEL_SOURCE_PREFIX)
    if data_source.startswith(KERNEL_SOURCE_PREFIX) and backend in backend_names():
        return _Row("kernel", backend, KERNEL_REWARDS[0], KERNEL_REWARDS)
    return None


class _ToVerify(NamedTuple):
    """A kernel response the verifier must judge: the reward to apply, and its code."""

    fn: RewardFn
    code: str


def _kernel_to_verify(
    row: _Row, response: str, ground_truth: Any, reward: str | None
) -> _ToVerify | dict[str, Any] | float:
    """What ``compute_score`` and ``compute_score_async`` share: the score of a response
    no verifier needs to see (an answer row's, or a kernel row's that holds no code), or
    the kernel to verify."""
    if row.kind != "kernel":
        return _score_answer(row, response, ground_truth, reward)
    fn, code = kernel_reward(reward or row.reward_fn), code_in(response)
    if code is None:
        return _result(fn, RewardInput(status="failed"), correct=False, verdict="no_code")
    return _ToVerify(fn, code)


def _request(
    row: _Row,
    code: str,
    task_source: str,
    fn: RewardFn,
    trials: int,
    timeout_s: float,
    policy: str,
) -> RewardRequest:
    return RewardRequest(
        task_source=task_source,
        code=code,
        backend=row.backend,
        policy=policy,
        reward_fn=fn.key,
        trials=trials,
        timeout_s=timeout_s,
    )


def _score_locally(
    row: _Row,
    code: str,
    task_source: str,
    fn: RewardFn,
    trials: int,
    timeout_s: float,
    device: str | None,
    policy: str,
) -> dict[str, Any]:
    """Verified in a fresh sandbox process of this process's own."""
    config = VerifierConfig(
        trials=trials, timeout_s=timeout_s, device=device, warm=False, timing=fn.uses_speed
    )
    report = verify(task_source, code, backend=row.backend, policy=policy, config=config)
    inputs = RewardInput(
        status="success" if report.passed else "failed",
        verdict=report.verdict,
        speedup=report.speedup,
        speedup_conclusive=report_conclusive(report),
        verdicts=(report.verdict,),
    )
    return _result(fn, inputs, correct=report.passed, verdict=report.verdict)


def _score_answer(
    row: _Row, response: str, ground_truth: Any, reward: str | None
) -> dict[str, Any]:
    fn = _answer_reward(row, reward)
    reference = ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth)
    answer = final_answer(response) or response.strip()
    inputs = RewardInput(status="success", answer=answer, reference=reference)
    score = fn(inputs)
    return _result(fn, inputs, correct=score > 0, verdict="correct" if score > 0 else "wrong")


def _answer_reward(row: _Row, reward: str | None) -> RewardFn:
    """The reward to apply: the one asked for, else the row's own unless it is the judge's
    (it needs an LLM), then the row's first other recorded one."""
    if reward is not None:
        fn = get_reward(reward)
    else:
        names = [row.reward_fn, *row.rewards, *PROMPT_REWARDS]
        fn = next(get_reward(n) for n in names if n and get_reward(n).name != JUDGE_REWARD)
    if fn.name == JUDGE_REWARD or fn.name in _KERNEL_REWARD_NAMES:
        raise ValueError(
            f"reward {fn.key} cannot score an answer here (use one of {PROMPT_REWARDS})"
        )
    return fn


def _result(fn: RewardFn, inputs: RewardInput, *, correct: bool, verdict: str) -> dict[str, Any]:
    return {
        "score": fn(inputs),
        "acc": 1.0 if correct else 0.0,
        "verdict": verdict,
        "reward_fn": fn.key,
    }
