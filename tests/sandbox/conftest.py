"""The sandbox tier: the verifier's processes and the compilers they run, nothing of a
deployment (tests/tiers.py holds every test here to it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests import tiers


@pytest.fixture(autouse=True)
def _sandbox_tier(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from tiers.sandbox(monkeypatch)
