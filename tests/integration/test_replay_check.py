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


def test_replay_check_takes_several_tasks_or_every_task_of_the_source(tmp_path: Path) -> None:
    """``replay --check [TASK_ID…]``: with no id, every task the file holds (CI runs it on
    each golden log); with ids, those; a task the source does not hold is one line, exit 2."""
    search = str(GOLDEN / "search.jsonl")
    ids = sorted(tasks_in("search"))
    assert len(ids) > 1
    every = run_cli("replay", "--check", "--from", search)
    assert every.returncode == 0, every.stderr
    assert sorted(line.split(":")[0] for line in every.stdout.splitlines()) == ids
    named = run_cli("replay", *ids, "--check", "--from", search)
    assert named.returncode == 0 and named.stdout == every.stdout
    missing = run_cli("replay", ids[0], "nosuch", "--check", "--from", search)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"kernelflow: no task nosuch in the file {search}"
    one = run_cli("replay", *ids, "--from", search)  # several, without --check
    assert one.returncode == 2 and "one task at a time" in one.stderr
