"""Configuration: defaults, overridden by ``KF_*`` environment variables, overridden by
command-line flags. Every setting is documented in the README."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from platformdirs import user_data_dir

from kernelflow.actors.connection import ClientAuth, NatsEndpoint
from kernelflow.host.nats_server import embedded_nats

if TYPE_CHECKING:
    from kernelflow.verification.engine import VerifierConfig


class SettingsError(ValueError):
    pass


DEFAULT_UI_PORT = 8321  # kernelflow ui's (KF_UI_PORT, --port)


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


def _env_count(name: str, default: int) -> int:
    """A whole number >= 0."""
    value = _env_float(name, default)
    if not math.isfinite(value) or value != int(value) or value < 0:
        raise SettingsError(f"{name}={os.environ[name]!r}: expected a whole number >= 0")
    return int(value)


def _env_nonnegative(name: str, default: float) -> float:
    """Seconds >= 0."""
    value = _env_float(name, default)
    if not 0 <= value < math.inf:
        raise SettingsError(f"{name}={os.environ[name]!r}: expected seconds >= 0")
    return value


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


@dataclass(frozen=True)
class DeviceSpec:
    """What ``--devices`` (``KF_DEVICES``) asks the verifiers to own: ``kind`` "gpus"
    (the CUDA devices ``gpus``, one verifier each), "all" (every GPU this node's torch
    sees, one verifier each; on a node without one, as "cpu") or "cpu" (CPU verifiers,
    each pinned to a disjoint set of the cores: ``cpus`` of them, or, None, as many as
    ``--pool verifier=N`` says, 1 by default)."""

    kind: str
    gpus: tuple[str, ...] = ()
    cpus: int | None = None

    def __str__(self) -> str:
        if self.kind == "gpus":
            return ",".join(self.gpus)
        return self.kind if self.cpus is None else f"cpu:{self.cpus}"


def parse_devices(raw: str, source: str) -> DeviceSpec:
    """``all``, ``cpu``, ``cpu:N``, or a list of CUDA devices (``0,1``, UUIDs, as
    ``CUDA_VISIBLE_DEVICES`` names them); ``source`` names where it came from, for the
    error."""
    text = raw.strip()
    if text.lower() == "all":
        return DeviceSpec("all")
    if text.lower() == "cpu":
        return DeviceSpec("cpu")
    if text.lower().startswith("cpu:"):
        count = text[4:].strip()
        if not count.isdigit() or int(count) < 1:
            raise SettingsError(f"{source}={raw!r}: expected cpu:N with N ≥ 1 CPU verifiers")
        return DeviceSpec("cpu", cpus=int(count))
    gpus = parse_gpus(raw, source)
    if any(g.lower() in ("all", "cpu") or g.lower().startswith("cpu:") for g in gpus):
        raise SettingsError(
            f"{source}={raw!r}: 'all' and 'cpu' stand alone (all, cpu, cpu:N, or GPUs: 0,1)"
        )
    return DeviceSpec("gpus", gpus)


def parse_give_up(raw: str, source: str) -> float | None:
    """A NATS give-up bound in seconds; 0 means never give up (None)."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise SettingsError(f"{source}={raw!r}: expected seconds (0: never give up)")
    return value or None


def parse_port(raw: str, source: str) -> int:
    """A TCP port to listen on, 1-65535."""
    if not raw.strip().isdigit() or not 0 < int(raw) < 65536:
        raise SettingsError(f"{source}={raw!r}: expected a port number, 1-65535")
    return int(raw)


def _env_port(name: str) -> int | None:
    raw = os.environ.get(name)
    return parse_port(raw, name) if raw else None


def _env_path(name: str) -> Path | None:
    raw = os.environ.get(name)
    return Path(raw) if raw else None


def _env_devices() -> DeviceSpec | None:
    """``KF_DEVICES``, or its older name ``KF_GPUS``."""
    for name in ("KF_DEVICES", "KF_GPUS"):
        if raw := os.environ.get(name):
            return parse_devices(raw, name)
    return None


def _env_share_max_bytes() -> int:
    return int(_env_nonnegative("KF_EXTENSION_SHARE_MAX_MB", 64.0) * 1024 * 1024)


