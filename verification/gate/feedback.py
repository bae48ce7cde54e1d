"""How the static gate's findings read (docs/verifier.md, "Feedback that teaches"): each is
a :class:`Violation` in three parts, what was found (the code, its line), why it cannot be
accepted, and what to write instead; the report leads with the finding that explains the
others and folds repeats.

:data:`RULE_ADVICE` is the registry of the gate's rules: every rule a finding may name has
its advice here (what to write instead, when a check has nothing more precise to say), and
a finding of a rule not in it is a bug (``Violation`` refuses to be made). A finding whose
advice is a literal substitution says ``replace `X` with `Y```, the one form a coder (or a
script: bench/feedback_quality.py) can apply as written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["RULE_ADVICE", "Violation", "arranged", "bounded", "replacement_text"]

RULE_ADVICE = {
    "no_kernel": (
        "define a kernel at module level and launch it from forward: a @triton.jit "
        "function that ends in tl.store, launched as kernel[grid](...); for CUDA, a "
        "__global__ kernel built with load_inline (or cupy.RawKernel) and called from forward"
    ),
    "reference_use": (
        "derive ModelNew from torch.nn.Module and compute the result with your own kernel; "
        "copy the reference's parameter shapes into __init__"
    ),
    "exception_fallback": (
        "remove the try/except and let errors surface; handle every input in the kernel "
        "(masks for ragged edges, a loop for any size)"
    ),
    "torch_compute": (
        "compute it in your kernel (fuse it into the kernel you launch, or launch another); "
        "forward keeps only allocation (torch.empty), views and the launches"
    ),
    "module_escape": (
        "use the public functions of the allowed modules directly (torch.empty, tl.load, math.sqrt)"
    ),
    "introspection": (
        "write what you mean directly: obj.attr for getattr, a plain function for "
        "eval/exec, torch tensors for numpy"
    ),
    "kernel_body": (
        "write the kernel body with the Triton language only: tl.* functions, its "
        "arguments, locals, module constants and other @triton.jit functions"
    ),
    "callback": (
        "keep launch callbacks to size arithmetic: `lambda meta: (triton.cdiv(n, "
        'meta["BLOCK"]),)`; define no hooks, properties or protocol methods'
    ),
    "forbidden_import": "import only torch, triton, math and typing (and the backend's library)",
    "stream_trick": "launch on the current stream, as kernel[grid](...) does",
    "file_io": (
        "compute everything from the inputs in every call; build weights in __init__ with "
        "torch.empty and nn.init"
    ),
    "monkey_patch": (
        "set attributes on self in __init__ only; call library functions as they are "
        "instead of patching them"
    ),
    "caching": (
        "compute the result from the inputs in every call: write only into tensors made in "
        "the call (torch.empty) and keep parameters, set in __init__, unchanged"
    ),
    "precision_downgrade": (
        "compute in the task's precision: float32 loads, accumulators and stores "
        '(tl.float32, torch.float32), input_precision="ieee" for tl.dot'
    ),
    "module_code": (
        "put calls inside functions (forward, __init__, helpers); module level holds only "
        "imports, definitions and constants"
    ),
}

# How findings are ordered (root cause first): a name the installed package does not have
# explains the refusals it causes (its imports, the internals it seems to reach); imports
# next; the missing kernel last (what the others often explain).
_LAST = {"no_kernel"}
_EARLY = {"forbidden_import"}


@dataclass(frozen=True)
class Violation:
    """One broken rule: ``rule`` (of RULE_ADVICE), the ``line`` (0: the module as a
    whole), ``message`` (why), ``found`` (the code on that line), ``instead`` (what to
    write instead; "": the rule's advice), ``more`` (the lines of the same finding folded
    into this one), ``missing`` (it names what the installed package does not have),
    ``place`` (where the code is when not on the module's own line: a line of a C++
    source the module builds)."""

    rule: str
    line: int
    message: str
    found: str = ""
    instead: str = ""
    more: tuple[int, ...] = ()
    missing: bool = False
    place: str = ""

    def __post_init__(self) -> None:
        if self.rule not in RULE_ADVICE:
            raise ValueError(f"rule {self.rule!r} has no advice in RULE_ADVICE")

    @property
    def advice(self) -> str:
        return self.instead or RULE_ADVICE[self.rule]

    def text(self) -> str:
        """``rule: line N: `code`: why. Instead: what to write.`` and the folded lines."""
        where = f"line {self.line}" if self.line else "the module"
        if self.place:
            where = f"{self.place} (built at line {self.line})"
        if self.found:
            where += f": `{self.found}`"
        more = ""
        if self.more:
            lines = ", ".join(map(str, self.more[:8])) + (", ..." if len(self.more) > 8 else "")
            more = f" ({len(self.more)} more like this: line{'s' * (len(self.more) > 1)} {lines})"
        why = self.message.rstrip(". ")
        return f"{self.rule}: {where}: {why}. Instead: {self.advice.rstrip('. ')}.{more}"


def arranged(found: Iterable[Violation]) -> list[Violation]:
    """``found`` folded (the same rule and reason on several lines of the module: the
    first, with the others' lines) and ordered root cause first, then by line."""
    groups: dict[tuple[str, str, str], list[Violation]] = {}
    for violation in sorted(set(found), key=lambda v: (v.line, v.rule, v.message, v.found)):
        key = (violation.rule, violation.message, violation.place)
        groups.setdefault(key, []).append(violation)
    folded = []
    for group in groups.values():
        first = group[0]
        lines = tuple(sorted({v.line for v in group[1:]} - {first.line}))
        folded.append(
            Violation(
                first.rule,
                first.line,
                first.message,
                first.found,
                first.instead,
                lines,
                any(v.missing for v in group),
                first.place,
            )
        )
    return sorted(folded, key=_rank)


def bounded(found: list[Violation], limit: int) -> list[Violation]:
    """At most ``limit`` of ``found`` (arranged), in its order: the first of each rule
    broken (every rule is named), then the others as they come."""
    firsts: dict[str, int] = {}
    for index, violation in enumerate(found):
        firsts.setdefault(violation.rule, index)
    kept = set(list(firsts.values())[:limit])
    for index in range(len(found)):
        if len(kept) >= limit:
            break
        kept.add(index)
    return [found[index] for index in sorted(kept)]


def _rank(violation: Violation) -> tuple[int, int, str, str]:
    order = (
        0
        if violation.missing
        else 1
        if violation.rule in _EARLY
        else 3
        if violation.rule in _LAST
        else 2
    )
    return (order, violation.line, violation.rule, violation.message)


def replacement_text(written: str, replacement: str) -> str:
    """The advice to write ``replacement`` where the code says ``written``."""
    return f"replace `{written}` with `{replacement}`"
