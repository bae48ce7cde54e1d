"""The judging side of a check: the reference and its inputs, the trials, the comparison
of the candidate's outputs with the reference's, and the verdict.

The judge drives the candidate (:mod:`.candidate`) through a narrow interface only: it
hands it constructor arguments and input tensors (copies: the reference's own inputs stay
the judge's) and takes back outputs. Each trial builds the reference with a fresh seed,
runs it, poisons the memory its outputs leave behind, then has the candidate built with
the same seed and called twice on copies of the same inputs: inputs must come back
unchanged, outputs must own their memory, match the reference within tolerances, and the
second call must agree with the first.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NoReturn

from kernelflow.actors.verifier.child.candidate import Candidate
from kernelflow.actors.verifier.child.compare import (
    Tolerances,
    compare_outputs,
    same_values,
    tolerances_of,
)
from kernelflow.actors.verifier.child.guards import overlaps, storages
from kernelflow.actors.verifier.child.loading import clone, flatten, seed_all, to_device
from kernelflow.actors.verifier.child.report import (
    WROTE_OUTSIDE,
    Reports,
    VerificationFailure,
    classify_exception,
    exception_chain,
    format_exception,
    rejected,
    wrote_outside,
)

__all__ = ["Checks", "Judge", "Judged"]

REFERENCE = "reference"
CONSTRUCTION = "ModelNew(...) construction"
FORWARD = "ModelNew.forward"


@dataclass(frozen=True)
class Checks:
    """What the job asks the judge to check (``job.json``'s fields)."""

    device: str
    trials: int
    seed: int
    shape_sets: list[dict[str, int]]
    auto_shapes: bool  # the verifier chose the shape sets: one the reference fails is skipped
    tolerances: Tolerances

    @classmethod
    def from_job(cls, job: dict[str, Any]) -> Checks:
        return cls(
            device=job.get("device", "cpu"),
            trials=max(1, int(job.get("trials", 3))),
            seed=int(job.get("seed", 0)),
            shape_sets=list(job.get("shapes") or [{}]),
            auto_shapes=bool(job.get("auto_shapes", False)),
            tolerances=tolerances_of(job),
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


class _ShapesUnusable(Exception):
    """The reference itself fails on a shape set the verifier chose: skip that set."""


class Judge:
    """Runs the trials of ``candidate`` against the task module's ``model_class``; a
    failed check raises the :class:`~.report.Verdict` that ends the job."""

    def __init__(
        self,
        task: Any,
        model_class: Any,
        candidate: Candidate,
        checks: Checks,
        reports: Reports,
        notes: list[str],
        workdir: str,
    ) -> None:
        self.task = task
        self.model_class = model_class
        self.candidate = candidate
        self.checks = checks
        self.reports = reports
        self.notes = notes  # notes for the report: shape sets skipped
        self.workdir = workdir
        self.judged = Judged()

    def run(self) -> Judged:
        checks, judged = self.checks, self.judged
        defaults = {
            name: getattr(self.task, name)
            for s in checks.shape_sets
            for name in s
            if hasattr(self.task, name)
        }
        n_runs = max(checks.trials, len(checks.shape_sets))
        skipped: set[int] = set()
        for trial in range(n_runs):
            set_index = trial % len(checks.shape_sets)
            if set_index in skipped:
                continue
            shapes = checks.shape_sets[set_index]
            for name, value in [*defaults.items(), *shapes.items()]:
                setattr(self.task, name, value)
            label = f"trial {trial + 1}/{n_runs}" + (
                f" (shapes {', '.join(f'{k}={v}' for k, v in shapes.items())})" if shapes else ""
            )
            try:
                a, r = self.trial(
                    trial, label, shapes, may_skip=checks.auto_shapes and set_index > 0
                )
            except _ShapesUnusable:
                skipped.add(set_index)
                continue
            if shapes not in judged.shapes:
                judged.shapes.append(shapes)
            judged.trials += 1
            judged.max_abs, judged.max_rel = max(judged.max_abs, a), max(judged.max_rel, r)
        return judged

    def trial(
        self, trial: int, label: str, shapes: dict[str, int], may_skip: bool
    ) -> tuple[float, float]:
        """One trial; its largest absolute and relative errors."""
        shapes_so_far = [*self.judged.shapes, shapes]
        stage = REFERENCE
        try:
            trial_seed = self.checks.seed * 1_000_003 + trial
            ref_in, cand_in = self.run_reference(trial_seed)
            self.candidate.note_threads()
            stage = CONSTRUCTION
            # Same seed before each constructor: parameters initialised in the same order
            # come out identical, as KernelBench does.
            seed_all(trial_seed)
            self.candidate.construct(self.task.get_init_inputs())
            stage = FORWARD
            got = self.candidate.forward(cand_in)
        except VerificationFailure as failure:
            raise self.reports.refused(failure, trial, label, shapes_so_far) from None
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            if stage == REFERENCE:
                self.refuse_reference(exc, trial, label, shapes, may_skip)
            raise self.candidate_raised(exc, stage, trial, label) from None
        try:
            return self.check_outputs(ref_in, cand_in, got)
        except VerificationFailure as failure:
            raise self.reports.refused(failure, trial, label, shapes_so_far) from None
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            tb = format_exception(exc, self.workdir)
            last = tb[-1] if tb else type(exc).__name__
            outside = wrote_outside(exc)
            raise self.reports.failed(
                "rejected_runtime" if outside else classify_exception(exc),
                f"candidate raised in its second forward() call ({label}): {last}",
                tb,
                (WROTE_OUTSIDE if outside else "exception: ") + last,
                trial,
            ) from None

    def run_reference(self, trial_seed: int) -> tuple[Any, Any]:
        """Build this trial's reference and inputs, and run it; the inputs it ran on, and
        a copy for the candidate made before it ran."""
        import torch

        judged, device = self.judged, self.checks.device
        seed_all(trial_seed)
        judged.reference_model = self.model_class(*self.task.get_init_inputs())
        judged.reference_model = judged.reference_model.to(device).eval()
        seed_all(trial_seed + 7919)  # a different stream for the inputs
        judged.inputs = list(to_device(self.task.get_inputs(), device))
        ref_in, cand_in = clone(judged.inputs), clone(judged.inputs)
        with torch.no_grad():
            ref_out = judged.reference_model(*ref_in)
        if device == "cuda":
            torch.cuda.synchronize()
        judged.expected = clone(ref_out)
        poison(ref_out, ref_in)
        return ref_in, cand_in

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
            "runtime_error",
            f"the reference model failed ({label}): {last}",
            tb,
            "task_error: " + last,
            trial,
        ) from None

    def candidate_raised(
        self, exc: BaseException, stage: str, trial: int, label: str
    ) -> BaseException:
        tb = format_exception(exc, self.workdir)
        last = tb[-1] if tb else type(exc).__name__
        verdict = classify_exception(exc)
        if any(isinstance(e, BlockingIOError) for e in exception_chain(exc)):
            verdict, reason = "rejected_runtime", "processes: process limit reached: " + last
        elif wrote_outside(exc):
            verdict, reason = "rejected_runtime", WROTE_OUTSIDE + last
        elif isinstance(exc, MemoryError) or "alloc" in last.lower():
            reason = "memory: " + last
        else:
            reason = f"{'compile' if verdict == 'compile_error' else 'exception'}: {last}"
        return self.reports.failed(
            verdict, f"candidate raised in {stage} ({label}): {last}", tb, reason, trial
        )

    def check_outputs(self, ref_in: Any, cand_in: Any, got: Any) -> tuple[float, float]:
        """Judge the first call's outputs, then a second call's; the errors of the first."""
        import torch

        # Kernels must not write to their inputs. Compared with the reference's inputs
        # after its run, so a task whose reference is itself in-place stays checkable.
        for i, (before, after) in enumerate(
            zip(flatten(ref_in, "input"), flatten(cand_in, "input"), strict=True)
        ):
            if isinstance(before[1], torch.Tensor) and not same_values(before[1], after[1]):
                raise rejected(
                    "input_mutation",
                    f"input mutation: the candidate modified input #{i} in place (the "
                    "reference does not); kernels must not write to their inputs",
                )
        self.candidate.check_own_memory(got, cand_in)
        errors = compare_outputs(self.judged.expected, got, self.checks.tolerances)
        # A second call on fresh copies of the same inputs must agree with the first and
        # return new memory: no state or cached results carried between calls.
        again_in = clone(self.judged.inputs)
        got2 = self.candidate.forward(again_in)
        self.candidate.check_own_memory(got2, again_in)
        if overlaps(storages(got2), storages(got)):
            raise rejected(
                "second_run",
                "the second forward() call returned the memory of the first call's "
                "output (a cached or reused result); allocate a new output per call",
            )
        try:
            compare_outputs(got, got2, self.checks.tolerances)
        except VerificationFailure as drift:
            raise rejected(
                "second_run",
                "a second forward() call on the same inputs disagrees with the first: "
                + drift.summary,
            ) from None
        return errors


def poison(value: Any, keep: Any) -> None:
    """Overwrite the reference's outputs (memory the allocator may hand to the candidate
    next) and a few fresh blocks of the same sizes with NaN / all-ones bits, so a candidate
    that returns uninitialised memory cannot pick up the reference's result."""
    import torch

    keep_spans = storages(keep)
    for _, t in flatten(value, "x"):
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        with torch.no_grad():
            if not overlaps(storages(t), keep_spans):
                fill_poison(t)
            for _ in range(2):
                junk = torch.empty_like(t)
                fill_poison(junk)
                del junk


def fill_poison(t: Any) -> None:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype.is_signed:
        t.fill_(-1)
    else:
        t.fill_(1)