@dataclass
class Settings:
    # NATS server to use (or a comma-separated list of a cluster's); None starts the
    # embedded one.
    nats_url: str | None = field(default_factory=lambda: os.environ.get("KF_NATS_URL") or None)
    # Credentials to present: an nkey seed file or a .creds file. None: none for a server
    # given by URL, the data dir's for the embedded one.
    nats_creds: Path | None = field(default_factory=lambda: _env_path("KF_NATS_CREDS"))
    # TLS: the CA to trust (default: the system's), a client certificate and its key.
    tls_ca: Path | None = field(default_factory=lambda: _env_path("KF_NATS_TLS_CA"))
    tls_cert: Path | None = field(default_factory=lambda: _env_path("KF_NATS_TLS_CERT"))
    tls_key: Path | None = field(default_factory=lambda: _env_path("KF_NATS_TLS_KEY"))
    # How long a daemon goes on without its NATS (lost, or not reached at start) before
    # it exits with status 1, for its supervisor to restart it; None: it waits for good.
    nats_give_up_s: float | None = field(
        default_factory=lambda: parse_give_up(
            os.environ.get("KF_NATS_GIVE_UP", "60"), "KF_NATS_GIVE_UP"
        )
    )
    # How long a command (not a daemon: ``nats_give_up_s``) waits for a NATS server to
    # answer before it fails, saying why.
    connect_timeout_s: float = field(
        default_factory=lambda: _env_seconds("KF_CONNECT_TIMEOUT", 10.0)
    )
    # The embedded NATS server's store (the log) and keys, and what verifiers cache (checked
    # references, built extensions); not a run's outputs (``run --out``).
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
    # On a GPU, time torch.compile of the reference too (a second baseline; bench does).
    compare_compile: bool = field(default_factory=lambda: _env_bool("KF_COMPARE_COMPILE"))
    # The CPU threads candidate and baseline alike compute with where C++ kernels are timed
    # on the CPU; None: every core this process may use.
    verify_threads: int | None = field(
        default_factory=lambda: (
            _env_int("KF_VERIFY_THREADS", 1) if os.environ.get("KF_VERIFY_THREADS") else None
        )
    )
    # Timings the verifiers of this data dir run at once (each queues for a slot around
    # its timing phase only; 0: no queue), and the seconds of more rounds an inconclusive
    # speedup is measured for (0: none).
    timing_slots: int = field(default_factory=lambda: _env_count("KF_TIMING_SLOTS", 1))
    timing_extra_s: float = field(default_factory=lambda: _env_nonnegative("KF_TIMING_EXTRA", 10.0))
    # Where verifiers keep the extensions they built; None: the data dir's.
    extension_dir: Path | None = field(default_factory=lambda: _env_path("KF_EXTENSION_CACHE"))
    # Wall-clock limit for building one candidate's C++/CUDA extensions (load_inline).
    compile_timeout_s: float = field(
        default_factory=lambda: _env_seconds("KF_COMPILE_TIMEOUT", 300.0)
    )
    # What the verifiers own (``--devices``: GPUs, one verifier each; CPU verifiers on
    # cores of their own); None: one pool of verifiers, any device.
    devices: DeviceSpec | None = field(default_factory=_env_devices)
    # Compiled extensions larger than this are not shared through the cluster's object
    # store (0: nothing is).
    extension_share_max_bytes: int = field(default_factory=_env_share_max_bytes)
    # Where a daemon serves its Prometheus metrics (/metrics); None: it serves none. The
    # address it listens on: every interface by default, as a container's port must.
    metrics_port: int | None = field(default_factory=lambda: _env_port("KF_METRICS_PORT"))
    metrics_host: str = field(
        default_factory=lambda: os.environ.get("KF_METRICS_HOST") or "0.0.0.0"
    )
    # Run candidates (and the tools' commands) even where the sandbox cannot isolate them
    # (no network namespace, or no namespaces at all): they can then reach the network.
    # Off: refused, verdict unsupported. The sandbox reads it from the environment itself.
    sandbox_allow_network: bool = field(
        default_factory=lambda: _env_bool("KF_SANDBOX_ALLOW_NETWORK")
    )
    # Where ``kernelflow ui`` serves the dashboard: this machine only by default.
    ui_host: str = field(default_factory=lambda: os.environ.get("KF_UI_HOST") or "127.0.0.1")
    ui_port: int = field(default_factory=lambda: _env_port("KF_UI_PORT") or DEFAULT_UI_PORT)
    # A file holding the token the dashboard asks for; None: it asks for none.
    ui_token_file: Path | None = field(default_factory=lambda: _env_path("KF_UI_TOKEN_FILE"))
    # Where named workflows (NAME.yaml, ``--workflow NAME``) are looked for after the
    # current directory; None: the data dir's ``workflows``.
    workflows_dir: Path | None = field(default_factory=lambda: _env_path("KF_WORKFLOWS_DIR"))
    # Rewards from the verifier pool (kernelflow.rewards): a trainer process's requests in
    # flight at once, how long it waits for one, and whether verl's synchronous
    # ``compute_score`` asks the pool too (otherwise it verifies in a process of its own).
    reward_max_in_flight: int = field(
        default_factory=lambda: _env_int("KF_REWARD_MAX_IN_FLIGHT", 64)
    )
    reward_deadline_s: float = field(
        default_factory=lambda: _env_seconds("KF_REWARD_DEADLINE", 900.0)
    )
    reward_pool: bool = field(default_factory=lambda: _env_bool("KF_REWARD_POOL"))

    @property
    def gpus(self) -> tuple[str, ...]:
        """The CUDA devices ``--devices`` named (none for ``all`` and ``cpu``)."""
        return self.devices.gpus if self.devices is not None else ()

    @property
    def nats_store(self) -> Path:
        return self.data_dir / "nats"

    @property
    def workflow_dirs(self) -> tuple[Path, ...]:
        """Where a named workflow is looked for, in order: the current directory, then the
        workflows dir (``KF_WORKFLOWS_DIR``; by default the data dir's ``workflows``)."""
        return (Path.cwd(), self.workflows_dir or self.data_dir / "workflows")

    @property
    def extension_cache(self) -> Path:
        """Where verifiers keep the C++/CUDA extensions they built (``KF_EXTENSION_CACHE``;
        by default the data dir's, shared by its processes): a source built once is never
        built again."""
        return self.extension_dir or self.data_dir / "extensions"

    def verifier_config(self, **fields: Any) -> VerifierConfig:
        """The verifier's configuration under these settings; ``fields``: a command's own
        (trials, timeout, shapes ...) over them."""
        from kernelflow.verification.engine import VerifierConfig

        configured: dict[str, Any] = {
            "timeout_s": self.verify_timeout_s,
            "compare_compile": self.compare_compile,
            "threads": self.verify_threads,
            "extension_cache": str(self.extension_cache),
            "compile_timeout_s": self.compile_timeout_s,
            "timing_slots": self.timing_slots,
            "timing_extra_s": self.timing_extra_s,
            "timing_lock_dir": str(self.data_dir / "timing"),
            "extension_share_max_bytes": self.extension_share_max_bytes,
        }
        return VerifierConfig(**{**configured, **fields})

    @property
    def nats_auth(self) -> ClientAuth:
        """The credentials and TLS settings given (none given: an empty ClientAuth)."""
        return ClientAuth(self.nats_creds, self.tls_ca, self.tls_cert, self.tls_key)

    @contextlib.contextmanager
    def nats(self) -> Iterator[NatsEndpoint]:
        """Yield the NATS to use: the configured one, or the embedded server of
        ``data_dir`` (shared with other kernelflow processes using the same dir; with the
        data dir's credentials unless others are given)."""
        if self.nats_url:
            yield NatsEndpoint(self.nats_url, self.nats_auth)
            return
        if self.nats_auth.tls:
            raise SettingsError(
                "TLS settings need a server given by URL (--nats-url or KF_NATS_URL): the "
                "embedded server listens on loopback, without TLS"
            )
        with embedded_nats(self.nats_store, sync_interval=self.sync_interval) as embedded:
            yield embedded._replace(auth=self.nats_auth) if self.nats_creds else embedded
