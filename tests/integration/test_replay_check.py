"""``kernelflow replay ID --check`` as installed, on a golden log (tests/data/golden) and on
a copy whose recorded choice was changed (tests/unit/test_golden_logs.py re-decides them
in-process)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from kernelflow.events.model import AgentDispatched, ConductorDecided
from tests.conftest import run_cli
from tests.golden_logs import GOLDEN
from tests.unit.test_golden_logs import tasks_in, write_log


def test_replay_check_says_each_decision_is_made_again_and_names_one_that_is_not(
    tmp_path: Path,
) -> None:
    """``kernelflow replay ID --check --from FILE``, as installed: exit 0 on a golden log;
    exit 1, naming the event, on a copy whose recorded choice was changed."""
    ((task_id, events),) = tasks_in("success").items()
    golden = str(GOLDEN / "success.jsonl")
    ok = run_cli("replay", task_id, "--check", "--from", golden)
    assert ok.returncode == 0, ok.stderr
    decided = sum(isinstance(e, ConductorDecided | AgentDispatched) for e in events)
    assert ok.stdout == f"{task_id}: {decided} recorded decisions, each made again as recorded\n"

    index = next(i for i, e in enumerate(events) if isinstance(e, ConductorDecided) and e.chosen)
    forged = msgspec.structs.replace(events[index], chosen="verifier", mode="auto")
    changed = tmp_path / "changed.jsonl"
    write_log(changed, [*events[:index], forged, *events[index + 1 :]])
    bad = run_cli("replay", task_id, "--check", "--from", str(changed))
    assert bad.returncode == 1, bad.stderr
    assert bad.stdout.startswith(f"{task_id} event {forged.seq} (conductor_decided): recorded ")
