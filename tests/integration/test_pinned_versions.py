"""Versions pinned on a task (docs/workflows.md, "Versions pinned on a task"), as the
installed CLI says them: ``replay`` and ``reverify`` of a golden log whose task says it
started with an older verifier, another torch and another text of its workflow name what
differs from today; a task pinned with today's versions gets no such note."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import msgspec

from kernelflow.events.model import TaskSubmitted
from kernelflow.verification.engine import VERIFIER_VERSION
from tests.conftest import run_cli
from tests.unit.test_golden_logs import tasks_in, write_log


def pinned_log(tmp_path: Path, versions: dict[str, str]) -> tuple[str, Path]:
    ((task_id, events),) = tasks_in("success").items()
    first = events[0]
    assert isinstance(first, TaskSubmitted)
    path = tmp_path / "pinned.jsonl"
    write_log(path, [msgspec.structs.replace(first, versions=versions), *events[1:]])
    return task_id, path


def test_replay_and_reverify_say_what_differs_from_today(tmp_path: Path) -> None:
    torch = importlib.metadata.version("torch")
    old = {"verifier": "1", "torch": "0.1.0", "workflow_sha256": "0" * 64, "policy": "strict"}
    task_id, log = pinned_log(tmp_path, old)
    replay = run_cli("replay", task_id, "--from", str(log))
    assert replay.returncode == 0, replay.stderr
    said = f"{task_id} started with other versions than today's: "
    line = next(line for line in replay.stderr.splitlines() if line.startswith(said))
    assert f"verifier: 1 → {VERIFIER_VERSION}" in line and f"torch: 0.1.0 → {torch}" in line
    assert "workflow text: 000000000000 → " in line and "policy" not in line

    # Checked again here (--force: this verifier version checked it already).
    reverify = run_cli("reverify", "--from", str(log), "--force")
    assert reverify.returncode == 0, reverify.stderr
    since = f"[since the task started: verifier: 1 → {VERIFIER_VERSION}; torch: 0.1.0 → {torch}]"
    assert since in reverify.stdout

    current = {"verifier": str(VERIFIER_VERSION), "torch": torch}
    task_id, log = pinned_log(tmp_path, current)
    quiet = run_cli("replay", task_id, "--from", str(log))
    assert quiet.returncode == 0 and "other versions" not in quiet.stderr
