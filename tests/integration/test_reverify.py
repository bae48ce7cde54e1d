"""``kernelflow reverify`` after a verifier change: a log recorded by an older verifier
that passed a reward hack (as the verifier before version 1 could be made to) is checked
again with today's; the changed verdict is shown and recorded, rewards and datasets follow
the newest verdict by default and the old one on request. Real NATS, real verifier."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import (
    ChatMessage,
    Event,
    LLMCalled,
    RewardAssigned,
    TaskFinished,
    TaskSubmitted,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.verification.engine import VERIFIER_VERSION
from kernelflow.workflows.loader import load_workflow
from tests.conftest import EXAMPLES, as_user, connect, run_cli

RELU = (EXAMPLES / "tasks" / "relu.py").read_text()
LEGIT = (EXAMPLES / "candidates" / "solutions" / "relu.py").read_text()
HACK = (EXAMPLES / "candidates" / "cheats" / "torch_compute.py").read_text()


def old_run(task_id: str, code: str) -> list[Event]:
    """A task as a verifier of version 0 recorded it: the kernel passed."""
    workflow, yaml_text = load_workflow("coder_only")
    passed = VerificationReport(verdict="pass", summary="all 3 trial(s) match", device="cpu")
    return [
        TaskSubmitted(
            task_id=task_id,
            task_name="relu",
            task_source=RELU,
            workflow_name=workflow.name,
            workflow_yaml=yaml_text,
            backend="triton",
            group_id="old-run",
        ),
        LLMCalled(
            task_id=task_id,
            agent="coder",
            dispatch_id="d1",
            provider="scripted",
            model="m",
            messages=[ChatMessage(role="user", content="write relu")],
            response_text=f"```python\n{code}```",
        ),
        VerificationCompleted(
            task_id=task_id, agent="verifier", dispatch_id="d2", code=code, report=passed
        ),
        TaskFinished(
            task_id=task_id, status="success", reason="passed", final_code=code, verdict="pass"
        ),
        *(
            RewardAssigned(task_id=task_id, reward_fn=fn, version=1, value=1.0)
            for fn in ("binary", "speedup", "cheat_penalty")
        ),
    ]


@pytest.fixture
def old_log(private_nats: str) -> str:
    async def record() -> None:  # as the daemons of an older kernelflow recorded it
        nc = await connect(private_nats, "daemon")
        log = EventLog(nc)
        await log.ensure_streams()
        for task_id, code in (("legit", LEGIT), ("hack", HACK)):
            await log.append(TaskHistory(task_id), old_run(task_id, code))
        await nc.close()

    asyncio.run(record())
    return private_nats


def rewards(url: str, tmp_path: Path, *extra: str) -> dict[str, float]:
    out = tmp_path / f"samples{len(extra)}.jsonl"
    result = run_cli("export", "grpo", "--out", str(out), *as_user("reader", url), *extra)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {r["rollout_id"]: r["reward"] for r in rows}


def test_reverify_finds_the_hack_an_older_verifier_passed_and_the_data_follows(
    old_log: str, tmp_path: Path
) -> None:
    assert rewards(old_log, tmp_path) == {"legit": 1.0, "hack": 1.0}
    result = run_cli("reverify", "--json", *as_user("daemon", old_log))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["checked"] == 2 and out["unchanged"] == 1 and out["recorded"] == 2
    [changed] = out["changed"]
    assert (changed["task_id"], changed["before"], changed["after"]) == (
        "hack",
        "pass",
        "rejected_static",
    )
    assert (changed["before_version"], changed["after_version"]) == (0, VERIFIER_VERSION)
    assert "torch" in changed["summary"]
    # Rewards and datasets take the newest verdict; the older one on request.
    assert rewards(old_log, tmp_path) == {"legit": 1.0, "hack": 0.0}
    assert rewards(old_log, tmp_path, "--verifier-version", "0") == {"legit": 1.0, "hack": 1.0}
    replay = run_cli("replay", "--task", "hack", "--json", *as_user("reader", old_log))
    trajectory = json.loads(replay.stdout)
    assert trajectory["metadata"]["rewards"] == {
        "binary": 0.0,
        "speedup": 0.0,
        "cheat_penalty": -1.0,
    }
    assert trajectory["metadata"]["reverified"][0]["verdict"] == "rejected_static"
    status = run_cli("status", "hack", *as_user("publisher", old_log))
    assert f"\nchecked again by verifier {VERIFIER_VERSION}: rejected_static\n" in status.stdout
    # Checked by this version already: nothing to do, nothing recorded twice.
    again = run_cli("reverify", "--json", *as_user("daemon", old_log))
    assert json.loads(again.stdout)["checked"] == 0
    forced = run_cli(
        "reverify", "--force", "--dry-run", "--task", "hack", "--json", *as_user("daemon", old_log)
    )
    assert json.loads(forced.stdout) | {"changed": []} == {
        "verifier_version": VERIFIER_VERSION,
        "checked": 1,
        "already_current": 0,
        "recorded": 0,
        "changed": [],
        "unchanged": 1,
    }
