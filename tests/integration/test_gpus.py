"""``--gpus``: the verifier pool owns the listed CUDA devices, one verifier actor each, and
a device that is not there is reported (at start-up, and as an 'unsupported' verdict),
never silently replaced by another one or by the CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from kernelflow.actors.daemon import DaemonConfig
from kernelflow.events.model import SubmitTask, VerificationCompleted
from kernelflow.host.settings import Settings, SettingsError, parse_gpus
from kernelflow.verification.engine import VerifierConfig, detect_device
from tests.conftest import REPO, as_user, cli_env, run_cli
from tests.daemons import publish, start_daemon, wait_for
from tests.integration.test_health import health
from tests.integration.test_workflow_runs import RELU, good_relu_kernel

needs_no_gpu = pytest.mark.skipif(
    detect_device() == "cuda", reason="asserts what a machine without a CUDA GPU reports"
)


def test_one_verifier_per_gpu_each_owning_its_device() -> None:
    config = DaemonConfig(gpus=("0", "GPU-5f1c"), verifier=VerifierConfig(timeout_s=7))
    assert config.pool_size("verifier") == 2
    owned = config.verifier_configs()
    assert [(c.gpu, c.device, c.timeout_s) for c in owned] == [
        ("0", "cuda", 7),
        ("GPU-5f1c", "cuda", 7),
    ]
    plain = DaemonConfig(pool_sizes={"verifier": 3})
    assert [c.gpu for c in plain.verifier_configs()] == [None, None, None]


def test_gpu_lists_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_gpus(" 0, 1 ", "--gpus") == ("0", "1")
    with pytest.raises(SettingsError, match="--gpus='0,,1'"):
        parse_gpus("0,,1", "--gpus")
    with pytest.raises(SettingsError, match="named twice"):
        parse_gpus("1,1", "--gpus")
    monkeypatch.setenv("KF_GPUS", "2,3")
    assert Settings().gpus == ("2", "3")
    monkeypatch.setenv("KF_GPUS", "2,")
    with pytest.raises(SettingsError, match="KF_GPUS"):
        Settings()

    twice = run_cli("run", RELU, "--workflow", "verifier_only", "--gpus", "0,0")
    assert twice.returncode == 2 and "named twice" in twice.stderr
    both = run_cli(
        "daemon", "--nats-url", "nats://127.0.0.1:9", "--gpus", "0", "--pool", "verifier=2"
    )
    assert both.returncode == 2 and "drop --pool verifier=N" in both.stderr


@needs_no_gpu
def test_daemon_on_missing_gpus_says_so_and_never_passes(private_nats: str, tmp_path: Path) -> None:
    log = tmp_path / "daemon.log"
    daemon = start_daemon(private_nats, log, "--gpus", "0,1")
    try:
        deadline = time.monotonic() + 60
        while (answer := health(private_nats, "--min-daemons", "1"))[
            0
        ] != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert answer[0] == 0, answer[1]
        (d,) = answer[1]["daemons"]
        assert d["pools"]["verifier"] == 2
        text = log.read_text()
        assert "CUDA device 0 is not visible" in text and "CUDA device 1 is not visible" in text

        candidate = tmp_path / "kernel.py"
        candidate.write_text(good_relu_kernel())
        refused = run_cli(
            "submit", RELU, "--workflow", "verifier_only", "--candidate", str(candidate),
            *as_user("publisher", private_nats),
        )  # fmt: skip
        assert refused.returncode == 2  # no verifier up can check it: said before publishing
        assert "no running verifier offers backend 'triton' (offered: none)" in refused.stderr
        command = SubmitTask(
            task_id="gpu-task",
            task_source=(REPO / RELU).read_text(),
            workflow_name="verifier_only",
            candidate_code=good_relu_kernel(),
        )
        publish(private_nats, command)  # a program of one's own checks nothing
        events = wait_for(
            private_nats,
            "gpu-task",
            lambda ev: any(isinstance(e, VerificationCompleted) for e in ev),
            120,
        )
        (verdict,) = [e for e in events if isinstance(e, VerificationCompleted)]
        assert verdict.report.verdict == "unsupported"
        assert "is not visible" in verdict.report.summary
    finally:
        daemon.kill()
        daemon.wait(30)


@needs_no_gpu
def test_run_with_gpus_reports_unsupported(nats_url: str, tmp_path: Path) -> None:
    candidate = tmp_path / "kernel.py"
    candidate.write_text(good_relu_kernel())
    run = run_cli(
        "run",
        RELU,
        "--workflow",
        "verifier_only",
        "--candidate",
        str(candidate),
        "--gpus",
        "0",
        "--json",
        *as_user("daemon", nats_url),
        "--out",
        str(tmp_path / "out"),
        env=cli_env(),
    )
    result = json.loads(run.stdout)
    assert result["status"] != "success" and run.returncode != 0
    assert "CUDA device 0 is not visible" in run.stderr
