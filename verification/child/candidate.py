"""The candidate in its own process (:mod:`.runner`): its module loaded, its ``ModelNew``
built and called under the runtime guards. It sees only what the judge sends it
(constructor arguments, a seed, input tensors) and gives back only outputs; it knows
nothing of the reference, the comparison or the verdict (:mod:`.judge`).

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelflow.verification.child.guards import (
    check_output_storage,
    guarded_forward,
    os_threads,
)
from kernelflow.verification.child.loading import load_module

__all__ = ["Candidate"]


class Candidate:
    """One candidate module on ``device``, whose every forward() call must launch a
    kernel of ``launch_label`` (see :func:`~.guards.guarded_forward`)."""

    def __init__(
        self,
        module: Any,
        device: str,
        launch_label: str,
        baseline_threads: int,
        warned_rules: frozenset[str] = frozenset(),
    ) -> None:
        self.model_class: Any = getattr(module, "ModelNew", None)  # None: the job refuses it
        self.device = device
        self.launch_label = launch_label
        self.model: Any = None
        # Threads running before the candidate's code did: more after a call into it means
        # work escaping the check.
        self.baseline_threads = baseline_threads
        # The guards' rules the task's policy records instead of refusing.
        self.warned_rules = warned_rules

    @classmethod
    def load(
        cls,
        path: Path,
        name: str,
        device: str,
        launch_label: str,
        warned_rules: frozenset[str] = frozenset(),
    ) -> Candidate:
        """Import the candidate's module from ``path`` (its module-level code runs); the
        threads running before it are the baseline."""
        baseline = os_threads()
        return cls(load_module(path, name), device, launch_label, baseline, warned_rules)

    def construct(self, init_inputs: Any) -> None:
        """``ModelNew(*init_inputs)`` on the device, in eval mode (the caller seeded the
        RNG exactly as for the reference's ``Model``, so parameters come out equal)."""
        model = self.model_class(*init_inputs)
        if hasattr(model, "to"):
            model = model.to(self.device)
        if hasattr(model, "eval"):
            model = model.eval()
        self.model = model

    def forward(self, inputs: Any) -> tuple[Any, list[str]]:
        """One guarded forward() call on ``inputs``; its outputs, and what the guards
        found that the policy records instead of refusing."""
        return guarded_forward(
            self.model,
            inputs,
            self.device,
            self.baseline_threads,
            self.launch_label,
            self.warned_rules,
        )

    def check_own_memory(self, outputs: Any, inputs: Any) -> None:
        """``outputs`` (of a call on ``inputs``) must own their memory."""
        check_output_storage(outputs, inputs, self.model)
