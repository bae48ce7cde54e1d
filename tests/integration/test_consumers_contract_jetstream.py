"""The durable consumers' contract (tests/unit/test_consumers_contract.py, where the
memory adapter runs it) held against JetStream's, on a real nats-server of each test's
own."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from tests.unit.test_consumers_contract import CONTRACT, WAIT_S, Clause, on_jetstream


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
def test_the_contract_on_jetstream(check: Clause, tmp_path: Path) -> None:
    with contextlib.contextmanager(on_jetstream)(tmp_path / "nats") as (t, run):
        run(asyncio.wait_for(check(t), 2 * WAIT_S))
