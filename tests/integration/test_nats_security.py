"""Least privilege, enforced by nats-server itself: kernelflow's roles (kernelflow.host.nats_auth)
on a real server configured as the embedded one is (its data dir's keys). Each role tries
what an attacker holding its credentials would; daemons, a verifier-only node, a publisher
and a reader run a task through their roles; and the embedded default lets in no one
without its keys. Refusals reach the user as one line."""

from __future__ import annotations

import asyncio
import json
import stat
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js import api

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.connection import ClientAuth, NatsAccessRefused
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import VerificationCompleted
from kernelflow.host.nats_auth import ROLES, new_seed, write_secret
from kernelflow.host.nats_server import EmbeddedNats, embedded_nats, local_keys
from kernelflow.projections.task_state import fold
from tests.conftest import REPO, run_cli
from tests.daemons import (
    assert_each_step_once,
    start_daemon,
    submitted_on_default,
    task_events,
    wait_for_line,
)

RELU = "examples/tasks/relu.py"
# A daemon's durable consumer, as the daemons of the test's server have one.
DURABLE = "kf-agent-coder"


@dataclass
class Secured:
    url: str
    seeds: dict[str, Path]

    def auth(self, role: str) -> ClientAuth:
        return ClientAuth(creds=self.seeds[role])


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[Secured]:
    keys = local_keys(tmp_path / "nats")
    with EmbeddedNats(tmp_path / "nats", authorization=keys.server_authorization()) as server:
        yield Secured(server.url, {role: keys.seed_file(role) for role in ROLES})


# --------------------------------------------------------------------------- what each may do

Attempt = Callable[[NATS], Awaitable[object]]
ATTEMPTS: dict[str, Attempt] = {
    "submit a task": lambda nc: nc.publish("kf.cmd.submit", b"{}"),
    "append an event": lambda nc: nc.publish("kf.ev.t.task_finished", b"{}"),
    "record a verification": lambda nc: nc.publish("kf.ev.t.verification_completed", b"{}"),
    "read the log": lambda nc: nc.publish(
        "$JS.API.DIRECT.GET.KF_EVENTS", json.dumps({"seq": 1}).encode()
    ),
    "read the log from the stream's leader": lambda nc: nc.publish(
        "$JS.API.STREAM.MSG.GET.KF_EVENTS", json.dumps({"seq": 1}).encode()
    ),
    # The commands waiting in the queue: a daemon's (its conductor looks at the submits
    # ahead of a cancel); a publisher may only count them.
    "read the commands queued": lambda nc: nc.publish(
        "$JS.API.STREAM.MSG.GET.KF_CMD", json.dumps({"seq": 1}).encode()
    ),
    "purge a task's events": lambda nc: nc.publish(
        "$JS.API.STREAM.PURGE.KF_EVENTS", json.dumps({"filter": "kf.ev.t.>"}).encode()
    ),
    "delete the event log": lambda nc: nc.publish("$JS.API.STREAM.DELETE.KF_EVENTS", b""),
    "delete the command stream": lambda nc: nc.publish("$JS.API.STREAM.DELETE.KF_CMD", b""),
    "reconfigure the event log": lambda nc: nc.publish("$JS.API.STREAM.UPDATE.KF_EVENTS", b"{}"),
    "take a daemon's consumer over": lambda nc: nc.publish(
        f"$JS.API.CONSUMER.DURABLE.CREATE.KF_EVENTS.{DURABLE}", b"{}"
    ),
    # A consumer create naming an existing consumer updates it: its redeliveries, its filter.
    "reconfigure a daemon's consumer": lambda nc: nc.publish(
        "$JS.API.CONSUMER.CREATE.KF_EVENTS",
        json.dumps(
            {"stream_name": "KF_EVENTS", "config": {"name": DURABLE, "max_deliver": 1}}
        ).encode(),
    ),
    "pull a daemon's work": lambda nc: nc.publish(
        f"$JS.API.CONSUMER.MSG.NEXT.KF_EVENTS.{DURABLE}", json.dumps({"batch": 1}).encode()
    ),
    "ack a daemon's work": lambda nc: nc.publish(f"$JS.ACK.KF_EVENTS.{DURABLE}.1.1.1.0.0", b""),
    "answer status queries": lambda nc: nc.subscribe("kf.query.status", queue="kf-readmodel"),
    "answer health pings": lambda nc: nc.subscribe("kf.health.ping"),
    "watch events as they are recorded": lambda nc: nc.subscribe("kf.ev.>"),
    "read the replies others get": lambda nc: nc.subscribe("_INBOX.>"),
    "answer on another's inbox": lambda nc: nc.publish("_INBOX.someone.1", b"{}"),
    # The verifiers' shared extensions: written by the verifiers, made by a daemon.
    "write the shared extensions": lambda nc: nc.publish("$O.KF_EXTENSIONS.C.forged", b"\x7fELF"),
    "make the shared extension store": lambda nc: nc.publish(
        "$JS.API.STREAM.CREATE.OBJ_KF_EXTENSIONS", b"not a configuration"
    ),
    # Last: the daemon may, and the other roles' attempts must find it still there.
    "delete a daemon's consumer": lambda nc: nc.publish(
        f"$JS.API.CONSUMER.DELETE.KF_EVENTS.{DURABLE}", b""
    ),
}
READ = {"read the log", "read the log from the stream's leader"}
MAY = {
    "publisher": {"submit a task", *READ, "watch events as they are recorded"},
    "reader": {*READ, "watch events as they are recorded"},
    "verifier": {
        "record a verification",
        *READ,
        "answer health pings",
        "answer on another's inbox",
        "write the shared extensions",
    },
    "daemon": {
        "submit a task",
        "append an event",
        "record a verification",
        *READ,
        "read the commands queued",
        "watch events as they are recorded",
        "take a daemon's consumer over",
        "pull a daemon's work",
        "ack a daemon's work",
        "answer status queries",
        "answer health pings",
        "answer on another's inbox",
        "write the shared extensions",
        "make the shared extension store",
        "delete a daemon's consumer",
    },
}


