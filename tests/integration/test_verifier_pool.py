"""A verifier pool that scales on the machines users have: ``--devices`` (one verifier per
GPU, or CPU verifiers on disjoint cores) and compiled extensions shared by the verifiers
of a cluster through JetStream's object store, behind each node's disk cache.

What runs on a GPU cannot run here (no GPU): the configurations a GPU node gets, the
environment its sandboxes get and the keys its CUDA builds get are checked as values;
``--devices all`` is run on this CPU node, where it makes CPU verifiers. The shared store
runs on a real server with the roles' keys; one test compiles one real C++ extension.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path

import nats
import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import DaemonConfig
from kernelflow.actors.devices import core_ranges, device_label, split_cores
from kernelflow.actors.extension_store import (
    NatsExtensionStore,
    ensure_extension_bucket,
    with_shared_extensions,
)
from kernelflow.events import subjects
from kernelflow.host.runtime import verifier_devices
from kernelflow.host.settings import DeviceSpec, Settings, SettingsError, parse_devices
from kernelflow.sandbox import device_env, sandbox_env, visible_gpus
from kernelflow.sandbox.probe import GPU_DEVICE_FILES
from kernelflow.verification import engine
from kernelflow.verification.backends.extension import ExtensionSpec, wanted_extensions
from kernelflow.verification.engine import VerifierConfig, timing_slot_group, verify
from kernelflow.verification.extension_store import (
    DEFAULT_MAX_BYTES,
    BadEntry,
    fetch,
    pack,
    share,
    unpack,
)
from kernelflow.verification.extensions import (
    Extension,
    gpu_architecture,
    planned_extensions,
    store,
    toolchain,
    unbuilt,
)
from tests.conftest import REPO, role_auth, run_cli
from tests.daemons import start_daemon, wait_for_line
from tests.integration.test_health import health

no_gpu_here = not any(os.path.exists(f) for f in GPU_DEVICE_FILES)
needs_no_gpu = pytest.mark.skipif(not no_gpu_here, reason="asserts what a CPU node does")

TASK = (REPO / "examples/kernelbench/level1/12_tanh_gelu.py").read_text()
FUSED = (REPO / "examples/candidates/cpp/tanh_gelu_fused.py").read_text()


# --------------------------------------------------------------------------- --devices


def test_devices_are_all_gpus_or_cpu_verifiers() -> None:
    assert parse_devices("all", "--devices") == DeviceSpec("all")
    assert parse_devices(" 0, 1 ", "--devices") == DeviceSpec("gpus", ("0", "1"))
    assert parse_devices("GPU-5f1c,MIG-2", "--devices").gpus == ("GPU-5f1c", "MIG-2")
    assert parse_devices("cpu", "--devices") == DeviceSpec("cpu")
    assert parse_devices("cpu:4", "--devices") == DeviceSpec("cpu", cpus=4)
    assert [str(parse_devices(s, "x")) for s in ("all", "cpu", "cpu:4", "0,1")] == [
        "all",
        "cpu",
        "cpu:4",
        "0,1",
    ]
    for bad, said in (
        ("cpu:0", "cpu:N with N ≥ 1"),
        ("cpu:x", "cpu:N with N ≥ 1"),
        ("0,all", "stand alone"),
        ("cpu,0", "stand alone"),
        ("0,,1", "device indices or UUIDs"),
        ("1,1", "named twice"),
    ):
        with pytest.raises(SettingsError, match=said):
            parse_devices(bad, "--devices")


def test_kf_devices_and_its_older_name_kf_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KF_DEVICES", raising=False)
    monkeypatch.setenv("KF_GPUS", "2,3")
    assert Settings().devices == DeviceSpec("gpus", ("2", "3"))
    assert Settings().gpus == ("2", "3")
    monkeypatch.setenv("KF_DEVICES", "cpu:2")
    assert Settings().devices == DeviceSpec("cpu", cpus=2)  # the new name wins
    assert Settings().gpus == ()
    monkeypatch.setenv("KF_DEVICES", "cpu:none")
    with pytest.raises(SettingsError, match="KF_DEVICES"):
        Settings()


def test_all_is_every_gpu_here_or_cpu_verifiers(caplog: pytest.LogCaptureFixture) -> None:
    two = lambda python: ("0", "1")  # noqa: E731
    none = lambda python: ()  # noqa: E731
    everything = DeviceSpec("all")
    assert verifier_devices(everything, None, "py", two) == (("0", "1"), 0)
    with caplog.at_level(logging.INFO, "kernelflow.cli"):
        assert verifier_devices(everything, None, "py", none) == ((), 1)
        assert verifier_devices(everything, 3, "py", none) == ((), 3)
    assert "--devices all: no GPU here: 3 CPU verifier(s)" in caplog.text
    with caplog.at_level(logging.INFO, "kernelflow.cli"):
        assert verifier_devices(everything, 3, "py", two) == (("0", "1"), 0)
    assert "--pool verifier=3 sizes the CPU verifiers of nodes without a GPU" in caplog.text
    assert verifier_devices(DeviceSpec("gpus", ("7",)), None, "py", none) == (("7",), 0)
    assert verifier_devices(DeviceSpec("cpu", cpus=2), None, "py", two) == ((), 2)
    assert verifier_devices(DeviceSpec("cpu"), 4, "py", two) == ((), 4)


@needs_no_gpu
def test_a_cpu_node_sees_no_gpu() -> None:
    assert visible_gpus() == ()
    assert gpu_architecture(VerifierConfig().python) == "gpu: none"


def test_cores_split_into_disjoint_sets_as_even_as_they_go() -> None:
    assert split_cores(range(8), 3) == [(0, 1, 2), (3, 4, 5), (6, 7)]
    assert split_cores([5, 1, 3], 3) == [(1,), (3,), (5,)]
    assert split_cores(range(4), 1) == [(0, 1, 2, 3)]
    for n in range(1, 17):
        sets = split_cores(range(16), n)
        flat = [c for s in sets for c in s]
        assert sorted(flat) == list(range(16)) and len(set(flat)) == 16
        assert max(map(len, sets)) - min(map(len, sets)) <= 1
    with pytest.raises(ValueError, match="3 CPU verifiers need 3 cores; this process may use 2"):
        split_cores([0, 1], 3)
    assert core_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_cpu_verifiers_each_own_their_cores_and_time_with_as_many_threads() -> None:
    config = DaemonConfig(
        roles=("verifier",),
        cpu_verifiers=3,
        cores=tuple(range(8)),
        verifier=VerifierConfig(timeout_s=7),
    )
    assert config.pool_size("verifier") == 3
    owned = config.verifier_configs()
    assert [(c.cores, c.threads, c.device, c.gpu, c.timeout_s) for c in owned] == [
        ((0, 1, 2), 3, "cpu", None, 7),
        ((3, 4, 5), 3, "cpu", None, 7),
        ((6, 7), 2, "cpu", None, 7),
    ]
    assert [device_label(c) for c in owned] == ["cpu:0-2", "cpu:3-5", "cpu:6-7"]
    fewer = replace(config, verifier=VerifierConfig(threads=2)).verifier_configs()
    assert [c.threads for c in fewer] == [2, 2, 2]  # KF_VERIFY_THREADS, within each set
    with pytest.raises(ValueError, match="need 9 cores"):
        replace(config, cpu_verifiers=9).verifier_configs()
    # Without --devices: the pool as before, unpinned.
    assert [c.cores for c in DaemonConfig(pool_sizes={"verifier": 2}).verifier_configs()] == [
        None,
        None,
    ]


def test_a_gpu_verifier_s_sandboxes_see_its_device_and_its_timings_queue_for_it() -> None:
    # What cannot run here: each GPU verifier's sandboxes (the warm process its judge and
    # candidate fork from, a fresh one, the probes) get CUDA_VISIBLE_DEVICES of its GPU.
    (zero, uuid) = DaemonConfig(gpus=("0", "GPU-5f1c")).verifier_configs()
    assert (zero.gpu, zero.device, uuid.gpu) == ("0", "cuda", "GPU-5f1c")
    assert sandbox_env("/tmp", zero.gpu)["CUDA_VISIBLE_DEVICES"] == "0"
    assert device_env("/tmp", "cuda", uuid.gpu)["CUDA_VISIBLE_DEVICES"] == "GPU-5f1c"
    assert engine._warm_key(zero, "cuda", ()).gpu == "0"
    assert engine._warm_key(zero, "cuda", ()) != engine._warm_key(uuid, "cuda", ())
    # One timing at a time per device: a GPU's slots are its own; the CPU's the node's,
    # whichever cores a CPU verifier owns.
    assert timing_slot_group("cuda", "0") != timing_slot_group("cuda", "1")
    assert timing_slot_group("cpu", "0") == timing_slot_group("cpu", None) == "cpu"


def test_the_cli_checks_devices_before_it_connects() -> None:
    nowhere = ["daemon", "--nats-url", "nats://127.0.0.1:9"]
    both = run_cli(*nowhere, "--devices", "0", "--gpus", "1")
    assert both.returncode == 2 and "--devices and --gpus" in both.stderr
    counted = run_cli(*nowhere, "--devices", "cpu:2", "--pool", "verifier=2")
    assert counted.returncode == 2 and "drop --pool verifier=N" in counted.stderr
    cores = len(os.sched_getaffinity(0))
    many = run_cli(*nowhere, "--devices", f"cpu:{cores + 1}")
    assert many.returncode == 2
    assert f"need {cores + 1} cores; this process may use {cores}" in many.stderr
    bad = run_cli(*nowhere, "--devices", "cpu,1")
    assert bad.returncode == 2 and "stand alone" in bad.stderr


# --------------------------------------------------------------------------- keys


def _spec(name: str, cuda: bool = False) -> ExtensionSpec:
    return ExtensionSpec(
        name=name,
        cpp_sources=(f"// {name}",),
        cuda_sources=("__global__ void k() {}",) if cuda else (),
        functions=("f",),
    )


def test_a_cuda_build_is_keyed_by_the_gpu_it_was_built_for(tmp_path: Path) -> None:
    specs = [_spec("c"), _spec("g", cuda=True)]
    hopper = "gpu sm_90 | torch cuda 12.4 | Build cuda_12.4.r12.4/compiler.34097967_0"
    ampere = hopper.replace("sm_90", "sm_80")
    newer_nvcc = hopper.replace("12.4.r12.4", "12.6.r12.6")
    cpp_h, cuda_h = planned_extensions(specs, tmp_path, "gcc 12", hopper)
    cpp_a, cuda_a = planned_extensions(specs, tmp_path, "gcc 12", ampere)
    _, cuda_n = planned_extensions(specs, tmp_path, "gcc 12", newer_nvcc)
    assert cpp_h.entry == cpp_a.entry  # C++ alone: the same build on every GPU
    assert len({cuda_h.entry, cuda_a.entry, cuda_n.entry}) == 3
    assert len({cuda_h.module, cuda_a.module, cuda_n.module}) == 3
    # And by the toolchain, as before: compilers, torch, Python, the processor.
    assert planned_extensions(specs, tmp_path, "gcc 13", hopper)[0].entry != cpp_h.entry


# --------------------------------------------------------------------------- entries


def _built(tmp_path: Path, cache: str, library: bytes, name: str = "a") -> Extension:
    """An extension "built" into the cache ``cache``, through the build's own store()."""
    (ext,) = planned_extensions([_spec(name)], tmp_path / cache, "gcc 12")
    built = tmp_path / f"built-{cache}-{name}"
    (built / ext.module).mkdir(parents=True)
    (built / ext.module / f"{ext.module}.so").write_bytes(library)
    store([ext], built)
    return ext


