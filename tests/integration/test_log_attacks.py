"""What a publisher on NATS could do to a running daemon, and what it does now.

Each test reproduces a reported attack against real daemons on a real nats-server:

- a command's ``KF-Reply`` (or a query's reply subject) naming a subject of the log made
  the daemon write its answer into another task's history (or, naming ``$JS.API...``,
  run a JetStream request: ``$JS.API.STREAM.PURGE.KF_EVENTS`` empties the log);
- one undecodable message on a task's subjects wedged it: every read raised, its agents
  were redelivered until JetStream gave up, giving up could not be recorded, and
  ``cancel``, ``status TASK`` and the whole-log tools failed with a traceback;
- a command that made the checks raise something else than their refusals
  (``MemoryError`` parsing ``"-" * 200000 + "1"``, ``RecursionError`` decoding deeply
  nested JSON) was retried on every delivery, and a status query with ``{"after":
  1e999}`` was never answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.connection import ClientAuth
from kernelflow.actors.daemon import Daemon, DaemonConfig
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import (
    AgentDispatched,
    AgentFailed,
    Event,
    SubmitTask,
    TaskCancelled,
    TaskFinished,
)
from kernelflow.llm.base import LLMRequest, LLMResponse
from kernelflow.llm.scripted import ScriptedProvider
from kernelflow.projections.task_state import fold
from tests.conftest import EXAMPLES, as_user, connect, is_keyed, role_auth, run_cli
from tests.daemons import (
    assert_each_step_once,
    slow_script,
    start_daemon,
    submit,
    wait_for,
    wait_until_over,
    wait_until_settled,
)

RELU = (EXAMPLES / "tasks" / "relu.py").read_text()
GARBAGE = [b"garbage", b'{"kind": "task_finished", "task_id": "x"', b"[" * 50_000]


@contextlib.contextmanager
def running_daemon(
    url: str, log: Path, *args: str, **kwargs: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``kernelflow daemon`` process, up (it answers pings) until the block ends."""
    process = start_daemon(url, log, *args, **kwargs)
    try:
        asyncio.run(until_pinged(url, process))
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def until_pinged(url: str, process: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    auth = role_auth(url, "reader") if is_keyed(url) else ClientAuth()  # or an open server
    nc = await nats.connect(url, **auth.options())
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert process.poll() is None, "the daemon exited"
            assert time.monotonic() < deadline, "the daemon never answered a ping"
            with contextlib.suppress(nats.errors.Error):
                await nc.request(subjects.HEALTH_PING, b"{}", timeout=1)
                return
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


def inject(url: str, task_id: str) -> int:
    """Publish what is not an event of ``task_id`` on its subjects: garbage, another
    task's event and a repeat of its first event (as only a holder of the daemon key may:
    a daemon with a bug). How many messages that is."""

    async def go() -> int:
        nc = await connect(url, "daemon")
        js = nc.jetstream()
        first = (await EventLog(nc).read_task(task_id)).events[0]
        other = TaskCancelled(task_id="someone-else", seq=1, reason="forged")
        messages = [
            *((f"kf.ev.{task_id}.task_finished", data) for data in GARBAGE),
            (f"kf.ev.{task_id}.task_cancelled", encode(other)),
            (subjects.event_subject(first), encode(first)),
        ]
        for subject, data in messages:
            await js.publish(subject, data)
        await nc.close()
        return len(messages)

    return asyncio.run(go())


def quarantined_in(url: str, task_id: str) -> int:
    async def read() -> int:
        nc = await connect(url, "reader")
        try:
            return (await EventLog(nc).read_task(task_id)).quarantine.count
        finally:
            await nc.close()

    return asyncio.run(read())


def assert_one_line_each(log: Path) -> None:
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]


# --------------------------------------------------------------------------- replies


