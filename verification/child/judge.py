"""The judging side of a check, in a process the candidate's code never runs in: the
reference and its inputs, the trials, the comparison of the candidate's outputs with the
reference's, and the verdict.

The judge drives the candidate's process (:mod:`.remote`) through requests only: it sends
a seed and constructor arguments, then input tensors, and gets back output tensors as
data. Each trial builds the reference from a seed, and makes two calls, each on inputs of
its own (drawn from a secret seed, of two different kinds: :mod:`.inputs`). Each call's
outputs must match the reference's on the same inputs within tolerances, and outputs
that stay the same while the reference's change are refused: a check only passes a
candidate that computes.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kernelflow.verification.child.compare import (
    Tolerances,
    compare_outputs,
    same_values,
    tolerances_of,
)
from kernelflow.verification.child.inputs import draw_inputs, draw_seed, variant_of_call
from kernelflow.verification.child.loading import clone, flatten, seed_all
from kernelflow.verification.child.remote import (
    Answer,
    CandidateDied,
    CandidateRaised,
    RemoteCandidate,
)
from kernelflow.verification.child.report import (
    WROTE_OUTSIDE,
    CheckEnded,
    Reports,
    VerificationFailure,
    format_exception,
    rejected,
)

__all__ = ["Checks", "Judge", "Judged", "candidate_died", "candidate_raised"]

REFERENCE = "reference"
CONSTRUCTION = "ModelNew(...) construction"
FORWARD = "ModelNew.forward"


@dataclass(frozen=True)
class Checks:
    """What the job asks the judge to check (``job.json``'s fields)."""

    device: str
    trials: int
    seed: int | None  # None: unpredictable seeds; an int reproduces a check (debugging)
    shape_sets: list[dict[str, int]]
    auto_shapes: bool  # the verifier chose the shape sets: one the reference fails is skipped
    # Checked instead when the reference fails on every set (the policy's: sizes scaled
    # together, so relations between them that the task relies on hold).
    fallback_shapes: list[dict[str, int]]
    tolerances: Tolerances
    # The candidate is timed (or an analysis runs) after the trials, on the first set's run.
    timed: bool = False

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> Checks:
        seed = job.get("seed")
        return cls(
            device=job.get("device", "cpu"),
            trials=max(1, int(job.get("trials", 3))),
            seed=None if seed is None else int(seed),
            shape_sets=list(job.get("shapes") or [{}]),
            auto_shapes=bool(job.get("auto_shapes", False)),
            fallback_shapes=list(job.get("fallback_shapes") or []),
            tolerances=tolerances_of(job),
            timed=bool(job.get("timing") or job.get("analysis")),
        )


@dataclass
class Judged:
    """Trials that all passed, and what the last one ran (for timing)."""

    trials: int = 0
    shapes: list[dict[str, int]] = field(default_factory=list)
    max_abs: float = 0.0
    max_rel: float = 0.0
    reference_model: Any = None
    inputs: list[Any] = field(default_factory=list)
    expected: Any = None
    warnings: list[str] = field(default_factory=list)  # the policy's, from every call


@dataclass
class _Call:
    """One call's inputs and what the reference made of them."""

    inputs: list[Any]
    expected: Any
    reference_mutates: bool  # the reference itself writes to its inputs


class _ShapesUnusable(Exception):
    """The reference itself fails on a shape set the verifier chose: skip that set."""


# The task module with a shape set's sizes applied.
TaskForShapes = Callable[[dict[str, int]], Any]


class Judge:
    """Runs the trials of the candidate against the task's ``Model``; a failed check
    raises the :class:`~.report.CheckEnded` that ends the job."""

    def __init__(
        self,
        task_for: TaskForShapes,
        candidate: RemoteCandidate | None,
        checks: Checks,
        reports: Reports,
        notes: list[str],
        workdir: str,
    ) -> None:
        self.task_for = task_for
        self.task: Any = None
        self.candidate = candidate  # None: check that the reference runs, nothing more
        self.checks = checks
        self.reports = reports
        self.notes = notes  # notes for the report: shape sets skipped, inputs fallen back
        self.workdir = workdir
        self.judged = Judged()

    def run(self) -> Judged:
        """``trials`` trials (at least one per shape set), round the sets the reference
        runs on: a set the verifier chose is dropped where the reference fails (the
        fallback sets take the place of the last one), so a task's own quirk never
        becomes the candidate's failure and the trials are not fewer for it."""
        checks, judged = self.checks, self.judged
        usable = list(checks.shape_sets)
        fallback = list(checks.fallback_shapes) if checks.auto_shapes else []
        wanted = max(checks.trials, len(usable))
        trial = 0  # seeds each attempt, skipped ones too
        # Timing runs on what the last trial built: one more trial, on the first set (the
        # largest), where the rounds did not end on it.
        timing_trial = False
        while judged.trials < (wanted if timing_trial else max(checks.trials, len(usable))):
            shapes = usable[0] if timing_trial else usable[judged.trials % len(usable)]
            label = f"trial {judged.trials + 1}/{wanted}" + (
                f" (shapes {', '.join(f'{k}={v}' for k, v in shapes.items())})" if shapes else ""
            )
            may_skip = checks.auto_shapes and (len(usable) > 1 or bool(fallback))
            trial += 1
            try:
                a, r = self.trial(trial - 1, label, shapes, may_skip=may_skip)
            except _ShapesUnusable:
                usable.remove(shapes)
                if not usable and fallback:
                    self.notes.append(
                        f"shape sets {fallback} checked instead: the task's sizes scaled "
                        "together (the reference fails on every set above)"
                    )
                    usable, fallback = fallback, []
                continue
            if shapes not in judged.shapes:
                judged.shapes.append(shapes)
            judged.trials += 1
            judged.max_abs, judged.max_rel = max(judged.max_abs, a), max(judged.max_rel, r)
            done = judged.trials >= max(checks.trials, len(usable))
            if checks.timed and done and not timing_trial and shapes != usable[0]:
                timing_trial, wanted = True, judged.trials + 1
        return judged

    def trial(
        self, trial: int, label: str, shapes: dict[str, int], may_skip: bool
    ) -> tuple[float, float]:
        """One trial: the reference built, the candidate built, two calls; the largest
        absolute and relative errors."""
        shapes_so_far = [*self.judged.shapes, shapes]
        stage = REFERENCE
        try:
            self.task = self.task_for(shapes)
            init = list(self.task.get_init_inputs())
            build_seed = draw_seed(self.checks.seed, trial, 1)
            self.build_reference(init, build_seed)
            first = self.reference_call(trial, 0)
            if self.candidate is None:  # what it ran, for an analysis
                self.judged.inputs, self.judged.expected = first.inputs, first.expected
                return 0.0, 0.0
            stage = CONSTRUCTION
            # The same seed before each constructor: parameters initialised in the same
            # order come out identical, as KernelBench does.
            self.candidate.construct(init, build_seed)
            stage = FORWARD
            got = self.candidate_call(first)
            errors = self.check(first, got)
            stage = REFERENCE
            second = self.reference_call(trial, 1)
            stage = FORWARD
            again = self.candidate_call(second)
            self.check(second, again)
            self.check_it_computes(first, got, second, again)
        except VerificationFailure as failure:
            raise self.reports.refused(failure, trial, label, shapes_so_far) from None
        except CandidateRaised as raised:
            raise candidate_raised(self.reports, raised.info, stage, trial, label) from None
        except CandidateDied as died:
            raise candidate_died(self.reports, died, trial, label) from None
        except CheckEnded:
            raise
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt) or stage != REFERENCE:
                raise
            self.refuse_reference(exc, trial, label, shapes, may_skip)
        self.judged.inputs, self.judged.expected = first.inputs, first.expected
        return errors

    def build_reference(self, init: list[Any], seed: int) -> None:
        seed_all(seed)
        model = self.task.Model(*init)
        self.judged.reference_model = model.to(self.checks.device).eval()

    def reference_call(self, trial: int, call: int) -> _Call:
        """Inputs for call ``call`` of ``trial`` and the reference's outputs on them; on
        published inputs if the reference is not finite (or fails) on the varied ones."""
        variant = variant_of_call(trial, call)
        seed = draw_seed(self.checks.seed, trial, 10 + call)
        if variant != "published":
            try:
                varied = self.run_reference(draw_inputs(self.task, seed, variant, self.device))
            except Exception:
                varied = None
            if varied is not None and all_finite(varied.expected):
                return varied
            self.note_once(
                f"inputs: the reference is not finite on {variant} inputs; those calls "
                "use get_inputs()'s own distribution"
            )
        return self.run_reference(draw_inputs(self.task, seed, "published", self.device))

    def run_reference(self, inputs: list[Any]) -> _Call:
        import torch

        ran_on = clone(inputs)
        with torch.no_grad():
            expected = self.judged.reference_model(*ran_on)
        if self.device == "cuda":
            torch.cuda.synchronize()
        mutates = any(
            isinstance(a, torch.Tensor) and not same_values(a, b)
            for (_, a), (_, b) in zip(flatten(inputs, "i"), flatten(ran_on, "i"), strict=True)
        )
        return _Call(inputs, clone(expected), mutates)

    def candidate_call(self, call: _Call) -> Answer:
        assert self.candidate is not None
        answer = self.candidate.forward(
            call.inputs, self.device, value_bytes(call.expected), call.reference_mutates
        )
        seen = self.judged.warnings
        seen.extend(w for w in answer.warnings if w not in seen)
        return answer

    def check(self, call: _Call, got: Answer) -> tuple[float, float]:
        """The candidate's outputs on ``call``'s inputs against the reference's."""
        for name, facts in got.facts:
            if facts.get("class") != "torch.Tensor":
                raise rejected(
                    "output_type",
                    f"{name} must be a plain torch.Tensor, got {facts.get('class')} (tensor "
                    "subclasses and lazy tensors are not allowed)",
                )
            if facts.get("device") != self.device:
                msg = f"{name} is on device {facts.get('device')}, the reference's on {self.device}"
                raise VerificationFailure(f"{name}: device mismatch: {msg}", [msg])
        return compare_outputs(call.expected, got.outputs, self.checks.tolerances)

    def check_it_computes(self, first: _Call, got: Answer, second: _Call, again: Answer) -> None:
        """Outputs that stay the same while the reference's change: a constant, cached or
        input-independent result (which the comparison alone might miss where both are
        close)."""
        if equal_values(first.expected, second.expected):
            return
        if equal_values(got.outputs, again.outputs):
            raise rejected(
                "constant_output",
                "forward() returned the same outputs for different inputs, for which the "
                "reference's outputs differ: the result must be computed from the inputs",
            )

    def refuse_reference(
        self, exc: BaseException, trial: int, label: str, shapes: dict[str, int], may_skip: bool
    ) -> NoReturn:
        """The reference failed: skip a shape set the verifier chose, or end the job (a
        broken task is not the coder's fault)."""
        tb = format_exception(exc, self.workdir)
        last = tb[-1] if tb else type(exc).__name__
        if may_skip:
            self.notes.append(f"shape set {shapes} skipped: the reference fails there ({last})")
            raise _ShapesUnusable from None
        raise self.reports.failed(
            "task_error",
            f"the task's reference model fails ({label}): {last}",
            tb,
            "task_error: " + last,
            trial,
        ) from None

    def note_once(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)

    @property
    def device(self) -> str:
        return self.checks.device


