"""A gate refusal reaches everyone who reads it in the same words (docs/verifier.md,
"Feedback that teaches"): ``kernelflow verify``'s output, the report's summary, reasons
and feedback, the coder's next prompt, and the trajectory a policy trains on."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bench.feedback_cases import CASES
from kernelflow.actors.prompts import _attempt
from kernelflow.cli.commands import verify as verify_command
from kernelflow.events.model import VerificationCompleted
from kernelflow.host.settings import Settings
from kernelflow.projections.trajectory import build_trajectory
from kernelflow.verification.engine import verify

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "tasks" / "relu.py"
# tl.tanh twice (folded into one finding) and tl.cdiv in the grid lambda.
CANDIDATE = (
    next(c for c in CASES if c.name == "tl.tanh")
    .source.replace("y = tl.tanh(x)", "y = tl.tanh(x)\n    y = tl.tanh(y)")
    .replace("(triton.cdiv(n,", "(tl.cdiv(n,")
)


def test_verify_says_tl_tanh_does_not_exist_and_names_the_replacement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate = tmp_path / "candidate.py"
    candidate.write_text(CANDIDATE)
    parser = argparse.ArgumentParser(prog="kernelflow")
    verify_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["verify", "--task", str(TASK), "--candidate", str(candidate)])
    assert args.func(args, Settings()) == 1
    out = capsys.readouterr().out
    assert "REJECTED_STATIC" in out
    assert "`tl.tanh` does not exist in the installed Triton" in out
    assert "tl.extra.cuda.libdevice.tanh" in out and "(1 more like this: line " in out
    assert "replace `tl.cdiv` with `triton.cdiv`" in out


def test_one_text_reaches_the_summary_the_prompt_and_the_trajectory() -> None:
    report = verify(TASK.read_text(), CANDIDATE)
    assert report.verdict == "rejected_static"
    first = report.reasons[0]
    assert first.startswith("module_escape: line ") and " Instead: replace `tl.tanh(x)`" in first
    assert report.reasons[1].startswith("callback: ")  # the root cause leads
    assert report.summary == f"static check: {first} (and 1 more)"
    assert all(reason in report.feedback for reason in report.reasons)

    event = VerificationCompleted(
        task_id="t-53", agent="verifier", dispatch_id="d1", code=CANDIDATE, report=report
    )
    assert report.feedback in _attempt(event)  # the coder's next prompt, as written
    step = build_trajectory("t-53", [event]).steps[-1]
    assert step.content == report.feedback  # the observation a policy trains on
    assert step.tool_result is not None and step.tool_result["reasons"] == report.reasons
