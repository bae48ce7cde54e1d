"""Rewards from the verifier pool (kernelflow.rewards, issue 47): a trainer's client asks
the daemons' verifiers over NATS, as the publisher's key allows, and awaits the verdict.
Against a real server that asks for keys (as the embedded default does) and real daemon
processes; verl's own reward manager scores a batch through ``compute_score_async``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from kernelflow.events.model import TaskSubmitted, VerificationCompleted
from kernelflow.host.settings import Settings
from kernelflow.rewards import (
    NoVerifierPool,
    RewardAnswer,
    RewardClient,
    RewardRequest,
    RewardTimeout,
    close_shared_clients,
)
from kernelflow.rewards.request import REQUEST_KIND
from tests.conftest import EXAMPLES, KERNELFLOW, REPO, cli_env, creds, keyed_nats
from tests.daemons import start_daemon, task_events, wait_for, wait_for_line
from tests.sandbox.test_verl_reward import KERNEL_INFO, batch, fenced
from tests.verl_tokenizer import tiny_tokenizer

TASK = (EXAMPLES / "tasks" / "relu.py").read_text()
GOOD = (EXAMPLES / "candidates" / "solutions" / "relu.py").read_text()
CHEAT = (EXAMPLES / "candidates" / "cheats" / "torch_compute.py").read_text()
# The correct kernel after a loop that never ends, or an allocation no sandbox holds.
HANG = GOOD.replace("        x = x.contiguous()\n", "        while True:\n            x = x + 0\n")
MEMORY = GOOD.replace(
    "        x = x.contiguous()\n",
    "        x = x.contiguous()\n        hog = torch.ones(64 * 1024**3, dtype=torch.uint8)\n",
)
WRONG = GOOD.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 1.0)")
FLOOD = GOOD.replace(
    "    def forward(self, x",
    "    def forward(self, x, *rest):\n        for _ in range(20000):\n"
    '            print("flood " * 200)\n        return self.relu(x)\n\n'
    "    def relu(self, x",
    1,
)


def client_for(url: str, **options: Any) -> RewardClient:
    """A trainer's client: the publisher's key of the test server."""
    return RewardClient(Settings(nats_url=url, nats_creds=creds(url, "publisher")), **options)


def request(code: str, **options: Any) -> RewardRequest:
    return RewardRequest(task_source=TASK, code=code, trials=1, **options)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of the module's own, and a daemon with a conductor and a verifier."""
    tmp = tmp_path_factory.mktemp("rewards")
    with keyed_nats(tmp / "nats") as url:
        log = tmp / "daemon.log"
        daemon = start_daemon(url, log, "--roles", "conductor,verifier")
        try:
            wait_for_line(log, "verifier warm-up done", 120)
            yield url
        finally:
            os.killpg(daemon.pid, signal.SIGTERM)
            daemon.wait(60)


def test_rewards_come_from_the_pool_recorded_once_and_then_from_the_log(pool: str) -> None:
    requests = [request(GOOD), request(CHEAT), request(WRONG), request(GOOD, reward_fn="speedup")]
    with client_for(pool, requester="trainer-7") as client:
        answers = asyncio.run(client.score_many(requests))
        assert [(a.verdict, a.score) for a in answers] == [
            ("pass", 1.0),
            ("rejected_static", 0.0),
            ("mismatch", 0.0),
            ("pass", 1.0),  # speedup@2 credits an untimed pass (Triton on the CPU) parity
        ]
        assert [a.from_log for a in answers] == [False] * 4
        assert answers[3].reward_fn == "speedup@2"
        again = asyncio.run(client.score_many(requests[:2]))
    assert [(a.task_id, a.score, a.from_log) for a in again] == [
        (a.task_id, a.score, True) for a in answers[:2]
    ]
    # Each is a task of the log: who asked, one verification.
    for answer in answers:
        events = task_events(pool, answer.task_id)
        submitted = [e for e in events if isinstance(e, TaskSubmitted)]
        assert len(submitted) == 1
        assert submitted[0].metadata == {"kind": REQUEST_KIND, "requested_by": "trainer-7"}
        assert submitted[0].workflow_name == "verifier_only"
        assert sum(isinstance(e, VerificationCompleted) for e in events) == 1


def test_two_clients_asking_the_same_get_one_verification(pool: str) -> None:
    same = request(GOOD, policy="kernelbench")

    async def both() -> list[RewardAnswer]:
        first, second = client_for(pool), client_for(pool)
        try:
            return list(await asyncio.gather(first.score(same), second.score(same)))
        finally:
            first.close()
            second.close()

    answers = asyncio.run(both())
    assert {(a.task_id, a.verdict) for a in answers} == {(same.task_id(), "pass")}
    events = task_events(pool, same.task_id())
    assert sum(isinstance(e, VerificationCompleted) for e in events) == 1


