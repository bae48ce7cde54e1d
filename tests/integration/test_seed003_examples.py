"""Seed 003's deployment, run as its users run it (issue 52, part B): the §6.4 server as a
process of its own, and verl's registry seeing the rollout ``agentic`` in a fresh
interpreter that imports only verl (the §9.1 example: tests/unit/test_seed003_port_b.py)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import EXAMPLES, REPO, cli_env

SCRIPTED = EXAMPLES / "scripted" / "arithmetic_react.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http(port: int, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_6_4_server_runs_trajectories_reports_and_keeps_its_log(tmp_path: Path) -> None:
    port = free_port()
    env = cli_env(
        KF_LLM=f"scripted:{SCRIPTED}", AGENTIC_SAVE_TRAJECTORIES="true", PYTHONPATH=str(REPO)
    )
    script = EXAMPLES / "agentic_rollout" / "server.py"
    server = subprocess.Popen(
        [sys.executable, str(script), "--host", "127.0.0.1", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, health = http(port, "/health")
                break
            except (ConnectionError, urllib.error.URLError):
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.2)
        assert status == 200 and health["overall"] == "healthy", health
        question = {"content": "What is 6 times 7?", "request_id": "q-0", "ground_truth": "42"}
        status, answer = http(port, "/trajectories", question)
        assert status == 200, answer
        assert (answer["final_response"], answer["final_reward"]) == ("42", 1.0)
        assert answer["trajectory"]["steps"][0]["content"] == "What is 6 times 7?"
        status, refused = http(port, "/trajectories", {"question": "?"})
        assert status == 400 and "content" in refused["error"]
        status, report = http(port, "/metrics")
        assert report["runs"] == 1 and report["metrics"]["completion_rate"] == 1.0
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output
    [log] = (tmp_path / "logs").glob("events-*.jsonl")
    assert '"reward_assigned"' in log.read_text()
    assert len(list((tmp_path / "trajectories").glob("trajectories-*.jsonl"))) == 1


def test_the_6_4_server_says_what_is_missing_in_one_line(tmp_path: Path) -> None:
    env = cli_env(KF_LLM="scripted:missing.yaml", PYTHONPATH=str(REPO))
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / "agentic_rollout" / "server.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert run.stderr.startswith("server: missing.yaml: cannot read scripted responses")
    assert "Traceback" not in run.stderr


def test_verl_finds_the_rollout_agentic_with_nothing_but_verl_imported() -> None:
    pytest.importorskip("verl")
    code = (
        "import sys, verl\n"
        "from verl.workers.rollout.base import get_rollout_class\n"
        "print(get_rollout_class('agentic').__name__)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        cwd="/",
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "AgenticVerlRollout"
