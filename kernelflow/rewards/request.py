"""A reward request and its answer (pure): what a trainer asks the verifier pool, the task
that carries it in the log, and the reward read back from that task's events.

A request is a task like any other (docs/verl.md, "Rewards from the verifier pool"): the
``verifier_only`` workflow with the response's code as its candidate, the reward function
to record, and the verification's limits (untimed where the reward function does not
read the speedup: ``binary``, ``cheat_penalty``, ``clean``). Its id is its content's (the
task source, the code, the backend, the policy, the reward function, the limits and the
verifier's version): the same request made twice, by one trainer or by two, is one task,
verified once and answered from the log after that. Who asked is in the task's metadata.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from kernelflow.actors.kinds.formats import final_answer
from kernelflow.events.model import Event, SubmitTask, VerifyLimits
from kernelflow.projections.rewards import KERNEL_REWARDS, RewardFn, get_reward
from kernelflow.projections.task_state import fold
from kernelflow.task import kernel_task
from kernelflow.verification.backends import DEFAULT_BACKEND
from kernelflow.verification.engine import VERIFIER_VERSION
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.workflows.model import CODE_FIELD, AgentSpec, OutputField
from kernelflow.workflows.parsing import ParseError, parse_output

__all__ = [
    "REQUEST_KIND",
    "RewardAnswer",
    "RewardRequest",
    "RewardUnjudged",
    "answer_of",
    "code_in",
    "kernel_reward",
]

# The metadata a reward request's task carries: its kind, and who asked.
REQUEST_KIND = "reward_request"
_ID_PREFIX = "rw-"


# A response is read as a run reads a coder's answer: its declared output, one code field.
_CODER = AgentSpec(
    name="coder",
    possible_next=(),
    output_fields=(OutputField(CODE_FIELD, "str", True, "the module defining ModelNew"),),
)
_KERNEL_REWARD_NAMES = frozenset(get_reward(k).name for k in KERNEL_REWARDS)


def code_in(response: str) -> str | None:
    """The code a model's response holds, read as a run reads a coder's answer (a ``Final
    Answer:`` marker, then a JSON ``code`` field, ``<code>`` tags or the last fenced
    block); None: it holds none."""
    try:
        return str(parse_output(_CODER, final_answer(response) or response)[CODE_FIELD])
    except ParseError:
        return None


def kernel_reward(name: str | None) -> RewardFn:
    """The kernel reward function ``name`` (None: the default); ValueError naming the ones
    there are for a name that scores no kernel, UnknownReward for one that is not."""
    fn = get_reward(name or KERNEL_REWARDS[0])
    if fn.name not in _KERNEL_REWARD_NAMES:
        raise ValueError(
            f"reward {fn.key} does not score kernels (use one of {', '.join(KERNEL_REWARDS)})"
        )
    return fn


class RewardUnjudged(RuntimeError):
    """The pool could not judge the response: the task's or the node's fault (a reference
    that fails, a backend the verifier cannot run), or the request was refused."""


@dataclass(frozen=True)
class RewardRequest:
    """One response to score: ``code`` (the module defining ModelNew) against
    ``task_source`` (the reference, KernelBench format)."""

    task_source: str
    code: str
    backend: str = DEFAULT_BACKEND
    policy: str = DEFAULT_POLICY
    reward_fn: str = KERNEL_REWARDS[0]
    trials: int | None = None  # None: the verifier's own
    timeout_s: float | None = None
    task_name: str = "reward"

    def task_id(self) -> str:
        """The request's content, hashed: the id of the task that judges it."""
        content = [
            "kernelflow reward request 1",
            VERIFIER_VERSION,
            self.task_source,
            self.code,
            self.backend,
            self.policy,
            get_reward(self.reward_fn).key,
            self.trials,
            self.timeout_s,
        ]
        digest = hashlib.sha256(json.dumps(content).encode()).hexdigest()
        return _ID_PREFIX + digest[:40]

    def command(self, *, requester: str, deadline_s: float | None) -> SubmitTask:
        """The task that carries the request (its workflow resolved and checked)."""
        submit = kernel_task(
            name=self.task_name,
            source=self.task_source,
            workflow="verifier_only",
            backend=self.backend,
            policy=self.policy,
            candidate=self.code,
            task_id=self.task_id(),
            deadline_s=deadline_s,
        )
        fn = get_reward(self.reward_fn)
        limits = VerifyLimits(
            trials=self.trials,
            timeout_s=self.timeout_s,
            timing=None if fn.uses_speed else False,  # a speedup no reward reads: untimed
        )
        return msgspec.structs.replace(
            submit,
            rewards=[fn.key],
            verify_limits=limits,
            metadata={"kind": REQUEST_KIND, "requested_by": requester[:200]},
        )


@dataclass(frozen=True)
class RewardAnswer:
    """The reward of one request, as recorded in its task's events."""

    task_id: str
    score: float
    correct: bool
    verdict: str
    reward_fn: str  # name@version
    from_log: bool  # judged before this request asked: read back, nothing run
    speedup: float | None = None
    speedup_conclusive: bool | None = None
    summary: str = ""

    def as_verl(self) -> dict[str, object]:
        """What verl's reward managers take: ``score`` is the reward, the rest is kept as
        extra information (``acc`` for its validation metrics)."""
        return {
            "score": self.score,
            "acc": 1.0 if self.correct else 0.0,
            "verdict": self.verdict,
            "reward_fn": self.reward_fn,
            "task_id": self.task_id,
            "from_log": self.from_log,
        }


def answer_of(request: RewardRequest, events: Sequence[Event], *, from_log: bool) -> RewardAnswer:
    """The reward the finished task of ``request`` recorded (its events, through their
    rewards). Raises RewardUnjudged where no reward was recorded: the task was refused, or
    its verification was the task's or the node's fault, which no reward records."""
    task_id = request.task_id()
    state = fold(task_id, list(events))
    if state.terminal is None:
        raise ValueError(f"task {task_id} is not over")
    fn = get_reward(request.reward_fn)
    recorded = state.rewards.get(fn.name)
    kept = state.final_check
    report = kept.report if kept else None
    ended = getattr(state.terminal, "reason", "") or state.terminal.kind
    if recorded is None or recorded.version != fn.version:
        why = f"{report.verdict}: {report.summary}" if report is not None else ended
        raise RewardUnjudged(f"task {task_id}: no {fn.key} reward recorded ({why})")
    return RewardAnswer(
        task_id=task_id,
        score=recorded.value,
        correct=report is not None and report.passed,
        verdict=report.verdict if report is not None else state.terminal.kind,
        reward_fn=fn.key,
        from_log=from_log,
        speedup=report.speedup if report is not None else None,
        speedup_conclusive=report.speedup_conclusive if report is not None else None,
        summary=report.summary if report is not None else ended,
    )