def test_an_entry_holds_its_spec_and_digest_and_is_checked_on_the_way_in(
    tmp_path: Path,
) -> None:
    ext = _built(tmp_path, "a", b"\x7fELF built")
    data = pack(ext, ext.library.read_bytes())
    assert unpack(ext, data) == b"\x7fELF built"
    header = json.loads(data.partition(b"\n")[0])
    assert ExtensionSpec.from_json(header["spec"]) == ext.spec
    assert header["key"] == ext.entry.name
    (other,) = planned_extensions([_spec("b")], tmp_path / "a", "gcc 12")
    for damaged, why in (
        (data.replace(b"built", b"BUILT"), "sha256 does not match"),
        (data + b"more", "announced"),
        (b"\x7fELF", "not an entry"),
        (b"{}\n" + b"\x7fELF built", "not an entry"),
        (data.replace(b'"name": "a"', b'"name": "z"'), "its spec"),
    ):
        with pytest.raises(BadEntry, match=why):
            unpack(ext, damaged)
    with pytest.raises(BadEntry, match="its key is not the extension's"):
        unpack(other, data)


class _Dict:
    """A store in memory, for the size limits (the NATS one is tested below)."""

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.entries.get(key)

    def put(self, key: str, data: bytes) -> None:
        self.entries[key] = data


