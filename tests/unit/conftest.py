"""The unit tier: pure code and the in-memory adapters, no process, no network
(tests/tiers.py holds every test here to it). ``make test-fast`` runs this tier alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import tiers


@pytest.fixture(autouse=True)
def _unit_tier(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from tiers.unit(monkeypatch)
