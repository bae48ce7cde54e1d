"""``kernelflow serve-rewards`` (docs/verl.md, "Rewards over HTTP"): the real command as a
subprocess, against a real NATS and a real daemon (one for the module: a conductor and a
verifier), asked over HTTP as OpenRLHF and a program of one's own ask. Both shapes score a
correct Triton ReLU 1 and a cheat 0, and a response asked again (in either shape) is
answered from the log; the token is required; bad input gets a 400 line; SIGTERM stops
the server, a request in flight included; a stopped pool gets a 503 saying why. The
page's examples run as printed (the server's address put in)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import pytest

from kernelflow.events.model import VerificationCompleted
from tests.conftest import (
    EXAMPLES,
    KERNELFLOW,
    REPO,
    as_user,
    cli_env,
    creds,
    keyed_nats,
    run_cli,
)
from tests.daemons import start_daemon, task_events, wait_for_line

pytest.importorskip("uvicorn")

TOKEN = "kf-rewards-token-0123456789abcdef"
TASK = (EXAMPLES / "tasks" / "relu.py").read_text()
GOOD = (EXAMPLES / "candidates" / "solutions" / "relu.py").read_text()
CHEAT = (EXAMPLES / "candidates" / "cheats" / "torch_compute.py").read_text()
PAGE = (REPO / "docs" / "verl.md").read_text()
PROMPT = "<|user|>Write a Triton kernel for this model.<|assistant|>"


def fenced(code: str) -> str:
    return f"Here it is.\n```python\n{code}```\n"


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    first_line: str
    stderr: Path
    printed: list[str] = field(default_factory=list)

    def stop(self) -> float:
        """SIGTERM, as a supervisor stops it: the seconds it took to exit (with 0)."""
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        took = time.monotonic() - started
        assert self.proc.returncode == 0, self.stderr.read_text()
        self.printed.append(self.first_line + out + self.stderr.read_text())
        return took


@contextlib.contextmanager
def serving(url: str, tmp: Path, *args: str) -> Iterator[Server]:
    """``kernelflow serve-rewards`` on a free port with the publisher's key; stopped with
    SIGTERM after the block unless the block stopped it."""
    errors = tmp / f"serve-{time.monotonic_ns()}.err"
    with errors.open("w") as err:
        proc = subprocess.Popen(
            [*KERNELFLOW, "serve-rewards", "--port", "0", *as_user("publisher", url), *args],
            cwd=REPO,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("kernelflow serve-rewards: http://"), line + errors.read_text()
    server = Server(line.split()[2].rstrip("/"), proc, line, errors)
    try:
        yield server
    finally:
        if proc.poll() is None:
            server.stop()


def ask(
    base: str, method: str, path: str, body: Any = None, token: str | None = TOKEN
) -> tuple[int, Any, str]:
    """Status, decoded JSON and raw text of one request."""
    address = urlsplit(base)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=240)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    connection.request(method, path, body=data, headers=headers)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, json.loads(text) if text.startswith(("{", "[")) else None, text


@dataclass
class Pool:
    nats_url: str
    daemon: subprocess.Popen[bytes]
    server: Server
    tmp: Path


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """One NATS, one daemon (conductor, verifier) and one server asking for TOKEN, with
    trials=1, for the whole module."""
    tmp = tmp_path_factory.mktemp("serve-rewards")
    token_file = tmp / "rewards.token"
    token_file.write_text(TOKEN + "\n")
    with keyed_nats(tmp / "nats") as url:
        log = tmp / "daemon.log"
        daemon = start_daemon(url, log, "--roles", "conductor,verifier")
        try:
            wait_for_line(log, "daemon started")
            with serving(url, tmp, "--token-file", str(token_file), "--trials", "1") as server:
                yield Pool(url, daemon, server, tmp)
            assert all(TOKEN not in printed for printed in server.printed)
        finally:
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGINT)
                daemon.wait(timeout=60)


def verifications(url: str, task_id: str) -> int:
    return sum(isinstance(e, VerificationCompleted) for e in task_events(url, task_id))


# --------------------------------------------------------------------------- the shapes


def test_both_shapes_score_a_correct_kernel_1_and_a_cheat_0(pool: Pool) -> None:
    base = pool.server.url
    status, good, text = ask(base, "POST", "/v1/reward", {"task": TASK, "response": fenced(GOOD)})
    assert status == 200, text
    assert (good["reward"], good["verdict"], good["correct"]) == (1.0, "pass", True)
    assert good["task_id"].startswith("rw-") and good["reward_fn"] == "binary@1"
    assert not good["from_log"]
    status, cheat, text = ask(base, "POST", "/v1/reward", {"task": TASK, "code": CHEAT})
    assert status == 200, text
    assert (cheat["reward"], cheat["verdict"], cheat["correct"]) == (0.0, "rejected_static", False)

    # OpenRLHF's shape: the same responses, inside prompt + response, are the same tasks.
    body = {
        "query": [PROMPT + fenced(GOOD), PROMPT + fenced(CHEAT), PROMPT + "I cannot."],
        "prompts": [PROMPT] * 3,
        "labels": [TASK] * 3,
    }
    status, answer, text = ask(base, "POST", "/get_reward", body)
    assert status == 200, text
    assert answer == {
        "rewards": [1.0, 0.0, 0.0],
        "scores": [1.0, 0.0, 0.0],
        "extra_logs": {"correct": [1.0, 0.0, 0.0], "from_log": [1.0, 1.0, 0.0]},
    }
    # A list, with a reward function of its own: judged again only where it differs.
    many = [
        {"task": TASK, "response": fenced(GOOD), "reward": "cheat_penalty"},
        {"task": TASK, "code": CHEAT, "reward": "cheat_penalty"},
    ]
    status, answers, text = ask(base, "POST", "/v1/rewards", many)
    assert status == 200, text
    assert [(a["reward"], a["reward_fn"]) for a in answers] == [
        (1.0, "cheat_penalty@1"),
        (-1.0, "cheat_penalty@1"),
    ]
    # Every request was a task in the log, each verified once.
    assert verifications(pool.nats_url, good["task_id"]) == 1
    assert verifications(pool.nats_url, cheat["task_id"]) == 1


def test_the_token_is_required(pool: Pool) -> None:
    base = pool.server.url
    assert "send Authorization: Bearer" in pool.server.first_line
    assert TOKEN not in pool.server.first_line
    body = {"task": TASK, "code": GOOD}
    for token in (None, TOKEN[:-1], TOKEN + "x"):
        status, answer, text = ask(base, "POST", "/v1/reward", body, token=token)
        assert status == 401, text
        assert "needs its token" in answer["error"] and text.count("\n") == 0
    status, answer, _ = ask(base, "POST", "/get_reward", {"query": []}, token=None)
    assert status == 401
    # The dashboard's ways of showing it are not this server's.
    status, _, _ = ask(base, "POST", f"/v1/reward?token={TOKEN}", body, token=None)
    assert status == 401
    status, health, text = ask(base, "GET", "/healthz", token=None)  # probes need no token
    assert status == 200, text
    assert health["ok"] is True and health["daemons"] == 1 and "triton" in health["backends"]


@pytest.mark.parametrize(
    ("path", "body", "said"),
    [
        ("/v1/reward", b"{not json", "the body is not JSON"),
        ("/v1/reward", {"response": "x"}, "missing field 'task'"),
        ("/v1/reward", {"task": TASK}, "send response (text to read the code from) or code"),
        ("/v1/reward", {"task": TASK, "respons": "x"}, "did you mean 'response'?"),
        ("/v1/reward", {"task": TASK, "code": GOOD, "backend": "tritton"}, "backend 'tritton'"),
        ("/v1/reward", {"task": TASK, "code": GOOD, "policy": "lax"}, "unknown verifier policy"),
        ("/v1/reward", {"task": TASK, "code": GOOD, "reward": "speed"}, "unknown reward"),
        ("/v1/reward", {"task": TASK, "code": GOOD, "reward": "exact_match"}, "not score kernels"),
        ("/v1/reward", {"task": TASK, "code": GOOD, "trials": 0}, "trials 0: expected 1 to 100"),
        ("/v1/reward", {"task": TASK, "code": GOOD, "timeout_s": "9"}, "must be a number"),
        ("/v1/rewards", {"task": TASK}, "expected a JSON list"),
        ("/v1/rewards", [{"task": TASK, "code": 3}], "request[0]: code must be a string"),
        ("/get_reward", {"query": ["x"], "prompts": ["p"]}, "missing field 'labels'"),
        ("/get_reward", {"query": ["x"], "labels": [TASK, TASK]}, "labels: 2 items for 1"),
        ("/get_reward", {"query": "x"}, "query: expected a list of strings"),
    ],
)
def test_bad_input_gets_a_400_line(pool: Pool, path: str, body: Any, said: str) -> None:
    status, answer, text = ask(pool.server.url, "POST", path, body)
    assert status == 400, text
    assert said in answer["error"], answer
    assert text.count("\n") == 0 and "Traceback" not in text and list(answer) == ["error"]


def test_unknown_paths_and_methods_are_json_too(pool: Pool) -> None:
    assert ask(pool.server.url, "GET", "/v1/reward")[:2] == (405, {"error": "Method Not Allowed"})
    assert ask(pool.server.url, "GET", "/nothing")[:2] == (404, {"error": "Not Found"})


def test_serving_beyond_this_machine_without_a_token_is_said(pool: Pool) -> None:
    with serving(pool.nats_url, pool.tmp, "--host", "0.0.0.0") as everywhere:
        pass
    said = "".join(everywhere.printed)
    assert "warning: no --token-file: whoever reaches" in said, said


def test_usage_errors_are_one_line_before_anything_starts(pool: Pool) -> None:
    short = pool.tmp / "short.token"
    short.write_text("abc\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for args, said in (
            (["--backend", "tritton"], "backend 'tritton' is not one of"),
            (["--reward", "exact_match"], "does not score kernels"),
            (["--trials", "0"], "--trials 0: expected 1 to 100"),
            (["--token-file", str(short)], "at least 16 characters"),
            (["--port", port], f"cannot listen on 127.0.0.1:{port}"),
        ):
            result = run_cli("serve-rewards", *as_user("publisher", pool.nats_url), *args)
            assert result.returncode == 2, result.stderr
            assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
    by_env = run_cli(
        "serve-rewards", "--port", "0", *as_user("publisher", pool.nats_url),
        env=cli_env(KF_REWARDS_TOKEN_FILE=str(short)),
    )  # fmt: skip
    assert by_env.returncode == 2 and "at least 16 characters" in by_env.stderr


# --------------------------------------------------------------------------- the page


def section(title: str) -> str:
    return PAGE.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def block(text: str, lang: str, n: int = 0) -> str:
    return text.split(f"```{lang}\n")[n + 1].split("```", 1)[0]


def test_the_pages_http_example_runs_as_printed(pool: Pool) -> None:
    """docs/verl.md, "Rewards over HTTP": its Python client, from the repository's root,
    with the token file it names; the server's address put in for the default one."""
    example = block(section("Rewards over HTTP"), "python")
    assert "http://127.0.0.1:8787" in example
    example = example.replace("http://127.0.0.1:8787", pool.server.url)
    here = pool.tmp / "client"  # a dir with the token file and the repository's examples
    here.mkdir()
    (here / "rewards.token").write_text(TOKEN + "\n")
    (here / "examples").symlink_to(EXAMPLES)
    run = subprocess.run(
        [sys.executable, "-c", example], cwd=here, env=cli_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1])["reward"] == 1.0