async def connect(url: str, auth: ClientAuth, errors: list[str]) -> NATS:
    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    return await nats.connect(url, error_cb=on_error, allow_reconnect=False, **auth.options())


async def allowed(url: str, auth: ClientAuth) -> set[str]:
    """What of ATTEMPTS the server lets a client presenting ``auth`` do: what it reported
    no permissions violation for (it reports one before it answers a later ping)."""
    errors: list[str] = []
    nc = await connect(url, auth, errors)
    done = set()
    try:
        for what, attempt in ATTEMPTS.items():
            before = len(errors)
            await attempt(nc)
            # nats-py sends a flush's ping ahead of what it has not sent yet: the second
            # ping is surely behind the attempt.
            await nc.flush()
            await nc.flush()
            if not any("permissions violation" in e for e in errors[before:]):
                done.add(what)
    finally:
        await nc.close()
    return done


async def prepare(nc: NATS) -> EventLog:
    """The streams, a task's first event and a daemon's durable consumer, as a daemon
    makes them."""
    log = EventLog(nc)
    await log.ensure_streams()
    await log.append(TaskHistory("t"), [submitted_on_default("t")])
    await log.jetstream.add_consumer(
        "KF_EVENTS",
        api.ConsumerConfig(durable_name=DURABLE, ack_policy=api.AckPolicy.EXPLICIT),
    )
    return log


def test_each_role_may_do_what_it_needs_and_nothing_else(secured: Secured) -> None:
    async def check() -> None:
        daemon = await connect(secured.url, secured.auth("daemon"), [])
        log = await prepare(daemon)
        try:
            for role in ("publisher", "reader", "verifier"):
                assert await allowed(secured.url, secured.auth(role)) == MAY[role], role
            # Nothing the others tried left a mark: the task's event and the consumer are
            # there, unchanged.
            assert [e.kind for e in (await log.read_task("t")).events] == ["task_submitted"]
            consumer = await log.jetstream.consumer_info("KF_EVENTS", DURABLE)
            assert consumer.config.max_deliver in (None, -1)  # not reconfigured
            assert consumer.delivered.consumer_seq == 0  # nothing pulled from it
            assert await allowed(secured.url, secured.auth("daemon")) == MAY["daemon"]
        finally:
            await daemon.close()

    asyncio.run(check())


def test_the_security_page_lists_every_permission_of_every_role() -> None:
    page = (REPO / "docs" / "security.md").read_text()
    granted = {s for role in ROLES.values() for s in (*role.publish, *role.subscribe)}
    assert sorted(s for s in granted if f"`{s}`" not in page) == []


# --------------------------------------------------------------------------- end to end


