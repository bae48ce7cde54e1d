"""Feedback that teaches (docs/verifier.md): every refusal of the static gate says what was
found, why it cannot be accepted and what to write instead; names are judged against the
installed Triton; the root cause leads and repeats fold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.feedback_cases import CASES, TRITON, Case
from bench.feedback_quality import repair
from kernelflow.events.model import VerificationReport
from kernelflow.verification.backends import triton_names
from kernelflow.verification.gate import MAX_VIOLATIONS, gate_findings, installed
from kernelflow.verification.gate.feedback import RULE_ADVICE, Violation
from kernelflow.verification.results import cut_at_line, feedback_text

ROOT = Path(__file__).resolve().parents[2]
TASK = (ROOT / "examples" / "tasks" / "relu.py").read_text()
# rule: line N: `code`: why. Instead: what to write.  (or "the module" for no line)
THREE_PARTS = re.compile(
    r"^(?P<rule>\w+): ((\w+ )?line \d+( \(built at line \d+\))?: `[^`]+`|the module): "
    r".+?\. Instead: .+\."
)


def first_finding(case: Case) -> Violation:
    refused, _ = gate_findings(case.source, backend=case.backend, task_source=TASK)
    assert refused, f"{case.name}: the gate accepts it"
    return refused[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_mistake_is_refused_by_its_rule_with_a_three_part_message(case: Case) -> None:
    found = first_finding(case)
    assert found.rule == case.rule, found.text()
    assert THREE_PARTS.match(found.text()), found.text()
    for words in case.says:
        assert words in found.text(), found.text()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_doing_what_the_message_says_repairs_the_candidate(case: Case) -> None:
    """The replacement a message names (``replace `X` with `Y```), applied as written,
    makes the candidate pass where the case says it does; the others name none."""
    found = first_finding(case)
    fixed = repair(case.source, [found.text()])
    assert (fixed != case.source) == case.repairable, found.text()
    if case.repairable:
        assert gate_findings(fixed, backend=case.backend, task_source=TASK)[0] == []


@pytest.mark.parametrize("rule", sorted(RULE_ADVICE))
def test_every_rule_of_the_registry_has_a_case_and_advice(rule: str) -> None:
    assert RULE_ADVICE[rule].strip()
    assert any(case.rule == rule for case in CASES), f"no case in the feedback set for {rule}"


def test_every_rule_the_gate_names_is_in_the_registry() -> None:
    """A rule id written anywhere in the gate's checks must have advice: Violation refuses
    one without, and every quoted rule id of the gate's modules is registered."""
    with pytest.raises(ValueError, match="no advice"):
        Violation("new_rule", 1, "why")
    sources = [
        *(ROOT / "verification" / "gate").glob("*.py"),
        *(ROOT / "verification" / "backends").glob("*.py"),
    ]
    added = re.compile(r"""(?:add|Refusal|Finding|Violation)\(\s*"(\w+)",""")
    named = {rule for path in sources for rule in added.findall(path.read_text())}
    assert named and named <= set(RULE_ADVICE), named - set(RULE_ADVICE)


def test_a_missing_name_is_judged_by_the_installed_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(c for c in CASES if c.name == "tl.tanh")
    version = triton_names.triton_version()
    assert (
        f"`tl.tanh` does not exist in the installed Triton {version}" in first_finding(case).text()
    )
    # Were the installed Triton to have tl.tanh, the gate would not say it is missing.
    import triton.language as tl

    monkeypatch.setattr(tl, "tanh", tl.sigmoid, raising=False)
    installed.exists.cache_clear()
    try:
        assert "does not exist" not in first_finding(case).text()
    finally:
        monkeypatch.undo()
        installed.exists.cache_clear()


def test_the_missing_name_leads_and_repeats_fold() -> None:
    source = TRITON.replace(
        "y = tl.maximum(x, 0.0)",
        "y = tl.tanh(x)\n    y = tl.tanh(y)\n    y = tl.tanh(y)",
    ).replace("import torch.nn as nn\n", "import torch.nn as nn\nimport numpy\n")
    refused, _ = gate_findings(source, task_source=TASK)
    assert refused[0].rule == "module_escape" and refused[0].missing
    assert "(2 more like this: lines 15, 16)" in refused[0].text()
    assert refused[1].rule == "forbidden_import"
    assert sum("tl.tanh" in v.text() for v in refused) == 1


def test_the_coder_reads_every_rule_broken_whole() -> None:
    reasons = [first_finding(c).text() for c in CASES[:12]]
    report = VerificationReport(
        verdict="rejected_static",
        summary=f"static check: {reasons[0]} (and {len(reasons) - 1} more)",
        reasons=reasons,
        errors=reasons[:10],
    )
    text = feedback_text(report, 2000)
    assert len(text) <= 2000
    shown = [r for r in reasons if r in text]
    assert shown[0] == reasons[0] and len(shown) >= 2
    assert text.count(reasons[0]) == 1  # the summary quoting it is not said twice
    assert f"({len(reasons) - len(shown)} more rules broken)" in text


def test_a_torch_name_the_installed_torch_lacks_is_said_to_be_missing() -> None:
    source = TRITON.replace("return out\n", "return torch.nn.functional.gelu_tanh(out)\n")
    refused, _ = gate_findings(source, task_source=TASK)
    assert refused[0].rule == "torch_compute" and refused[0].missing
    assert "`torch.nn.functional.gelu_tanh` does not exist in the installed torch" in (
        refused[0].text()
    )


def test_looking_a_name_up_imports_nothing_the_candidate_names() -> None:
    import sys

    assert "torch.utils.bottleneck" not in sys.modules
    assert installed.exists("torch.utils.bottleneck.main") is False
    assert "torch.utils.bottleneck" not in sys.modules
    assert installed.exists("torch.nn.functional.relu") is True
    assert installed.exists("nonexistent_package_53.x") is None


def test_a_shorter_bound_drops_whole_rules_never_half_of_one() -> None:
    reasons = [first_finding(c).text() for c in CASES[:6]]
    feedback = "Rules broken:\n" + "\n".join(f"- {r}" for r in reasons)
    cut = cut_at_line(feedback, 900)
    assert len(cut) <= 900 and cut != feedback
    kept = cut.splitlines()
    assert kept[-1].startswith("[... ") and kept[-1].endswith(" more lines]")
    assert all(line in feedback.splitlines() for line in kept[:-1])


def test_a_long_report_still_names_every_rule_broken() -> None:
    names = "relu sigmoid exp log sin cos tan abs neg sqrt rsqrt erf floor ceil round trunc"
    names += " sign square exp2 log2 log10 expm1 log1p"
    computing = "".join(f"        out = torch.{name}(out)\n" for name in names.split())
    fallback = "        try:\n            out = out + 0\n"
    fallback += "        except Exception:\n            pass\n"
    source = TRITON.replace("        return out\n", computing + fallback + "        return out\n")
    refused, _ = gate_findings(source, task_source=TASK)
    assert len(refused) == MAX_VIOLATIONS
    assert {v.rule for v in refused} == {"torch_compute", "exception_fallback"}
    lines = [v.line for v in refused if v.rule == "torch_compute"]
    assert lines == sorted(lines)