def candidate_raised(
    reports: Reports, info: dict[str, Any], stage: str, trial: int, label: str
) -> CheckEnded:
    """The verdict on an exception the candidate's code raised in ``stage``."""
    tb = [str(line) for line in info.get("traceback") or []]
    last = str(info.get("last", "an exception"))
    verdict = "compile_error" if info.get("kind") == "compile_error" else "runtime_error"
    if info.get("process_limit"):
        verdict, reason = "rejected_runtime", "processes: process limit reached: " + last
    elif info.get("wrote_outside"):
        verdict, reason = "rejected_runtime", WROTE_OUTSIDE + last
    elif info.get("memory") or "alloc" in last.lower():
        reason = "memory: " + last
    else:
        reason = f"{'compile' if verdict == 'compile_error' else 'exception'}: {last}"
    return reports.failed(
        verdict, f"candidate raised in {stage} ({label}): {last}", tb, reason, trial
    )


def candidate_died(reports: Reports, died: CandidateDied, trial: int, label: str) -> CheckEnded:
    """The verdict on a candidate whose process ended in the middle of a call."""
    lines = [died.how]
    if died.output.strip():
        lines.append("its output (tail):\n" + died.output.strip())
    return reports.failed(
        "runtime_error", f"{died.how} ({label})", lines, f"crash: {died.how}", trial
    )


def all_finite(value: Any) -> bool:
    import torch

    return all(
        bool(torch.isfinite(t).all())
        for _, t in flatten(value, "x")
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
    )


def equal_values(a: Any, b: Any) -> bool:
    """Whether two outputs are the same, leaf by leaf (NaN equal to NaN)."""
    import torch

    la, lb = flatten(a, "x"), flatten(b, "x")
    if len(la) != len(lb):
        return False
    for (_, x), (_, y) in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or not same_values(x, y.to(x.device)):
                return False
        elif x != y:
            return False
    return True


def value_bytes(value: Any) -> int:
    import torch

    return sum(t.nbytes for _, t in flatten(value, "x") if isinstance(t, torch.Tensor))
