"""The event log's contract (tests/unit/test_eventlog_contract.py, where the in-memory
adapter runs it) held against the JetStream adapter, on a real nats-server of each
test's own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.unit.test_eventlog_contract import CONTRACT, LogUnderTest, on_jetstream


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
def test_the_contract_on_jetstream(check: Callable[[LogUnderTest], None], tmp_path: Path) -> None:
    with contextlib.contextmanager(on_jetstream)(tmp_path / "nats") as t:
        check(t)
