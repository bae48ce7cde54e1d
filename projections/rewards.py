"""Outcome rewards: named, versioned pure functions of how a task ended.

A reward function reads a ``RewardInput`` (the task's final status, its last verdict and
speedup, and the verdicts of every verification) and returns one float. Its name and
version identify it for good: a function whose behaviour changes gets a new version, so a
reward recorded in the log (``RewardAssigned``) always means what it meant when recorded.

Registered functions (``name@version``):

- ``binary@1``: 1.0 if the task succeeded (its last verification passed), else 0.0.
- ``speedup@2`` (the default): ``correct * clip(speedup, 0, cap)`` with ``cap = 10``; a
  correct kernel whose speedup was not measured (no GPU) or was **inconclusive** (its 95 %
  interval holds 1 or spans more than a factor of 2: the machine was busy, or no
  difference could be told; ``kernelflow.projections.speedups``) counts as parity (1.0):
  correct, no speed credit. Neither a noisy 6x nor a noisy 0.5x is the kernel's doing,
  and a reward that paid them would train on the machine's load.
- ``speedup@1``: the same, but an inconclusive speedup counts at face value (what it
  recorded before timings said whether they were conclusive).
- ``cheat_penalty@1``: ``binary - penalty`` (``penalty = 1``) when any verification of the
  task was ``rejected_static`` or ``rejected_runtime`` (an attempted reward hack), else
  ``binary``; so a rollout that tried a hack and then passed gets 0, one that only
  hacked gets -1.
- ``sol@1``: ``correct * clip(sol_fraction, 0, 1)``: how close a passing kernel came to the
  machine's speed-of-light (``Roofline.sol_fraction``; docs/verifier.md, "Speed-of-light");
  0.0 where nothing was timed or counted. Chosen, not a default: it is a figure of the
  node that timed the kernel.
- ``clean@1``: 1.0 for a pass with no warnings, ``warned`` (0.5) for a pass its task's
  strictness policy let through with warnings (PyTorch compute kept, lower precision:
  ``kernelbench``), else 0.0. The default of kernel tasks under a policy that warns.

A task that ended on a fault (``task_error``, ``unsupported``: the task's or the node's,
not the policy's doing) records no reward (``RewardInput.fault``).

For prompt tasks (``kernelflow rollout``), comparing the final answer with the reference:

- ``exact_match@1``: 1.0 when they are equal after normalisation (case, whitespace,
  surrounding ``$``/``\\boxed{}``, a trailing period), else 0.0.
- ``numeric_match@1``: 1.0 when the last number in the answer equals the reference's
  number within ``rel_tol`` (1e-6, absolute 1e-9 near zero); fractions ``a/b`` count.
- ``judge@1``: an LLM judge's verdict (AgentFlow's ``{analysis, true_false}``). The
  conductor asks the judge after the finish of a task that succeeded and records the
  call; the reward is read from that recorded answer, so it replays like the others. A
  task that failed (a rollout that never gave its final answer) scores 0 unjudged.

The conductor records the task's reward functions (``SubmitTask.rewards``; by default the
three kernel ones, or the two rule-based prompt ones) right after its ``TaskFinished``
(``pending_reward_events``): ``RewardAssigned``, the judge's ``LLMCalled`` and
``KernelReverified`` (with the rewards it changes: ``revised_reward_events``) are the
only events that may follow a terminal event. Exports use the recorded value when present
and otherwise compute it with the same function, and say which in their provenance.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import msgspec

from kernelflow.common.suggest import did_you_mean
from kernelflow.events.model import (
    FAULT_VERDICTS,
    KernelReverified,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
)
from kernelflow.projections.speedups import report_conclusive
from kernelflow.projections.task_state import TaskState

CHEAT_VERDICTS = frozenset({"rejected_static", "rejected_runtime"})


class RewardInput(msgspec.Struct, frozen=True, kw_only=True):
    """What a reward function may look at."""

    status: str  # TaskFinished.status, or "cancelled" / "rejected" / "unfinished"
    verdict: str | None = None  # the last verification's verdict
    speedup: float | None = None  # the last verification's speedup
    # Whether that speedup is conclusive (``kernelflow.projections.speedups``); None: not
    # timed, or not known (counted at face value).
    speedup_conclusive: bool | None = None
    verdicts: tuple[str, ...] = ()  # every verification's verdict, in order
    warned: bool = False  # the last verification passed with its policy's warnings
    # Prompt tasks: the final answer, the reference answer, the judge's verdict (None:
    # not judged, or its reply could not be read).
    answer: str | None = None
    reference: str | None = None
    judged_correct: bool | None = None
    # The last verification's fraction of speed-of-light (None: not timed, or not counted).
    sol_fraction: float | None = None

    @property
    def correct(self) -> bool:
        return self.status == "success" and self.verdict == "pass"

    @property
    def cheated(self) -> bool:
        return any(v in CHEAT_VERDICTS for v in self.verdicts)

    @property
    def fault(self) -> bool:
        """It ended on a check that was not the candidate's doing (the task's or the
        node's fault): no reward of it is the policy's. Such a task records no reward,
        and exports and fast_p leave it out."""
        return self.verdict in FAULT_VERDICTS

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "verdict": self.verdict,
            "speedup": self.speedup,
            "verdicts": list(self.verdicts),
        }
        if self.speedup_conclusive is not None:
            out["speedup_conclusive"] = self.speedup_conclusive
        if self.warned:
            out["warned"] = True
        if self.answer is not None or self.reference is not None:
            out |= {"answer": self.answer, "reference": self.reference}
        if self.judged_correct is not None:
            out["judged_correct"] = self.judged_correct
        if self.sol_fraction is not None:
            out["sol_fraction"] = self.sol_fraction
        return out


@dataclass(frozen=True)
class RewardFn:
    name: str
    version: int
    fn: Callable[[RewardInput, dict[str, float]], float]
    params: dict[str, float] = field(default_factory=dict)
    doc: str = ""
    # What a value of it means, in a report's words (its name says how it is computed).
    means: str = ""
    # Whether it reads the speedup: a verification for it must be timed (one for a reward
    # that does not, a reward request's, skips the timing: kernelflow.rewards).
    uses_speed: bool = False

    @property
    def key(self) -> str:
        return f"{self.name}@{self.version}"

    def __call__(self, inputs: RewardInput) -> float:
        return float(self.fn(inputs, self.params))


def _binary(r: RewardInput, p: dict[str, float]) -> float:
    return 1.0 if r.correct else 0.0


def _speedup(r: RewardInput, p: dict[str, float]) -> float:
    """``speedup@1``: an inconclusive speedup at face value."""
    if not r.correct:
        return 0.0
    s = 1.0 if r.speedup is None else r.speedup
    return min(max(s, 0.0), p["cap"])


def _sol(r: RewardInput, p: dict[str, float]) -> float:
    """``sol@1``: a correct kernel's fraction of speed-of-light, at most 1."""
    if not r.correct or r.sol_fraction is None:
        return 0.0
    return min(max(r.sol_fraction, 0.0), 1.0)