def test_at_most_max_in_flight_requests_are_asked_at_once(pool: str) -> None:
    requests = [request(GOOD, timeout_s=60.0 + i) for i in range(3)]  # three new tasks
    with client_for(pool, max_in_flight=1) as client:
        answers = asyncio.run(client.score_many(requests))
    assert {a.verdict for a in answers} == {"pass"}
    spans = []
    for answer in answers:
        events = task_events(pool, answer.task_id)
        spans.append((events[0].at, events[-1].at))
    spans.sort()
    # One at a time: each was submitted after the one before it had its reward.
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def test_candidates_that_hang_crash_or_flood_get_their_own_verdicts(pool: str) -> None:
    hostile = [request(HANG, timeout_s=15.0), request(MEMORY, timeout_s=60.0), request(FLOOD)]
    with client_for(pool) as client:
        answers = asyncio.run(client.score_many([*hostile, request(GOOD, timeout_s=61.0)]))
    assert answers[0].verdict == "timeout" and answers[0].score == 0.0
    assert answers[1].verdict == "runtime_error" and answers[1].score == 0.0
    assert answers[2].verdict  # whatever the flood earned, it was judged on its own
    assert answers[3].verdict == "pass" and answers[3].score == 1.0


def test_a_deadline_passed_is_one_clear_error(pool: str) -> None:
    with client_for(pool, deadline_s=0.05) as client, pytest.raises(RewardTimeout) as caught:
        client.score_sync(request(HANG, timeout_s=5.0))
    assert "no reward for task rw-" in str(caught.value)
    assert "within 0.05s" in str(caught.value)


def test_without_a_pool_for_the_request_it_says_so_at_once(tmp_path: Path) -> None:
    with keyed_nats(tmp_path / "nats") as url:
        with client_for(url) as client, pytest.raises(NoVerifierPool, match="no kernelflow daemon"):
            client.score_sync(request(GOOD))
        log = tmp_path / "verifier.log"
        daemon = start_daemon(url, log, "--roles", "verifier", "--no-read-model")
        try:
            wait_for_line(log, "verifier warm-up done", 120)
            refused = pytest.raises(NoVerifierPool, match="hosts a conductor")
            with client_for(url) as client, refused:
                client.score_sync(request(GOOD))
        finally:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(30)


def test_a_backend_no_verifier_offers_is_refused_at_once(pool: str) -> None:
    cuda = (EXAMPLES / "candidates" / "cuda" / "relu.py").read_text()
    with client_for(pool) as client, pytest.raises(NoVerifierPool) as caught:
        client.score_sync(RewardRequest(task_source=TASK, code=cuda, backend="cuda"))
    assert "no verifier on" in str(caught.value) and "'cuda'" in str(caught.value)


def test_a_verifier_killed_mid_check_is_replaced_and_the_verdict_recorded_once(
    tmp_path: Path,
) -> None:
    with keyed_nats(tmp_path / "nats") as url:
        first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
        first = start_daemon(url, first_log, "--roles", "conductor,verifier", KF_ACK_WAIT="3")
        second = None
        try:
            wait_for_line(first_log, "verifier warm-up done", 120)
            hanging = request(HANG, timeout_s=10.0)
            with client_for(url, deadline_s=180.0) as client, ThreadPoolExecutor(1) as asking:
                pending = asking.submit(client.score_sync, hanging)
                wait_for_line(first_log, "verifying a triton candidate", 60)
                wait_for_candidate_of(first.pid)
                below = descendants(first.pid)  # its warm process, the judge, the candidate
                os.killpg(first.pid, signal.SIGKILL)  # mid-check
                first.wait(30)
                # Nothing of the check outlives its verifier: no judge, no candidate
                # spinning on past a time limit nobody enforces now.
                wait_for_exit(below, 30)
                second = start_daemon(
                    url, second_log, "--roles", "conductor,verifier", KF_ACK_WAIT="3"
                )
                answer = pending.result(timeout=180)
        finally:
            for daemon in (first, second):
                if daemon is not None and daemon.poll() is None:
                    os.killpg(daemon.pid, signal.SIGKILL)
                    daemon.wait(30)
        assert answer.verdict == "timeout" and answer.score == 0.0
        events = task_events(url, hanging.task_id())
        assert sum(isinstance(e, VerificationCompleted) for e in events) == 1


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (by their parents, as /proc says now)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit():
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def wait_for_candidate_of(pid: int, within_s: float = 60) -> None:
    """Wait until a process below ``pid`` runs as another user: the confined candidate."""
    deadline = time.monotonic() + within_s
    while True:
        owners = set()
        for child in descendants(pid):
            with contextlib.suppress(OSError):
                owners.add(Path(f"/proc/{child}").stat().st_uid)
        if owners - {os.getuid()}:
            return
        assert time.monotonic() < deadline, "no candidate process started"
        time.sleep(0.1)


