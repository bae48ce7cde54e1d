"""Every task solution, cheat, legitimate variant and hostile candidate under
examples/candidates/, through the real sandbox and real (interpreted) Triton."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from kernelflow.verification.engine import VerifierConfig, verify
from kernelflow.verification.gate import check_candidate

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
CANDIDATES = ROOT / "examples" / "candidates"
ONE = VerifierConfig(trials=1, timeout_s=60.0, shapes=({},))


def expectation(path: Path) -> tuple[str, str]:
    match = re.match(r"# expect: (\w+)(?: (\w+))?", path.read_text())
    assert match, f"{path} has no '# expect:' header"
    return match.group(1), match.group(2) or ""


def task_of(path: Path) -> str:
    match = re.search(r"^# task: (\w+)", path.read_text(), re.M)
    return (TASKS / f"{match.group(1) if match else 'relu'}.py").read_text()


@pytest.mark.parametrize(
    "path", sorted((CANDIDATES / "solutions").glob("*.py")), ids=lambda p: p.stem
)
def test_solution_passes_on_two_shape_sets(path: Path) -> None:
    report = verify(
        (TASKS / path.name).read_text(), path.read_text(), config=VerifierConfig(trials=2)
    )
    assert report.verdict == "pass", (report.summary, report.errors)
    assert len(report.shapes) == 2 and report.shapes[0] != report.shapes[1]
    assert report.max_abs_err is not None and report.max_abs_err < 1e-3
    assert report.timing is None and report.speedup is None  # CPU: no timing claims


def test_at_least_twelve_tasks_each_with_a_solution() -> None:
    tasks = {p.stem for p in TASKS.glob("*.py")}
    assert len(tasks) >= 12
    assert tasks == {p.stem for p in (CANDIDATES / "solutions").glob("*.py")}


@pytest.mark.parametrize("path", sorted((CANDIDATES / "cheats").glob("*.py")), ids=lambda p: p.stem)
def test_cheat_is_rejected_with_its_reason(path: Path) -> None:
    verdict, rule = expectation(path)
    config = VerifierConfig(trials=1, timeout_s=60.0)  # two shape sets: catches specialisation
    report = verify(task_of(path), path.read_text(), config=config)
    assert report.verdict == verdict, (report.summary, report.reasons)
    assert any(r.startswith(rule + ":") for r in report.reasons), report.reasons
    assert report.feedback and len(report.feedback) <= 2000
    assert verdict in report.feedback


@pytest.mark.parametrize("path", sorted((CANDIDATES / "legit").glob("*.py")), ids=lambda p: p.stem)
def test_legit_variant_passes(path: Path) -> None:
    report = verify(task_of(path), path.read_text(), config=VerifierConfig(trials=2))
    assert report.verdict == "pass", (report.summary, report.errors, report.reasons)


@pytest.mark.parametrize(
    "path", sorted((CANDIDATES / "hostile").glob("*.py")), ids=lambda p: p.stem
)
def test_hostile_candidate_is_rejected_statically(path: Path) -> None:
    rules = {v.rule for v in check_candidate(path.read_text())}
    assert rules, "a hostile candidate must not pass the static gate"


HOSTILE_RUNTIME = ["infinite_loop", "memory_bomb", "fork_bomb", "open_socket", "kill_parent"]


@pytest.mark.parametrize("name", HOSTILE_RUNTIME)
def test_hostile_candidate_is_contained_at_runtime(name: str) -> None:
    """With the static gate off, the sandbox itself must contain and classify it, and the
    verifier (this process, its warm process) must keep serving afterwards."""
    path = CANDIDATES / "hostile" / f"{name}.py"
    verdict, rule = expectation(path)
    config = VerifierConfig(
        trials=1, timeout_s=8.0, shapes=({},), static_gate=False, memory_mb=4096
    )
    started = time.monotonic()
    report = verify(task_of(path), path.read_text(), config=config)
    assert time.monotonic() - started < 40
    if name == "fork_bomb" and report.verdict == "timeout":
        pass  # contained by the pids cap and killed at the deadline: also acceptable
    else:
        assert report.verdict == verdict, (report.summary, report.reasons)
        if rule:
            assert any(r.startswith(rule + ":") for r in report.reasons), report.reasons
    # Still serving: a correct candidate passes right after.
    ok = verify(task_of(path), (CANDIDATES / "solutions" / "relu.py").read_text(), config=ONE)
    assert ok.verdict == "pass", ok.summary
    assert os.getpid() > 0  # and we are alive to assert it


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("torch_compute", "torch_compute: .*relu"),
        ("reused_output", "second_run: "),
        ("lazy_subclass", "output_type: "),
    ],
)
def test_gate_off_the_runtime_guards_catch_what_the_gate_refuses(name: str, reason: str) -> None:
    """The gate is one layer: with it off, the sandbox's own guards still refuse these."""
    path = CANDIDATES / "cheats" / f"{name}.py"
    config = VerifierConfig(trials=1, timeout_s=60.0, shapes=({},), static_gate=False)
    report = verify(task_of(path), path.read_text(), config=config)
    assert report.verdict == "rejected_runtime", (report.summary, report.reasons)
    assert re.match(reason, report.reasons[0]), report.reasons