def _conclusive_speedup(r: RewardInput, p: dict[str, float]) -> float:
    """``speedup@2``: a correct kernel's speedup, capped; one that was not timed, or whose
    timing was inconclusive (``RewardInput.speedup_conclusive`` False), earns parity (1.0):
    correct, no speed credit either way."""
    if not r.correct:
        return 0.0
    s = 1.0 if r.speedup is None or r.speedup_conclusive is False else r.speedup
    return min(max(s, 0.0), p["cap"])


def _cheat_penalty(r: RewardInput, p: dict[str, float]) -> float:
    return _binary(r, p) - (p["penalty"] if r.cheated else 0.0)


def _clean(r: RewardInput, p: dict[str, float]) -> float:
    if not r.correct:
        return 0.0
    return p["warned"] if r.warned else 1.0


def normalise_answer(text: str) -> str:
    text = text.strip().rstrip(".").strip()
    boxed = re.fullmatch(r"\\boxed\{(.*)\}", text, re.DOTALL)
    if boxed:
        text = boxed.group(1)
    text = text.strip().strip("$").strip().rstrip(".").strip()
    return " ".join(text.split()).casefold()


_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?(?:\s*/\s*-?\d+)?")


def last_number(text: str) -> float | None:
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    raw = matches[-1].replace(",", "").replace(" ", "")
    try:
        if "/" in raw:
            num, den = raw.split("/")
            return float(Fraction(num) / Fraction(den)) if float(den) else None
        return float(raw)
    except (ValueError, ZeroDivisionError):
        return None