def wait_for_exit(pids: set[int], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while alive := {p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)}:
        if time.monotonic() > deadline:
            for p in alive:
                with contextlib.suppress(OSError):
                    os.kill(p, signal.SIGKILL)
            raise AssertionError(f"processes of the killed verifier ran on: {sorted(alive)}")
        time.sleep(0.1)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_client_that_goes_away_leaves_nothing_another_waits_on(pool: str) -> None:
    hanging = request(HANG, timeout_s=8.0, task_name="abandoned")
    script = textwrap.dedent(
        f"""
        import asyncio
        from pathlib import Path
        from kernelflow.rewards import RewardClient, RewardRequest
        from kernelflow.host.settings import Settings
        settings = Settings(nats_url={pool!r}, nats_creds=Path({str(creds(pool, "publisher"))!r}))
        request = RewardRequest(task_source={TASK!r}, code={HANG!r}, trials=1, timeout_s=8.0,
                                task_name="abandoned")
        asyncio.run(RewardClient(settings).score(request))
        """
    )
    gone = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        wait_for(pool, hanging.task_id(), bool, 60)  # its task is in the log
    finally:
        gone.kill()  # the trainer's process dies while its request is being judged
        gone.wait(30)
    with client_for(pool) as client:
        answer = client.score_sync(hanging)
    assert answer.verdict == "timeout"
    events = task_events(pool, hanging.task_id())
    assert sum(isinstance(e, TaskSubmitted) for e in events) == 1
    assert sum(isinstance(e, VerificationCompleted) for e in events) == 1


def test_verls_reward_manager_scores_a_batch_through_the_pool(
    pool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import load_reward_manager

    monkeypatch.setenv("KF_NATS_URL", pool)
    monkeypatch.setenv("KF_NATS_CREDS", str(creds(pool, "publisher")))
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://kernelflow.integrations.verl",
                    "name": "compute_score_async",
                    "reward_kwargs": {"trials": 1},
                },
                "reward_manager": {"source": "register", "name": "naive"},
            }
        }
    )
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)  # the manager takes the loop it is made on
    tokenizer = tiny_tokenizer(tmp_path / "tokenizer")
    manager = load_reward_manager(config, tokenizer)
    assert manager.is_async_reward_score  # verl awaits it on its loop
    items = [
        ("kernelflow/triton", fenced(GOOD), TASK, KERNEL_INFO, 1.0),
        ("kernelflow/triton", fenced(CHEAT), TASK, KERNEL_INFO, 0.0),
        ("kernelflow/triton", fenced(WRONG), TASK, KERNEL_INFO, 0.0),
        ("kernelflow/triton", "no code at all", TASK, KERNEL_INFO, 0.0),
    ]
    data = batch(tokenizer, items)

    async def score_all() -> list[dict[str, Any]]:
        return list(
            await asyncio.gather(*(manager.run_single(data[i : i + 1]) for i in range(len(items))))
        )

    bridges = {t for t in threading.enumerate() if t.name == "kf-nats-bridge"}
    try:
        results = loop.run_until_complete(score_all())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        # The process's shared connection, which would retry this module's pool forever
        # once the pool stops.
        close_shared_clients()
    assert {t for t in threading.enumerate() if t.name == "kf-nats-bridge"} <= bridges
    assert [r["reward_score"] for r in results] == [i[4] for i in items]
    infos = [r["reward_extra_info"] for r in results]
    assert [i["verdict"] for i in infos] == ["pass", "rejected_static", "mismatch", "no_code"]
    for info in infos[:3]:  # each one a task of the pool's log
        assert info["task_id"].startswith("rw-")
        assert any(isinstance(e, VerificationCompleted) for e in task_events(pool, info["task_id"]))


def test_on_the_embedded_default_a_trainer_joins_the_daemons_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "daemon.log"
    with log.open("ab") as out:
        daemon = subprocess.Popen(
            [*KERNELFLOW, "-v", "daemon", "--roles", "conductor,verifier"],
            cwd=REPO,
            env=cli_env(KF_DATA_DIR=str(data)),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for_line(log, "verifier warm-up done", 120)
        # No URL, no key: the data dir's server and keys, as the trainer's process finds them.
        with RewardClient(Settings(nats_url=None, nats_creds=None, data_dir=data)) as client:
            answer = client.score_sync(request(GOOD, task_name="embedded"))
        assert (answer.verdict, answer.score) == ("pass", 1.0)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(60)
