"""``kernelflow verify`` through its own parser (kernelflow.cli.commands.verify.register)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from kernelflow.cli.commands import verify
from kernelflow.host.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TASK = str(ROOT / "examples" / "tasks" / "relu.py")
GOOD = str(ROOT / "examples" / "candidates" / "solutions" / "relu.py")
CHEAT = str(ROOT / "examples" / "candidates" / "cheats" / "torch_compute.py")


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="kernelflow")
    verify.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["verify", *argv])
    return int(args.func(args, Settings()))


def test_pass_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["--task", TASK, "--candidate", GOOD, "--json", "--shapes", "batch_size=3,dim=77"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["correct"] is True and out["verdict"] == "pass" and out["reasons"] == []
    assert out["max_abs_error"] == 0.0 and out["timing"] is None
    assert out["shapes"] == [{"batch_size": 3, "dim": 77}]
    # Triton interpreted on the CPU is not timed: no speedup, no interval, no verdict on it.
    assert out["speedup"] is None and out["speedup_ci95"] is None
    assert "speedup_conclusive" in out and out["speedup_conclusive"] is None


def test_pass_text_names_the_policy_and_why_nothing_was_timed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = run(
        ["--task", TASK, "--candidate", GOOD, "--device", "cpu", "--shapes", "batch_size=3,dim=77"]
    )
    first, second = capsys.readouterr().out.splitlines()[:2]
    assert rc == 0 and first.startswith("PASS on cpu (triton) in ")
    assert " under policy strict: " in first
    assert second == "  not timed: Triton runs interpreted on the CPU"


def test_cheat_exits_1_with_reason(capsys: pytest.CaptureFixture[str]) -> None:
    rc = run(["--task", TASK, "--candidate", CHEAT, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["correct"] is False and out["verdict"] == "rejected_static"
    assert out["reasons"][0].startswith("torch_compute:")


@pytest.mark.parametrize(
    ("argv", "expect"),
    [
        (["--task", "missing.py", "--candidate", GOOD], "task file missing.py: cannot read"),
        (["--task", TASK, "--candidate", str(ROOT / "README.md")], "not valid Python"),
        (["--task", GOOD, "--candidate", GOOD], "missing `Model`"),
        (["--task", TASK, "--candidate", GOOD, "--shapes", "dim=x"], "is not an int"),
    ],
)
def test_bad_input_exits_2(
    argv: list[str], expect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert expect in err and len(err.strip().splitlines()) == 1


def test_cuda_backend_is_unsupported_here(capsys: pytest.CaptureFixture[str]) -> None:
    from kernelflow.verification.engine import detect_device

    if detect_device() == "cuda":
        pytest.skip("this machine has a GPU")
    rc = run(["--task", TASK, "--candidate", GOOD, "--device", "cuda", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["verdict"] == "unsupported" and "no CUDA GPU" in out["summary"]