def _answered(r: RewardInput) -> bool:
    return r.status == "success" and r.answer is not None and r.reference is not None


def _exact_match(r: RewardInput, p: dict[str, float]) -> float:
    if not _answered(r):
        return 0.0
    assert r.answer is not None and r.reference is not None
    return 1.0 if normalise_answer(r.answer) == normalise_answer(r.reference) else 0.0


def _numeric_match(r: RewardInput, p: dict[str, float]) -> float:
    if not _answered(r):
        return 0.0
    assert r.answer is not None and r.reference is not None
    got, want = last_number(r.answer), last_number(r.reference)
    if got is None or want is None:
        return 0.0
    return 1.0 if abs(got - want) <= max(p["abs_tol"], p["rel_tol"] * abs(want)) else 0.0


def _judge(r: RewardInput, p: dict[str, float]) -> float:
    return 1.0 if r.status == "success" and r.judged_correct else 0.0


REWARD_FUNCTIONS: dict[str, RewardFn] = {
    f.key: f
    for f in (
        RewardFn(
            "binary",
            1,
            _binary,
            doc="1 if the task's kernel passed verification, else 0",
            means="passed: 1, else 0",
        ),
        RewardFn(
            "speedup",
            1,
            _speedup,
            {"cap": 10.0},
            doc="correct * clip(speedup, 0, cap); unmeasured speedup counts as 1",
            means="speedup of a passing kernel, at most 10 (untimed: 1)",
            uses_speed=True,
        ),
        RewardFn(
            "speedup",
            2,
            _conclusive_speedup,
            {"cap": 10.0},
            doc="correct * clip(speedup, 0, cap); unmeasured or inconclusive speedup counts as 1",
            means="speedup of a passing kernel, at most 10 (untimed or inconclusive: 1)",
            uses_speed=True,
        ),
        RewardFn(
            "sol",
            1,
            _sol,
            doc="correct * clip(sol_fraction, 0, 1); untimed or uncounted: 0",
            means="fraction of speed-of-light of a passing kernel (untimed: 0)",
            uses_speed=True,
        ),
        RewardFn(
            "cheat_penalty",
            1,
            _cheat_penalty,
            {"penalty": 1.0},
            doc="binary - penalty if any verification was rejected as a reward hack",
            means="passed: 1, else 0; 1 less after a reward-hack attempt",
        ),
        RewardFn(
            "clean",
            1,
            _clean,
            {"warned": 0.5},
            doc="1 for a pass without warnings, `warned` for one the policy let through",
            means="passed without warnings: 1, with them: 0.5, else 0",
        ),
        RewardFn(
            "exact_match",
            1,
            _exact_match,
            doc="1 if the final answer equals the reference after normalisation, else 0",
            means="answer equals the reference: 1, else 0",
        ),
        RewardFn(
            "numeric_match",
            1,
            _numeric_match,
            {"rel_tol": 1e-6, "abs_tol": 1e-9},
            doc="1 if the answer's last number equals the reference's within rel_tol",
            means="answer's number equals the reference's: 1, else 0",
        ),
        RewardFn(
            "judge",
            1,
            _judge,
            doc="1 if the LLM judge found the answer correct",
            means="the LLM judge found the answer correct: 1, else 0",
        ),
    )
}
DEFAULT_REWARD = "binary@1"
KERNEL_REWARDS = ("binary@1", "speedup@2", "cheat_penalty@1")
# Under a policy that passes candidates with warnings (kernelbench), a reward that tells
# them from clean passes is recorded too.
WARNING_POLICY_REWARDS = (*KERNEL_REWARDS, "clean@1")
PROMPT_REWARDS = ("exact_match@1", "numeric_match@1")
JUDGE_REWARD = "judge"


class UnknownReward(ValueError):
    pass


def get_reward(spec: str) -> RewardFn:
    """``name@version`` or just ``name`` (its newest version)."""
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    versions = [f for f in REWARD_FUNCTIONS.values() if f.name == spec]
    if versions:
        return max(versions, key=lambda f: f.version)
    known = sorted(REWARD_FUNCTIONS)
    guess = did_you_mean(spec, [*known, *{f.name for f in REWARD_FUNCTIONS.values()}])
    raise UnknownReward(f"unknown reward function {spec!r}{guess} (known: {', '.join(known)})")


