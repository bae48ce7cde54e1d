"""Configuration: defaults, overridden by ``KF_*`` environment variables, overridden by
command-line flags. Every setting is documented in the README."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from platformdirs import user_data_dir

from kernelflow.nats_server import embedded_nats


class SettingsError(ValueError):
    pass


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r}: expected a number") from exc


def _env_seconds(name: str, default: float) -> float:
    value = _env_float(name, default)
    if not 0 < value < math.inf:  # 0 would make the daemon's in-progress sweep spin
        raise SettingsError(f"{name}={os.environ[name]!r}: expected a positive number of seconds")
    return value


def _env_int(name: str, default: int) -> int:
    value = _env_float(name, default)
    if not math.isfinite(value) or value != int(value) or value < 1:
        raise SettingsError(f"{name}={os.environ[name]!r}: expected a positive integer")
    return int(value)


def _env_bool(name: str) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{name}={os.environ[name]!r}: expected 1 or 0")


def parse_gpus(raw: str, source: str) -> tuple[str, ...]:
    """A list of CUDA devices, e.g. "0,1" or "GPU-8f3…,GPU-1a2…" (as CUDA_VISIBLE_DEVICES
    names them); ``source`` names where it came from, for the error."""
    gpus = tuple(g.strip() for g in raw.split(","))
    if not all(gpus):
        raise SettingsError(f"{source}={raw!r}: expected device indices or UUIDs, e.g. 0,1")
    if len(set(gpus)) != len(gpus):
        raise SettingsError(f"{source}={raw!r}: a device is named twice")
    return gpus


def _env_gpus() -> tuple[str, ...]:
    raw = os.environ.get("KF_GPUS")
    return parse_gpus(raw, "KF_GPUS") if raw else ()


@dataclass
class Settings:
    # NATS server to use; None starts the embedded one.
    nats_url: str | None = field(default_factory=lambda: os.environ.get("KF_NATS_URL") or None)
    # Where the embedded NATS keeps its JetStream store (the log), and run outputs.
    data_dir: Path = field(
        default_factory=lambda: Path(os.environ.get("KF_DATA_DIR") or user_data_dir("kernelflow"))
    )
    # Copies of every stream message in a JetStream cluster (3 survives a node loss).
    replicas: int = field(default_factory=lambda: _env_int("KF_REPLICAS", 1))
    # Embedded NATS fsync period: "2m" (NATS default) or "always".
    sync_interval: str | None = field(default_factory=lambda: os.environ.get("KF_SYNC_INTERVAL"))
    # Seconds before work held by a daemon that died is delivered again.
    ack_wait_s: float = field(default_factory=lambda: _env_seconds("KF_ACK_WAIT", 30.0))
    # LLM provider spec, e.g. "scripted:examples/scripted/relu.yaml".
    llm: str | None = field(default_factory=lambda: os.environ.get("KF_LLM") or None)
    # How long a daemon's stop may take (its actors finishing what they hold, saving its
    # read model, closing NATS) before it stops at once, as on a second signal. Below the
    # systemd unit's TimeoutStopSec (45), so that the unit is not SIGKILLed mid-stop.
    stop_deadline_s: float = field(default_factory=lambda: _env_seconds("KF_STOP_DEADLINE", 40.0))
    # Wall-clock limit for verifying one candidate.
    verify_timeout_s: float = field(
        default_factory=lambda: _env_seconds("KF_VERIFY_TIMEOUT", 300.0)
    )
    # CUDA devices the verifiers own, one verifier actor each; () : one verifier, any device.
    gpus: tuple[str, ...] = field(default_factory=_env_gpus)
    # Run candidates (and the tools' commands) even where the sandbox cannot isolate them
    # (no network namespace, or no namespaces at all): they can then reach the network.
    # Off: refused, verdict unsupported. The sandbox reads it from the environment itself.
    sandbox_allow_network: bool = field(
        default_factory=lambda: _env_bool("KF_SANDBOX_ALLOW_NETWORK")
    )

    @property
    def nats_store(self) -> Path:
        return self.data_dir / "nats"

    @contextlib.contextmanager
    def nats(self) -> Iterator[str]:
        """Yield the URL of the NATS to use: the configured one, or the embedded server
        of ``data_dir`` (shared with other kernelflow processes using the same dir)."""
        if self.nats_url:
            yield self.nats_url
            return
        with embedded_nats(self.nats_store, sync_interval=self.sync_interval) as url:
            yield url