def test_entries_over_the_limit_are_neither_shared_nor_fetched(tmp_path: Path) -> None:
    ext = _built(tmp_path, "a", b"x" * 1000)
    shared = _Dict()
    share([ext], shared, max_bytes=500)
    assert shared.entries == {}
    share([ext], shared, max_bytes=DEFAULT_MAX_BYTES)
    (empty,) = planned_extensions([ext.spec], tmp_path / "b", "gcc 12")
    assert fetch([empty], shared, max_bytes=500) == [empty]
    assert fetch([empty], shared, max_bytes=DEFAULT_MAX_BYTES) == []
    assert empty.library.read_bytes() == b"x" * 1000


# --------------------------------------------------------------------------- NATS


def _bridge(url: str, role: str) -> Bridge:
    return Bridge(url, auth=role_auth(url, role)).start()


def test_one_node_s_build_is_another_s_fetch_and_a_damaged_entry_is_ignored(
    private_nats: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    daemon, verifier = _bridge(private_nats, "daemon"), _bridge(private_nats, "verifier")
    try:
        assert daemon.call(ensure_extension_bucket(daemon.buckets, 1)) is True
        assert daemon.call(ensure_extension_bucket(daemon.buckets, 1)) is False
        shared = NatsExtensionStore(verifier, DEFAULT_MAX_BYTES)
        # Node A built it (its build stored in its cache) and shares it.
        built = _built(tmp_path, "a", b"\x7fELF node A's build")
        share([built], shared, DEFAULT_MAX_BYTES)
        # Node B, its cache empty: fetched whole into its cache, nothing left to build.
        (wanted,) = planned_extensions([built.spec], tmp_path / "b", "gcc 12")
        assert unbuilt([wanted]) == [wanted]
        assert fetch([wanted], shared, DEFAULT_MAX_BYTES) == []
        assert wanted.library.read_bytes() == b"\x7fELF node A's build"
        spec = json.loads((wanted.entry / "spec.json").read_text())
        assert ExtensionSpec.from_json(spec) == built.spec
        assert [p.name for p in (tmp_path / "b").iterdir()] == [wanted.entry.name]  # whole
        # A damaged entry (another library under the digest of this one): ignored, said.
        key = built.entry.name
        good = shared.get(key)
        assert good is not None
        shared.put(key, good.replace(b"node A", b"node X"))
        (node_c,) = planned_extensions([built.spec], tmp_path / "c", "gcc 12")
        with caplog.at_level(logging.INFO, "kernelflow.extensions"):
            assert fetch([node_c], shared, DEFAULT_MAX_BYTES) == [node_c]  # to build
        assert "ignored (the library's sha256 does not match)" in caplog.text
        assert unbuilt([node_c]) == [node_c]
        # Rebuilt there and shared again: the entry is good again (the old one replaced).
        rebuilt = _built(tmp_path, "c", b"\x7fELF node C's build")
        share([rebuilt], shared, DEFAULT_MAX_BYTES)
        assert unpack(rebuilt, shared.get(key) or b"") == b"\x7fELF node C's build"
        assert shared.get("0" * 64) is None  # never stored
    finally:
        verifier.stop()
        daemon.stop()


def test_the_bucket_is_the_daemon_role_s_to_make_and_no_user_s_to_write(
    private_nats: str, tmp_path: Path
) -> None:
    verifier = _bridge(private_nats, "verifier")
    try:
        shared = NatsExtensionStore(verifier, DEFAULT_MAX_BYTES)
        assert shared.get("k") is None  # no bucket yet: a miss, the check builds
        with pytest.raises(Exception, match=r"refused|timeout"):
            verifier.call(ensure_extension_bucket(verifier.buckets, 1), timeout=30)
    finally:
        verifier.stop()
    daemon = _bridge(private_nats, "daemon")
    try:
        assert daemon.call(ensure_extension_bucket(daemon.buckets, 1))
        info = daemon.call(daemon.log.jetstream.stream_info(subjects.EXTENSIONS_STREAM))
        assert info.config.num_replicas == 1  # the streams' (KF_REPLICAS)
    finally:
        daemon.stop()

    async def attempt(role: str) -> list[str]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            private_nats,
            error_cb=on_error,
            allow_reconnect=False,
            **role_auth(private_nats, role).options(),
        )
        try:
            await nc.publish(f"$O.{subjects.EXTENSIONS_BUCKET}.C.forged", b"\x7fELF")
            await nc.publish(f"$JS.API.STREAM.DELETE.{subjects.EXTENSIONS_STREAM}", b"")
            await nc.publish(f"$JS.API.STREAM.CREATE.{subjects.EXTENSIONS_STREAM}", b"{}")
            await nc.flush()
            await nc.flush()
        finally:
            await nc.close()
        return [e for e in errors if "permissions violation" in e]

    for role in ("publisher", "reader"):
        refused = asyncio.run(attempt(role))
        assert len(refused) == 3, (role, refused)
    refused = asyncio.run(attempt("verifier"))  # writes entries; deletes and creates nothing
    assert len(refused) == 2 and "$o." not in " ".join(refused).lower(), refused
    # The verifier role's whole round trip: put, replace, get.
    verifier = _bridge(private_nats, "verifier")
    try:
        shared = NatsExtensionStore(verifier, DEFAULT_MAX_BYTES)
        shared.put("k" * 64, b"first")
        shared.put("k" * 64, b"second")
        assert shared.get("k" * 64) == b"second"
        assert NatsExtensionStore(verifier, 3).get("k" * 64) is None  # over its limit
    finally:
        verifier.stop()