def check_reward_names(specs: Sequence[str]) -> None:
    """Raise UnknownReward for a name that is not a registered reward function."""
    for spec in specs:
        get_reward(spec)


def rewards_for(submitted: TaskSubmitted | None) -> list[RewardFn]:
    """The reward functions a task records: the ones it asked for, else the defaults for
    its kind (kernel or prompt)."""
    if submitted is None:
        return [get_reward(k) for k in KERNEL_REWARDS]
    if submitted.rewards:
        names: Sequence[str] = submitted.rewards
    elif submitted.prompt is not None:
        names = PROMPT_REWARDS
    else:
        names = KERNEL_REWARDS if submitted.policy == "strict" else WARNING_POLICY_REWARDS
    return [get_reward(k) for k in names]


def judge_verdict(text: str) -> bool | None:
    """The ``true_false`` of a judge's JSON reply, or None when it cannot be read."""
    start = text.find("{")
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:]) if start >= 0 else (None, 0)
    except json.JSONDecodeError:
        return None
    verdict = value.get("true_false") if isinstance(value, dict) else None
    if isinstance(verdict, bool):
        return verdict
    if isinstance(verdict, str) and verdict.strip().lower() in ("true", "false"):
        return verdict.strip().lower() == "true"
    return None


def judged(finished: TaskFinished) -> bool:
    """Whether the judge is asked about a finished task: only a success has an answer
    worth judging (a rollout that failed before its final answer scores 0 unasked)."""
    return finished.status == "success"


def needs_judge(state: TaskState) -> bool:
    """A finished task whose rewards include the judge, which has not been asked yet."""
    if state.finished is None or state.judge_call is not None or not judged(state.finished):
        return False
    wants = any(f.name == JUDGE_REWARD for f in rewards_for(state.submitted))
    return wants and JUDGE_REWARD not in state.rewards


def reward_input(state: TaskState, finished: TaskFinished | None = None) -> RewardInput:
    """The reward input of a task from its fold (``finished`` when it is about to be
    appended and so is not yet in the fold)."""
    end = finished if finished is not None else state.terminal
    verdicts = tuple(v.report.verdict for v in state.verifications)
    submitted = state.submitted
    inputs = RewardInput(status="unfinished", verdicts=verdicts)
    if submitted is not None and submitted.prompt is not None:
        inputs = msgspec.structs.replace(
            inputs,
            answer=end.final_answer if isinstance(end, TaskFinished) else None,
            reference=submitted.reference_answer,
            judged_correct=(
                judge_verdict(state.judge_call.response_text) if state.judge_call else None
            ),
        )
    if isinstance(end, TaskFinished):
        kept = state.final_check  # the verification of the kernel the task ended with
        warned = bool(kept and kept.report.passed and kept.report.warnings)
        conclusive = end.speedup_conclusive
        if conclusive is None and end.speedup is not None and kept:
            conclusive = report_conclusive(kept.report)  # finished before the flag
        return msgspec.structs.replace(
            inputs,
            status=end.status,
            verdict=end.verdict,
            speedup=end.speedup,
            speedup_conclusive=conclusive if end.speedup is not None else None,
            warned=warned,
            sol_fraction=kept.report.sol_fraction if kept else None,
        )
    if end is not None:
        return msgspec.structs.replace(inputs, status=end.kind.removeprefix("task_"))
    return inputs


# Statuses of a task that ended with a TaskFinished: its outcome follows its kernel's check.
_FINISHED = frozenset({"success", "failed", "budget_exceeded", "timeout"})


def revised_outcome(
    recorded: RewardInput,
    verdict: str,
    speedup: float | None,
    warned: bool = False,
    conclusive: bool | None = None,
    sol_fraction: float | None = None,
) -> RewardInput:
    """A task's outcome once its final kernel was checked again: that check's verdict and
    speedup (``conclusive``: whether it is), and a finished task succeeds exactly when it
    passed (a kernel a fixed verifier now refuses no longer succeeds; one a fixed verifier
    bug had refused does). The check counts among its verifications (a hack found later
    is still a hack)."""
    status = recorded.status
    if status in _FINISHED:
        status = "success" if verdict == "pass" else ("failed" if status == "success" else status)
    return msgspec.structs.replace(
        recorded,
        status=status,
        verdict=verdict,
        speedup=speedup,
        speedup_conclusive=conclusive if speedup is not None else None,
        verdicts=(*recorded.verdicts, verdict),
        warned=warned,
        sol_fraction=sol_fraction,
    )