def test_a_task_runs_through_daemons_a_verifier_node_a_publisher_and_a_reader(
    secured: Secured, tmp_path: Path
) -> None:
    seeds = {role: str(path) for role, path in secured.seeds.items()}
    main = start_daemon(
        secured.url,
        tmp_path / "daemon.log",
        "--creds",
        seeds["daemon"],
        "--roles",
        "conductor,designer,coder",
    )
    # The streams are the daemon role's to create: the verifier node comes after.
    wait_for_line(tmp_path / "daemon.log", "daemon started")
    verifier = start_daemon(
        secured.url,
        tmp_path / "verifier.log",
        "--creds",
        seeds["verifier"],
        "--roles",
        "verifier",
        "--no-read-model",
    )
    try:
        submitted = run_cli(
            "submit", RELU, "--task-id", "s1", "--wait", "--nats-url", secured.url,
            "--creds", seeds["publisher"],
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        checked = run_cli(
            "health", "--json", "--wait", "1", "--nats-url", secured.url,
            "--creds", seeds["reader"],
        )  # fmt: skip
        report = json.loads(checked.stdout)
        assert sorted(d["roles"] for d in report["daemons"]) == [
            ["conductor", "designer", "coder"],
            ["verifier"],  # a verifier node answers pings too
        ]
        assert report["access"] == {"auth_required": True, "tls": False, "creds": seeds["reader"]}
        exported = run_cli(
            "log", "export", "--out", str(tmp_path / "log.jsonl"), "--task", "s1",
            "--nats-url", secured.url, "--creds", seeds["reader"],
        )  # fmt: skip
        assert exported.returncode == 0, exported.stderr
    finally:
        for daemon in (main, verifier):
            daemon.terminate()
            daemon.wait(60)
    events = task_events(secured.url, "s1", secured.auth("reader"))
    state = fold("s1", events)
    assert state.finished is not None and state.finished.status == "success"
    assert any(isinstance(e, VerificationCompleted) for e in events)
    assert_each_step_once(events)
    assert len((tmp_path / "log.jsonl").read_text().splitlines()) > len(events)  # + header
    for log in ("daemon.log", "verifier.log"):  # each role had all it needed
        assert "NATS refused" not in (tmp_path / log).read_text(), log


def test_refusals_are_one_line(secured: Secured, tmp_path: Path) -> None:
    seeds = {role: str(path) for role, path in secured.seeds.items()}
    Bridge(secured.url, auth=secured.auth("daemon")).start().stop()  # the streams
    anonymous = run_cli("status", "--nats-url", secured.url)
    assert anonymous.returncode == 2
    assert anonymous.stderr == (
        f"kernelflow: the NATS server at {secured.url} refused no credentials (authorization "
        "violation): pass --creds FILE (or set KF_NATS_CREDS) with credentials it knows\n"
    )
    stranger = tmp_path / "stranger.nk"
    write_secret(stranger, new_seed())
    unknown = run_cli("status", "--nats-url", secured.url, "--creds", str(stranger))
    assert unknown.returncode == 2
    assert f"refused the credentials in {stranger} (authorization violation)" in unknown.stderr
    not_a_seed = run_cli("status", "--nats-url", secured.url, "--creds", RELU)
    assert not_a_seed.returncode == 2
    assert not_a_seed.stderr == (
        f"kernelflow: NATS credentials {RELU}: not an nkey user seed (SU…) nor a NATS .creds file\n"
    )
    submitted = run_cli("submit", RELU, "--nats-url", secured.url, "--creds", seeds["reader"])
    assert submitted.returncode == 2
    assert submitted.stderr == (
        'kernelflow: NATS refused: permissions violation for publish to "kf.cmd.submit" (the '
        f"credentials in {seeds['reader']} may not do this; docs/security.md lists what each "
        "role may do)\n"
    )


# --------------------------------------------------------------------------- the default


def test_the_embedded_server_lets_in_only_holders_of_its_data_dirs_keys(tmp_path: Path) -> None:
    store = tmp_path / "data" / "nats"
    with embedded_nats(store) as (url, auth):
        Bridge(url, auth=auth).start().stop()  # kernelflow's own processes: the daemon's
        with pytest.raises(NatsAccessRefused, match="refused no credentials"):
            Bridge(url).start(timeout_s=10)
        # What `kernelflow creds` hands out for it works; nothing it prints is the seed.
        out = tmp_path / "publisher.nk"
        creds = ("creds", "publisher", "--out", str(out), "--data-dir", str(tmp_path / "data"))
        written = run_cli(*creds)
        assert written.returncode == 0, written.stderr
        seed = out.read_bytes().strip()
        assert seed == (store / "auth" / "publisher.nk").read_bytes().strip()
        assert seed.decode() not in written.stdout + written.stderr
        assert "public key U" in written.stdout
        Bridge(url, auth=ClientAuth(creds=out)).start().stop()
        again = run_cli(*creds)
        assert again.returncode == 2 and "exists; not replaced" in again.stderr
    assert stat.S_IMODE((store / "auth").stat().st_mode) == 0o700
    for path in [*(store / "auth").iterdir(), out]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