def test_a_verifier_actor_shares_its_extensions(private_nats: str) -> None:
    bridge = _bridge(private_nats, "verifier")
    try:
        config = with_shared_extensions(bridge, VerifierConfig())
        assert isinstance(config.shared_extensions, NatsExtensionStore)
        assert config == VerifierConfig()  # the store is no part of what a config compares
        off = VerifierConfig(extension_share_max_bytes=0)
        assert with_shared_extensions(bridge, off).shared_extensions is None
    finally:
        bridge.stop()


@needs_no_gpu
def test_devices_all_on_a_cpu_node_runs_cpu_verifiers_on_their_own_cores(
    private_nats: str, tmp_path: Path
) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    log = tmp_path / "daemon.log"
    daemon = start_daemon(
        private_nats, log, "--roles", "verifier", "--no-read-model",
        "--devices", "all", "--pool", "verifier=2",
    )  # fmt: skip
    try:
        wait_for_line(log, "daemon started")
        deadline = time.monotonic() + 60
        while (answer := health(private_nats, "--min-daemons", "1"))[0] != 0:
            assert time.monotonic() < deadline, answer
            time.sleep(0.2)
        (d,) = answer[1]["daemons"]
        assert d["pools"]["verifier"] == 2
        halves = split_cores(cores, 2)
        assert sorted(d["verifier"]) == sorted(f"cpu:{core_ranges(h)}" for h in halves)
        text = log.read_text()
        assert "--devices all: no GPU here: 2 CPU verifier(s)" in text
        assert f"created the shared extension store {subjects.EXTENSIONS_BUCKET}" in text
    finally:
        daemon.terminate()
        daemon.wait(60)