def reward_events(
    state: TaskState,
    finished: TaskFinished | None = None,
    functions: Iterable[RewardFn] | None = None,
) -> list[RewardAssigned]:
    """The ``RewardAssigned`` events of a finished task: one per reward function (default:
    the task's own, ``rewards_for``). ``finished`` defaults to the task's recorded ``TaskFinished``;
    pass it explicitly for a finish about to be appended (as the next event). Their cause is
    the ``TaskFinished`` event's id either way, so both paths record the same events."""
    end = finished if finished is not None else state.finished
    if end is None or end.verdict in FAULT_VERDICTS:
        return []  # a fault is not the policy's doing (RewardInput.fault)
    inputs = reward_input(state, end)
    # The finish's own id: its recorded one, or the one it gets appended next.
    cause = end.event_id if end.seq else f"{state.task_id}:{state.events_seen + 1}"
    functions = functions if functions is not None else rewards_for(state.submitted)
    return _assigned(state.task_id, cause, functions, inputs)


def revised_reward_events(state: TaskState, check: KernelReverified) -> list[RewardAssigned]:
    """The rewards of a task whose kernel was checked again (``check``, about to be
    appended as its next event): each of its reward functions but the judge's (it judges
    an answer, not a kernel) on the revised outcome, caused by the check."""
    if check.report.fault is not None:
        return []  # this check could not judge the kernel: its rewards stand
    report = check.report
    warned = report.passed and bool(report.warnings)
    inputs = revised_outcome(
        reward_input(state),
        report.verdict,
        report.speedup,
        warned,
        report_conclusive(report),
        report.sol_fraction,
    )
    functions = [f for f in rewards_for(state.submitted) if f.name != JUDGE_REWARD]
    cause = f"{state.task_id}:{state.events_seen + 1}"
    version = {"verifier_version": check.report.verifier_version}
    return _assigned(state.task_id, cause, functions, inputs, version)


def _assigned(
    task_id: str,
    cause: str,
    functions: Iterable[RewardFn],
    inputs: RewardInput,
    noted: dict[str, Any] | None = None,
) -> list[RewardAssigned]:
    """One ``RewardAssigned`` per function on ``inputs``, recorded with them (and
    ``noted``) so that an export gives the same numbers later."""
    return [
        RewardAssigned(
            task_id=task_id,
            cause=cause,
            reward_fn=f.name,
            version=f.version,
            value=f(inputs),
            inputs={**inputs.to_dict(), "params": dict(f.params), **(noted or {})},
        )
        for f in functions
    ]


def finish_reward_events(state: TaskState, finished: TaskFinished) -> list[RewardAssigned]:
    """The rewards appended together with ``finished``: all of the task's but the judge's
    when the judge is to be asked (it waits for the judge's answer)."""
    functions = [
        f for f in rewards_for(state.submitted) if f.name != JUDGE_REWARD or not judged(finished)
    ]
    return reward_events(state, finished, functions)


def judge_failed_event(state: TaskState, error: str) -> RewardAssigned:
    """The judge reward of a task whose judge could not be asked: 0, with the reason."""
    finished = state.finished
    assert finished is not None
    fn = get_reward(JUDGE_REWARD)
    return RewardAssigned(
        task_id=state.task_id,
        cause=finished.event_id,
        reward_fn=fn.name,
        version=fn.version,
        value=0.0,
        inputs={**reward_input(state).to_dict(), "judge_error": error},
    )


def pending_reward_events(state: TaskState) -> list[RewardAssigned]:
    """Rewards of a finished task not recorded yet: they are appended right after its
    ``TaskFinished``, so a conductor that died before all of them were recorded leaves
    the rest for the next conductor that sees the task. Empty otherwise."""
    # The judge's reward waits for the judge's recorded answer (see ``needs_judge``).
    waiting = needs_judge(state)
    return [
        r
        for r in reward_events(state)
        if r.reward_fn not in state.rewards and not (waiting and r.reward_fn == JUDGE_REWARD)
    ]
