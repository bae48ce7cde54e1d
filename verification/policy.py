"""Strictness policies: which of the verifier's findings refuse a candidate and which are
recorded on a passing verdict as warnings.

Whether part of the work may stay in PyTorch (an ``nn.Conv2d`` kept with a fused Triton
epilogue, a ``torch.sqrt`` of a scalar) and whether lower precision (fp16/bf16, TF32
matmuls) may be used is a choice, not a fact about cheating: KernelBench's own static
checker makes both warnings by default and leaves the setting to its user. Everything
else the verifier checks is integrity (forged or cached results, ignored inputs, escapes
from the sandbox or the timer, code run where no check looks, a kernel that does no
work) and refuses under every policy. docs/verifier.md ("Policies") says which to pick.

A task names its policy (``SubmitTask.policy``); every report records the one it was
judged under and its warnings (``VerificationReport.policy`` / ``warnings``).

Imported inside the sandbox: stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_POLICY",
    "KERNELBENCH",
    "STRICT",
    "Policy",
    "UnknownPolicy",
    "policy",
    "policy_names",
]

# The rules a policy may turn into warnings: a choice of the user's, never integrity.
# ``torch_compute``: PyTorch (or the backend's library) computing part of the result, in
# the module's code (the static gate) or as ATen ops run outside kernel launches (the
# runtime guard). ``precision_downgrade``: fp16/bf16/fp8 in a task that computes in full
# precision, and TF32 matmuls.
CHOICE_RULES = frozenset({"torch_compute", "precision_downgrade"})
# Must equal kernelflow.events.model.POLICY_NAME_PATTERN (not imported: the sandbox imports
# this module and must not load msgspec; a test keeps the two equal).
NAME_PATTERN = r"^[a-z][a-z0-9_-]{0,31}$"


class UnknownPolicy(ValueError):
    pass


@dataclass(frozen=True)
class Policy:
    """A named strictness policy: ``warned`` are the rules (of CHOICE_RULES) whose findings
    are recorded as warnings instead of refusing the candidate."""

    name: str
    summary: str
    warned: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not re.match(NAME_PATTERN, self.name):
            raise ValueError(f"policy name {self.name!r} does not match {NAME_PATTERN}")
        integrity = self.warned - CHOICE_RULES
        if integrity:
            raise ValueError(
                f"policy {self.name!r}: {', '.join(sorted(integrity))} guard the verdict's "
                "integrity and refuse under every policy (only "
                f"{', '.join(sorted(CHOICE_RULES))} may be warnings)"
            )

    def refuses(self, rule: str) -> bool:
        return rule not in self.warned


STRICT = Policy(
    "strict",
    "every computation in the candidate's own kernels: PyTorch compute and precision "
    "downgrades (fp16/bf16 in an fp32 task, TF32) are refused",
)
KERNELBENCH = Policy(
    "kernelbench",
    "KernelBench's default: PyTorch compute kept in PyTorch and precision downgrades pass "
    "with warnings; every integrity check still refuses",
    CHOICE_RULES,
)
# The default: training data, where a reward must mean "the policy's kernel did the work".
# Under ``kernelbench`` a model is rewarded as much for wrapping nn.Conv2d in a one-line
# epilogue as for writing the convolution, which a policy learns to exploit.
DEFAULT_POLICY = STRICT.name

_POLICIES: dict[str, Policy] = {p.name: p for p in (STRICT, KERNELBENCH)}


def policy(name: str) -> Policy:
    """The registered policy ``name``; raises UnknownPolicy (naming the known ones)."""
    try:
        return _POLICIES[name or DEFAULT_POLICY]
    except KeyError:
        known = ", ".join(policy_names())
        raise UnknownPolicy(f"unknown verifier policy {name!r} (known: {known})") from None


def policy_names() -> list[str]:
    return sorted(_POLICIES)