# --------------------------------------------------------------------------- one compile


def test_a_cluster_compiles_a_candidate_once_and_rebuilds_a_damaged_entry(
    private_nats: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two verifiers of two nodes (each its own disk cache) and the cluster's store: the
    first finds a damaged entry under the candidate's key, ignores it and builds (the one
    real compile of this module); the second builds nothing."""
    daemon, bridge = _bridge(private_nats, "daemon"), _bridge(private_nats, "verifier")
    jobs: list[dict[str, object]] = []
    real_run_job = engine._run_job

    def counted(job, *args, **kwargs):  # type: ignore[no-untyped-def]
        jobs.append(dict(job))
        return real_run_job(job, *args, **kwargs)

    monkeypatch.setattr(engine, "_run_job", counted)
    try:
        daemon.call(ensure_extension_bucket(daemon.buckets, 1))
        shared = NatsExtensionStore(bridge, DEFAULT_MAX_BYTES)
        node_a = VerifierConfig(
            extension_cache=str(tmp_path / "a"),
            trials=1,
            timing=False,
            timeout_s=240.0,
            shared_extensions=shared,
        )
        node_b = replace(node_a, extension_cache=str(tmp_path / "b"))
        (ext_a,) = planned_extensions(
            wanted_extensions(FUSED), tmp_path / "a", toolchain(node_a.python)
        )
        (ext_b,) = planned_extensions(
            wanted_extensions(FUSED), tmp_path / "b", toolchain(node_a.python)
        )
        key = ext_a.entry.name
        shared.put(key, pack(ext_a, b"\x7fELF a library of another build")[:-1] + b"!")

        with caplog.at_level(logging.INFO, "kernelflow.extensions"):
            first = verify(TASK, FUSED, backend="cpp", config=node_a)
        assert first.verdict == "pass", first.feedback
        assert [bool(job.get("build")) for job in jobs] == [True, False]  # built once
        assert jobs[0]["cores"] == sorted(os.sched_getaffinity(0))
        assert "ignored (the library's sha256 does not match)" in caplog.text
        built = ext_a.library.read_bytes()
        assert unpack(ext_a, shared.get(key) or b"") == built  # the damaged entry replaced

        jobs.clear()
        second = verify(TASK, FUSED, backend="cpp", config=node_b)
        assert second.verdict == "pass", second.feedback
        assert [bool(job.get("build")) for job in jobs] == [False]  # nothing compiled
        assert ext_b.library.read_bytes() == built
    finally:
        bridge.stop()
        daemon.stop()