def test_the_pages_verl_config_loads_and_scores_on_the_pool(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/verl.md, "Rewards from the verifier pool": its verl config, loaded by verl's
    own loader, awaits the pool (the environment the page names pointing at it)."""
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from kernelflow.rewards import shared_client

    config = OmegaConf.create(block(section("Rewards from the verifier pool"), "yaml"))
    score = get_custom_reward_fn(config)
    assert score is not None
    monkeypatch.setenv("KF_NATS_URL", pool.nats_url)
    monkeypatch.setenv("KF_NATS_CREDS", str(creds(pool.nats_url, "publisher")))
    try:
        result = asyncio.run(score("kernelflow/triton", fenced(GOOD), TASK, None))
    finally:
        shared_client().close()
    assert (result["score"], result["verdict"]) == (1.0, "pass")


def test_the_pages_slime_function_awaits_the_pool(
    pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/verl.md, "slime": the reward function as printed, called as slime's
    ``async_rm`` calls it (``await fn(args, sample)``)."""
    from kernelflow.rewards import shared_client

    namespace: dict[str, Any] = {}
    exec(block(section("slime"), "python"), namespace)
    fn = next(v for k, v in namespace.items() if k.endswith("_rm") and callable(v))
    monkeypatch.setenv("KF_NATS_URL", pool.nats_url)
    monkeypatch.setenv("KF_NATS_CREDS", str(creds(pool.nats_url, "publisher")))
    args = SimpleNamespace()
    samples = [
        SimpleNamespace(prompt=PROMPT, response=fenced(c), label=TASK, metadata={})
        for c in (GOOD, CHEAT)
    ]

    async def group() -> list[float]:
        return list(await asyncio.gather(*(fn(args, s) for s in samples)))

    try:
        rewards = asyncio.run(group())
    finally:
        shared_client().close()
    assert rewards == [1.0, 0.0]


def test_the_pages_openrlhf_label_column_is_the_ground_truth(tmp_path: Path) -> None:
    """docs/verl.md, "OpenRLHF": its column copy, run on an export's shape of row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {
        "data_source": "kernelflow/triton",
        "prompt": [{"role": "user", "content": "Write a kernel."}],
        "ability": "kernel_generation",
        "reward_model": {"style": "rule", "ground_truth": TASK},
        "extra_info": {"index": 0},
    }
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "prompts.parquet")
    example = block(section("OpenRLHF"), "python")
    run = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    table = pq.read_table(tmp_path / "openrlhf.parquet")
    assert table.column("ground_truth").to_pylist() == [TASK]


# --------------------------------------------------------------------------- stopping


def test_sigterm_stops_the_server_with_a_request_in_flight(pool: Pool) -> None:
    """A second server: a request that takes a while (a kernel that spins until its
    time limit) is in flight when SIGTERM comes; the server is gone within seconds, and
    the verification goes on in the daemon."""
    spin = GOOD.replace(
        "        x = x.contiguous()\n",
        "        spin = 0\n"
        "        while spin < 10**9:\n"
        "            spin += 1\n"
        "        x = x.contiguous()\n",
    )
    token_file = pool.tmp / "rewards.token"
    token_file.write_text(TOKEN + "\n")
    with serving(pool.nats_url, pool.tmp, "--token-file", str(token_file)) as server:
        answers: list[Any] = []

        def slow() -> None:
            body = {"task": TASK, "code": spin, "trials": 1, "timeout_s": 8}
            try:
                answers.append(ask(server.url, "POST", "/v1/reward", body))
            except (OSError, http.client.HTTPException) as exc:
                answers.append(exc)

        asking = threading.Thread(target=slow)
        asking.start()
        time.sleep(2)  # asked and waiting for the verifier
        assert not answers
        took = server.stop()
        asking.join(timeout=30)
    # Seconds at most: a graceful second for the request, then the process ends (what
    # load on a shared machine adds is allowed for).
    assert took < 10, took
    assert answers and (not isinstance(answers[0], tuple) or answers[0][0] >= 500), answers


def test_a_stopped_pool_gets_a_503_with_the_reason(pool: Pool) -> None:
    os.killpg(pool.daemon.pid, signal.SIGINT)
    pool.daemon.wait(timeout=60)
    base = pool.server.url
    # Backend cpp was not asked for yet: the client asks who runs before submitting.
    status, answer, text = ask(
        base, "POST", "/v1/reward", {"task": TASK, "code": GOOD, "backend": "cpp"}
    )
    assert status == 503, text
    assert answer["error"].startswith("no kernelflow daemon answers on nats://"), answer
    assert text.count("\n") == 0
    status, health, _ = ask(base, "GET", "/healthz", token=None)
    assert status == 503 and health["ok"] is False
    assert health["error"].startswith("no kernelflow daemon answers"), health
