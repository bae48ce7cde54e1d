"""The second hour of a user (issue 49), row by row, with the real CLI on the default
configuration (the embedded NATS, a scripted model): what a resumed ``bench`` does with
the candidates its Ctrl-C cancelled, what ``status`` says of a task no daemon advances,
what a long command shows while it works. Rows tested elsewhere: a run that leaves
others' tasks queued, and a cancel with no daemon (tests/test_workflow_runs.py); a task
file with a syntax error (tests/test_e2e.py); every documented snippet
(tests/test_docs_snippets.py); a search interrupted anywhere, as a property
(tests/test_search_strategies.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.events.log import TaskHistory
from tests.conftest import as_user, role_auth, run_cli
from tests.daemons import submitted_on_default

# Starts servers and CLI processes: not in `make test-fast`.
pytestmark = pytest.mark.integration


def test_a_task_no_daemon_advances_shows_as_queued_not_running(private_nats: str) -> None:
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    try:  # a task recorded, then left: the daemon that took it is gone
        bridge.call(bridge.log.append(TaskHistory("left"), [submitted_on_default("left")]))
    finally:
        bridge.stop()
    one = run_cli("status", "left", "--json", *as_user("publisher", private_nats))
    assert one.returncode == 0, one.stderr
    row = json.loads(one.stdout)
    assert row["status"] == "queued"
    assert row["reason"] == "no daemon answered: it waits for one (kernelflow daemon)"
    every = run_cli("status", *as_user("publisher", private_nats))
    assert every.returncode == 0, every.stderr
    (line,) = [line for line in every.stdout.splitlines() if line.startswith("left ")]
    assert line.split()[1] == "queued"
