"""Settings from the environment: a value that cannot work is refused at start, naming
the variable and what was given, instead of a daemon that misbehaves with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelflow.host.settings import Settings, SettingsError


@pytest.mark.parametrize(
    "name, raw, expected",
    [
        ("KF_ACK_WAIT", "abc", "expected a number"),
        # 0 would make the in-progress sweep (every ack_wait / 3) spin the bridge loop.
        ("KF_ACK_WAIT", "0", "expected a positive number of seconds"),
        ("KF_ACK_WAIT", "nan", "expected a positive number of seconds"),
        ("KF_VERIFY_TIMEOUT", "-1", "expected a positive number of seconds"),
        ("KF_VERIFY_TIMEOUT", "inf", "expected a positive number of seconds"),
        ("KF_STOP_DEADLINE", "0", "expected a positive number of seconds"),
        ("KF_REPLICAS", "0", "expected a positive integer"),
        ("KF_REPLICAS", "1.5", "expected a positive integer"),
        ("KF_REPLICAS", "inf", "expected a positive integer"),
        ("KF_TIMING_SLOTS", "-1", "expected a whole number >= 0"),
        ("KF_TIMING_SLOTS", "1.5", "expected a whole number >= 0"),
        ("KF_TIMING_EXTRA", "-1", "expected seconds >= 0"),
        ("KF_TIMING_EXTRA", "inf", "expected seconds >= 0"),
    ],
)
def test_unusable_values_are_refused_by_name(
    name: str, raw: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(SettingsError) as refused:
        Settings()
    assert str(refused.value) == f"{name}={raw!r}: {expected}"


def test_usable_values_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KF_ACK_WAIT", "0.5")
    monkeypatch.setenv("KF_VERIFY_TIMEOUT", "60")
    monkeypatch.setenv("KF_REPLICAS", "3")
    monkeypatch.setenv("KF_STOP_DEADLINE", "20")
    settings = Settings()
    taken = (settings.ack_wait_s, settings.verify_timeout_s, settings.replicas)
    assert (*taken, settings.stop_deadline_s) == (0.5, 60.0, 3, 20.0)


def test_the_timing_settings_reach_the_verifier(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One timing at a time per data dir unless told (KF_TIMING_SLOTS; 0: no queue), and
    the seconds of more rounds an inconclusive speedup gets (KF_TIMING_EXTRA)."""
    monkeypatch.setenv("KF_DATA_DIR", str(tmp_path))
    config = Settings().verifier_config()
    assert (config.timing_slots, config.timing_extra_s) == (1, 10.0)
    assert config.timing_lock_dir == str(tmp_path / "timing")
    monkeypatch.setenv("KF_TIMING_SLOTS", "0")
    monkeypatch.setenv("KF_TIMING_EXTRA", "0")
    config = Settings().verifier_config()
    assert (config.timing_slots, config.timing_extra_s) == (0, 0.0)