@pytest.mark.parametrize(
    ("subject", "answered"),
    [
        ("_INBOX.k2J9vQmXq1", True),
        ("_INBOX_alice.7", True),
        ("myapp.replies.7", True),
        ("kf.ev.victim.task_finished", False),
        ("KF.errors", False),
        ("kf", False),
        ("$JS.API.STREAM.PURGE.KF_EVENTS", False),
        ("$SYS.REQ.SERVER.PING", False),
        ("_INBOX.*", False),
        ("_INBOX.>", False),
        ("_INBOX..x", False),
        ("_INBOX.a b", False),
        ("_INBOX.\u00e9", False),
        ("", False),
        ("_INBOX." + "x" * 300, False),
    ],
)
def test_a_daemon_answers_only_on_an_inbox(subject: str, answered: bool) -> None:
    assert (subjects.reply_refusal(subject) is None) is answered


def test_no_answer_is_ever_published_into_the_log_or_the_servers_api(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    with running_daemon(private_nats, log, "--roles", "conductor"):
        refusals, answered = asyncio.run(answer_attacks(private_nats))
    assert refusals == [
        "KF-Reply: reply subject 'kf.ev.victim.task_finished' is in kernelflow's namespace (kf.)",
        "KF-Reply: reply subject '$JS.API.STREAM.PURGE.KF_EVENTS' is in the server's namespace ($)",
        "KF-Reply: reply subject 'kf.cmd.cancel' is in kernelflow's namespace (kf.)",
        "KF-Reply: reply subject '_INBOX.>' has an empty token or a wildcard",
    ]
    assert answered["ok"] is True  # a query with an inbox is answered
    assert "not answering a status query" in log.read_text()
    assert "not answering a health ping" in log.read_text()
    assert_one_line_each(log)


async def answer_attacks(url: str) -> tuple[list[str], dict[str, Any]]:
    """The attacks of a publisher, who may ask for answers with any reply subject."""
    daemon = await connect(url, "daemon")
    bystander = await EventLog(daemon).append(
        TaskHistory("bystander"), [TaskCancelled(task_id="bystander", reason="in the log")]
    )
    await daemon.close()
    nc = await connect(url, "publisher")
    js = nc.jetstream()
    errors = await nc.subscribe(subjects.ERRORS)
    refusals = []
    targets = [
        "kf.ev.victim.task_finished",
        "$JS.API.STREAM.PURGE.KF_EVENTS",
        "kf.cmd.cancel",
        "_INBOX.>",
    ]
    for n, target in enumerate(targets):
        command = SubmitTask(task_id=f"attacker-{n}", task_source=RELU)
        await js.publish(subjects.SUBMIT, encode(command), headers={subjects.REPLY_HEADER: target})
        refusals.append(json.loads((await errors.next_msg(timeout=30)).data)["error"])
    await nc.publish(subjects.STATUS_QUERY, b"{}", reply="kf.ev.victim.task_finished")
    answered = json.loads((await nc.request(subjects.STATUS_QUERY, b"{}", timeout=30)).data)
    await nc.publish(subjects.HEALTH_PING, b"", reply="kf.ev.victim.task_finished")
    assert json.loads((await nc.request(subjects.HEALTH_PING, b"", timeout=30)).data)["daemon_id"]
    victim = await EventLog(nc).read_task("victim")
    assert victim.last_stream_seq == 0  # nothing was ever published on its subjects
    assert (await EventLog(nc).read_task("bystander")).events == bystander.events  # not purged
    for n in range(len(targets)):  # refused commands are not carried out
        assert (await EventLog(nc).read_task(f"attacker-{n}")).events == ()
    await nc.close()
    return refusals, answered


# --------------------------------------------------------------------------- garbage


REVIEWER_ONLY = {
    "agent_info": {
        "reviewer": {
            "possible_next_agent": ["verifier"],  # the built-in one, checking `verdict`
            "output_format": {
                "parser_name": "reviewer_parser",
                "parser_definition": {
                    "output_fields": {
                        "verdict": {
                            "field_type": "str",
                            "mandatory": True,
                            "field_description": "what the reviewer thinks",
                        }
                    }
                },
            },
        }
    },
    "start_agent": "reviewer",
    "limitation_info": {"required": {"max_step": 3}},
}


def test_garbage_in_a_tasks_history_neither_stops_it_nor_keeps_it_from_being_cancelled(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    script = slow_script(tmp_path, 1.0, agent="designer")  # the garbage lands mid-call
    workflow = tmp_path / "reviewer.yaml"
    workflow.write_text(yaml.safe_dump(REVIEWER_ONLY))
    with running_daemon(private_nats, log, script=script):
        submit(private_nats, "runs")
        wait_for(private_nats, "runs", _dispatched("designer"), timeout_s=60)
        injected = inject(private_nats, "runs")
        events = wait_until_settled(private_nats, "runs")
        # No daemon hosts the reviewer: the task waits, with garbage in its history.
        submit(private_nats, "waits", "--workflow", str(workflow))
        wait_for(private_nats, "waits", _dispatched("reviewer"), timeout_s=60)
        inject(private_nats, "waits")
        cancel = run_cli("cancel", "waits", *as_user("publisher", private_nats))
        assert cancel.returncode == 0, cancel.stderr
        status = run_cli("status", "waits", "--json", *as_user("publisher", private_nats))
        health = run_cli("health", "--json", *as_user("reader", private_nats))
    [daemon] = [c for c in json.loads(health.stdout)["checks"] if c["component"] == "daemon"]
    assert f"{2 * injected} message(s) in the log quarantined" in daemon["detail"], daemon
    assert "Traceback" not in health.stderr
    # The agents' work went on top of the garbage: nothing lost, nothing twice.
    assert_each_step_once(events)
    assert fold("runs", events).finished.status == "success"  # type: ignore[union-attr]
    assert quarantined_in(private_nats, "runs") == injected
    assert isinstance(wait_until_over(private_nats, "waits")[-1], TaskCancelled)
    assert status.returncode == 0 and json.loads(status.stdout)["status"] == "cancelled"
    assert f"{injected} message(s) on the log's task subjects" in status.stderr
    out = tmp_path / "log.jsonl"
    tools = [
        ("log", "export", "--out", str(out), *as_user("reader", private_nats)),
        ("log", "verify", str(out)),
        ("report", *as_user("reader", private_nats)),
        ("export", "grpo", "--out", str(tmp_path / "grpo.jsonl"), *as_user("reader", private_nats)),
        ("status", "runs", *as_user("publisher", private_nats)),
    ]
    for args in tools:
        run = run_cli(*args)
        assert run.returncode == 0 and "Traceback" not in run.stderr, (args, run.stderr)
        assert "quarantine" in run.stdout + run.stderr, args
    assert_one_line_each(log)


def _dispatched(agent: str) -> Any:
    def check(events: list[Event]) -> bool:
        return any(isinstance(e, AgentDispatched) and e.agent == agent for e in events)

    return check


class BuggyDesigner:
    """The relu script, except for the designer, whose calls raise (a provider's bug)."""

    name = "buggy"

    def __init__(self) -> None:
        self.script = ScriptedProvider(EXAMPLES / "scripted" / "relu.yaml")
        self.designer_calls = 0

    async def complete(self, request: LLMRequest) -> LLMResponse:
        if request.agent == "designer":
            self.designer_calls += 1
            raise RuntimeError("a bug in the provider")
        return await self.script.complete(request)


def test_giving_up_on_an_agent_is_recorded_whatever_its_tasks_history_holds(
    private_nats: str,
) -> None:
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    provider = BuggyDesigner()
    config = DaemonConfig(
        roles=("conductor", "designer"), llm=provider, ack_wait_s=2.0, max_deliveries=2
    )
    daemon = Daemon(bridge, config).start()
    try:
        command = SubmitTask(task_id="gives-up", task_source=RELU)
        bridge.call(bridge.commands.publish(command, subjects.SUBMIT))
        wait_for(private_nats, "gives-up", _dispatched("designer"), timeout_s=30)
        inject(private_nats, "gives-up")
        events = wait_until_settled(private_nats, "gives-up", timeout_s=60)
    finally:
        daemon.stop()
        bridge.stop()
    [failed] = [e for e in events if isinstance(e, AgentFailed)]
    assert failed.error == "gave up after 2 attempts: RuntimeError: a bug in the provider"
    finished = next(e for e in events if isinstance(e, TaskFinished))
    assert finished.status == "failed" and provider.designer_calls == 2


# --------------------------------------------------------------------------- poison


POISON_COMMANDS = {
    # The parser's stack overflows: MemoryError.
    "unary minus x200000": (
        subjects.SUBMIT,
        encode(SubmitTask(task_id="poison-1", task_source="-" * 200_000 + "1")),
        "too deeply nested to check (MemoryError)",
    ),
    # msgspec skips an unknown field by recursing into it: RecursionError.
    "nested 100000 deep": (
        subjects.SUBMIT,
        b'{"kind": "submit_task", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "nested too deeply",
    ),
    "a number out of range": (
        subjects.SUBMIT,
        b'{"kind": "submit_task", "task_source": "x", "deadline_s": 1e999}',
        "deadline_s: number out of range",
    ),
    "random bytes": (subjects.CANCEL, bytes(range(256)) * 4, "not a kernelflow command"),
    "a submit on the cancel subject": (
        subjects.CANCEL,
        encode(SubmitTask(task_id="poison-2", task_source=RELU)),
        "publish it on kf.cmd.submit",
    ),
    "a workflow nested too deeply": (
        subjects.SUBMIT,
        encode(SubmitTask(task_id="poison-3", task_source=RELU, workflow_yaml="a: " + "[" * 5000)),
        "nesting depth",
    ),
}
POISON_QUERIES = {
    "after 1e999": (b'{"after": 1e999}', "Number out of range"),
    "after a string": (b'{"after": "the end"}', "Expected `int`"),
    "nested 100000 deep": (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
    "not an object": (b"[1, 2, 3]", "Expected `object`"),
}


def test_poison_commands_and_queries_are_answered_once_at_their_first_delivery(
    private_nats: str, tmp_path: Path
) -> None:
    log = tmp_path / "daemon.log"
    with running_daemon(private_nats, log, "--roles", "conductor"):
        answers, waited, redelivered = asyncio.run(poison(private_nats))
    for name, (_, _, why) in POISON_COMMANDS.items():
        [answer] = answers[name]  # exactly once
        assert answer["ok"] is False and why in answer["error"], (name, answer)
    for name, (_, why) in POISON_QUERIES.items():
        [answer] = answers[f"query {name}"]
        assert answer["ok"] is False and why in answer["error"], (name, answer)
    # At the first delivery: a redelivery would come after ack_wait (30 s).
    assert waited < 20 and redelivered == 0
    text = log.read_text()
    assert_one_line_each(log)
    refusals = text.count("refused command") + text.count("rejected task")
    assert refusals == len(POISON_COMMANDS), text[-3000:]
    assert text.count("refused a status query") == len(POISON_QUERIES)


async def poison(url: str) -> tuple[dict[str, list[dict[str, Any]]], float, int]:
    """A publisher's poisoned commands and queries, answered on its own inboxes."""
    nc = await connect(url, "publisher")
    js = nc.jetstream()
    answers: dict[str, list[dict[str, Any]]] = {}
    names = {**{n: n for n in POISON_COMMANDS}, **{f"query {n}": n for n in POISON_QUERIES}}
    root = role_auth(url, "publisher").options()["inbox_prefix"] + ".poison"
    inboxes = {name: f"{root}.{n}" for n, name in enumerate(names)}
    by_inbox = {inbox: name for name, inbox in inboxes.items()}

    async def collect(msg: Any) -> None:
        answers.setdefault(by_inbox[msg.subject], []).append(json.loads(msg.data))

    await nc.subscribe(f"{root}.>", cb=collect)
    started = time.monotonic()
    for name, (subject, data, _) in POISON_COMMANDS.items():
        await js.publish(subject, data, headers={subjects.REPLY_HEADER: inboxes[name]})
    for name, (data, _) in POISON_QUERIES.items():
        await nc.publish(subjects.STATUS_QUERY, data, reply=inboxes[f"query {name}"])
    while len(answers) < len(names) and time.monotonic() - started < 60:
        await asyncio.sleep(0.05)
    waited = time.monotonic() - started
    await asyncio.sleep(2.0)  # room for a second answer, if any came
    info = await js.consumer_info(subjects.COMMANDS_STREAM, "kf-conductor-commands")
    await nc.close()
    return answers, waited, int(info.num_redelivered or 0)
