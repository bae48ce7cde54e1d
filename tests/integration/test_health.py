"""``kernelflow health`` against a real nats-server, with and without a daemon."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import Daemon, DaemonConfig
from kernelflow.actors.health_pings import HealthResponder, daemon_describer
from kernelflow.events.log import EventLog
from kernelflow.verification.engine import VerifierConfig, detect_device
from tests.conftest import as_user, connect, creds, is_keyed, role_auth, run_cli
from tests.daemons import start_daemon
from tests.fake_llm_servers import FakeOpenAI


def ensure_streams(url: str) -> None:
    """The streams, as the first daemon makes them (no other role may)."""

    async def go() -> None:
        nc = await connect(url, "daemon")
        try:
            await EventLog(nc).ensure_streams()
        finally:
            await nc.close()

    asyncio.run(go())


def health(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    """``kernelflow health --json`` as a reader (at a URL where no test server is: none)."""
    at = as_user("reader", url) if is_keyed(url) else ["--nats-url", url]
    result = run_cli("health", "--json", *at, "--wait", "0.3", *args)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def statuses(report: dict[str, Any], component: str) -> list[str]:
    return [c["status"] for c in report["checks"] if c["component"] == component]


def test_nothing_is_wrong_that_was_not_asked_for(bare_nats: str) -> None:
    # A server no daemon has used yet: its streams and daemons are absent, not faults.
    code, report = health(bare_nats)
    assert code == 0 and report["healthy"]
    assert statuses(report, "stream") == ["absent", "absent"]
    assert statuses(report, "daemons") == ["absent"]
    assert "none required" in report["checked"]

    ensure_streams(bare_nats)
    code, report = health(bare_nats)
    assert code == 0 and report["daemons"] == []
    assert statuses(report, "nats") == ["ok"] and statuses(report, "stream") == ["ok", "ok"]
    assert report["nats"]["jetstream"] is True
    assert report["streams"]["KF_EVENTS"]["subjects"] == ["kf.ev.>"]
    assert report["streams"]["KF_CMD"]["retention"] == "workqueue"

    # Asked for, a daemon that does not answer is a fault.
    code, report = health(bare_nats, "--min-daemons", "1")
    assert code == 1 and statuses(report, "daemons") == ["fail"]

    code, report = health("nats://127.0.0.1:9", "--no-daemons")
    assert code == 1 and statuses(report, "nats") == ["fail"]

    code, report = health(bare_nats, "--no-daemons", "--llm", "nonsense:x")
    (llm,) = [c for c in report["checks"] if c["component"] == "llm"]
    assert code == 1 and llm["status"] == "fail" and "unknown LLM provider" in llm["detail"]

    bad = run_cli("health", *as_user("reader", bare_nats), "--wait", "0")
    assert bad.returncode == 2 and "--wait" in bad.stderr


def test_health_llm_sends_the_endpoint_a_one_token_request(bare_nats: str) -> None:
    with FakeOpenAI(model="qwen2.5-coder:7b", server="ollama") as server:
        spec = f"openai:{server.url}/v1#qwen2.5-coder:7b"
        code, report = health(bare_nats, "--no-daemons", "--llm", spec)
        sent = server.completions
    (endpoint,) = [c for c in report["checks"] if c["name"] == "endpoint"]
    assert code == 0 and endpoint["status"] == "ok"
    assert "a one-token completion in" in endpoint["detail"]
    assert "token ids: no, log-probabilities: yes" in endpoint["detail"]  # docs/llm.md
    assert [body["max_tokens"] for body in sent] == [1]

    code, report = health(bare_nats, "--no-daemons", "--llm", "openai:http://127.0.0.1:9/v1#m")
    (endpoint,) = [c for c in report["checks"] if c["name"] == "endpoint"]
    assert code == 1 and endpoint["status"] == "fail"
    assert "nothing answers at http://127.0.0.1:9/v1 (connection refused)" in endpoint["detail"]


def test_the_text_report_fits_the_terminal_and_says_what_it_checked(bare_nats: str) -> None:
    text = run_cli("health", *as_user("reader", bare_nats), "--wait", "0.3")
    lines = text.stdout.splitlines()
    assert text.returncode == 0 and lines[-1] == "healthy"
    assert lines[0].startswith("checked: NATS at nats://127.0.0.1:")
    assert max(map(len, lines)) <= 100  # the width when the output is no terminal
    # No GPU here: its backends are absent, not OK (a GPU machine: OK, on it).
    cuda = next(line for line in lines if line.startswith("backend    cuda"))
    assert (" ABSENT " in cuda) == (detect_device() != "cuda")


def test_healthy_with_a_daemon(private_nats: str, tmp_path: Path) -> None:
    # Credentials in the URL (this server wants its keys: they go along unused) are never
    # shown nor reported.
    with_credentials = private_nats.replace("nats://", "nats://kf:hunter2@")
    log = tmp_path / "daemon.log"
    key = str(creds(private_nats, "daemon"))
    daemon = start_daemon(with_credentials, log, "--creds", key, "--pool", "coder=2")
    try:
        deadline = time.monotonic() + 90
        while True:  # until its verifier has readied its sandbox (~10 s of imports)
            code, report = health(private_nats, "--llm", "scripted:examples/scripted/relu.yaml")
            if statuses(report, "verifier") == ["ok"] or time.monotonic() > deadline:
                break
            assert statuses(report, "verifier") in ([], ["warn"]), report
        assert code == 0, report
        (d,) = report["daemons"]
        assert d["verifier"]["any"]["state"] == "ready"
        assert "warm process up" in d["verifier"]["any"]["detail"]
        assert d["pid"] == daemon.pid and d["uptime_s"] >= 0
        assert d["nats_url"] == private_nats
        assert f"kernelflow daemon on {private_nats}: roles" in log.read_text()
        assert "hunter2" not in log.read_text()
        assert d["roles"] == ["conductor", "designer", "coder", "verifier"]
        assert d["pools"] == {"conductor": 16, "designer": 4, "coder": 2, "verifier": 1}
        assert d["llm"]["provider"] == "scripted"
        assert set(d["llm"]["agents"]) == {"conductor", "designer", "coder"}
        assert d["read_model"]["position"] >= 0
        assert statuses(report, "daemon") == ["ok"]
        llm = {c["name"]: c for c in report["checks"] if c["component"] == "llm"}
        assert {"conductor", "designer", "coder"} <= set(llm)
        assert all(c["status"] == "ok" for c in llm.values())
        assert report["tools"]["available"] in (True, False)  # the registry is optional

        code, report = health(private_nats, "--min-daemons", "2")
        assert code == 1 and statuses(report, "daemons") == ["fail"]

        # No LLM set here, and the daemon has its own: nothing is missing.
        code, report = health(private_nats)
        (llm_row,) = [c for c in report["checks"] if c["component"] == "llm"]
        assert code == 0 and llm_row["status"] == "ok"
        assert (
            llm_row["detail"]
            == "none set here; the daemons use scripted:examples/scripted/relu.yaml"
        )

        text = run_cli("health", *as_user("reader", private_nats), "--wait", "0.3")
        assert text.returncode == 0, text.stdout
        assert "healthy" in text.stdout.splitlines()[-1] and d["daemon_id"] in text.stdout
    finally:
        daemon.kill()
        daemon.wait(30)


def test_a_verifier_that_cannot_ready_its_sandbox_makes_the_daemon_unhealthy(
    private_nats: str, tmp_path: Path
) -> None:
    """A verifier whose python lacks torch (a daemon installed without the verifier
    extra) says so in health as soon as it starts, not at its first candidate."""
    no_torch = tmp_path / "python-without-torch"
    no_torch.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n"
    )
    no_torch.chmod(0o755)
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    config = DaemonConfig(roles=("verifier",), verifier=VerifierConfig(python=str(no_torch)))
    daemon = Daemon(bridge, config).start()
    describe = daemon_describer(
        "no-torch", private_nats, config.roles, {}, None, None, daemon.warm_ups
    )
    responder = HealthResponder(bridge, describe).start()
    try:
        deadline = time.monotonic() + 60
        while (state := daemon.warm_ups.describe()["any"]["state"]) == "warming up":
            assert time.monotonic() < deadline, "the warm-up never ended"
            time.sleep(0.1)
        assert state == "failed"
        code, report = health(private_nats, "--llm", "scripted:examples/scripted/relu.yaml")
        assert code == 1
        (row,) = [c for c in report["checks"] if c["component"] == "verifier"]
        assert row["status"] == "fail" and row["name"] == "no-torch device any"
        assert "No module named 'torch'" in row["detail"]
    finally:
        responder.stop()
        daemon.stop()
        bridge.stop()
