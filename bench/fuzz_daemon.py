"""Fuzz a running daemon with what any NATS publisher may send, and say how it held up.

    python bench/fuzz_daemon.py [--messages 10000] [--seed 1]

Starts an embedded nats-server and a ``kernelflow daemon`` (conductor, designer and
coder, scripted LLM), then publishes ``--messages`` messages as fast as they are taken,
in random order: commands on ``kf.cmd.submit``, ``kf.cmd.cancel`` and another
``kf.cmd.`` subject (random bytes; truncated, deeply nested, oversized JSON; wrong types;
numbers out of range; commands that decode but are refused: a task source that overflows
the parser, unknown workflows, backends and rewards, a submit on the cancel subject, a
cancel of a task that does not exist), status queries on ``kf.query.status`` (the same,
and valid ones), pings on ``kf.health.ping``, and messages on ``kf.ev.<task>.<kind>`` that
are not events of that task (garbage, another task's event, a seq out of place). Every
command, query and ping asks for its answer on an inbox of its own.

Prints what was sent; how many of the commands, queries and pings were answered (once,
twice, never) and how fast (p50 / p99 from publish to answer); the daemon's RSS before
and after; its log lines during the fuzz, per refused message (commands and queries it
refuses or rejects, and the quarantined messages of the log), and its tracebacks.
``tests/integration/test_fuzz_daemon.py`` runs a smaller fuzz with the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.msg import Msg

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import OutputParsed, TaskCancelled
from kernelflow.host.nats_server import EmbeddedNats

REPO = Path(__file__).resolve().parent.parent
RELU = (REPO / "examples" / "tasks" / "relu.py").read_text()
INBOX = "_INBOX.fuzz"
# Log lines of a refusal: a command refused or a task rejected, a status query refused,
# a message of the log quarantined.
REFUSAL_MARKS = ("refused command", "rejected task", "refused a status query", "quarantined")

# Commands that decode, each refused (or, a cancel of no task, answered so) by the daemon.
_SUBMITS: list[dict[str, object]] = [
    {"task_source": "-" * 200_000 + "1"},  # the parser's stack overflows: MemoryError
    {"task_source": "def forward(:"},
    {"task_source": RELU, "workflow": "no-such-workflow"},
    {"task_source": RELU, "backend": "nosuch"},
    {"task_source": RELU, "rewards": ["nope@9"]},
    {"task_source": RELU, "workflow_yaml": "a: " + "[" * 5000},
    {"task_source": "x" * 900_000},  # oversized (the server's limit is 1 MiB)
]


@dataclass(frozen=True)
class Probe:
    target: str  # command, query, ping or event
    subject: str
    data: bytes
    label: str  # what kind of message it is
    refused: bool  # the daemon refuses it (a log line), rather than answering it plainly

    @property
    def asks(self) -> bool:
        return self.target != "event"


def probes(count: int, seed: int) -> list[Probe]:
    """``count`` fuzz messages: 40% commands, 25% queries, 10% pings, 25% for the log."""
    rng = random.Random(seed)
    makers = [(_command, 40), (_query, 25), (_ping, 10), (_event, 25)]
    chosen = rng.choices([m for m, _ in makers], weights=[w for _, w in makers], k=count)
    return [make(rng, n) for n, make in enumerate(chosen)]


def _mangled(rng: random.Random, valid: dict[str, object]) -> tuple[bytes, str]:
    """A broken version of the JSON object ``valid``, and how it is broken."""
    text = json.dumps(valid).encode()
    how = rng.choice(["bytes", "truncated", "nested", "wrong type", "out of range", "not object"])
    if how == "bytes":
        return rng.randbytes(rng.randrange(1, 2000)), how
    if how == "truncated":
        return text[: rng.randrange(1, len(text))], how
    if how == "nested":  # in a field of its own, which a decoder skips (recursing)
        depth = rng.choice([100, 1000, 10_000, 100_000])
        return b'{"x": ' + b"[" * depth + b"]" * depth + b", " + text[1:], f"nested {depth}"
    key = rng.choice(sorted(valid))
    if how == "wrong type":
        wrong = [5, [], {}, None] if isinstance(valid[key], str) else ["x", [], {}, None]
        return json.dumps({**valid, key: rng.choice(wrong)}).encode(), how
    if how == "out of range":  # the key again: the last one counts
        number = rng.choice([b"1e999", b"-1e999"])
        return text[:-1] + b', "' + key.encode() + b'": ' + number + b"}", how
    return json.dumps([valid]).encode(), how


def _command(rng: random.Random, n: int) -> Probe:
    if rng.random() < 0.4:  # broken versions of commands refused even when they decode
        submit = rng.random() < 0.5
        valid: dict[str, object] = (
            {"kind": "submit_task", "task_id": f"fz-{n}", "task_source": "x"}
            if submit
            else {"kind": "cancel_task", "task_id": "x" * 100}  # not a task id
        )
        data, how = _mangled(rng, valid)
        subject = subjects.SUBMIT if submit else subjects.CANCEL
        return Probe("command", subject, data, how, refused=True)
    if rng.random() < 0.7:
        body = {"kind": "submit_task", "task_id": f"fz-{n}", **rng.choice(_SUBMITS)}
        subject = rng.choice([subjects.SUBMIT] * 8 + [subjects.CANCEL, "kf.cmd.other"])
        return Probe("command", subject, json.dumps(body).encode(), "refused submit", True)
    task_id = rng.choice([f"fz-none-{n}", "x" * 100])  # no such task; not a task id
    command = json.dumps({"kind": "cancel_task", "task_id": task_id}).encode()
    return Probe("command", subjects.CANCEL, command, "cancel", refused=len(task_id) > 64)


def _query(rng: random.Random, n: int) -> Probe:
    if rng.random() < 0.3:
        valid = rng.choice([{}, {"task_id": f"fz-{n}"}, {"after": 10**12, "wait_s": 0.2}])
        return Probe(
            "query", subjects.STATUS_QUERY, json.dumps(valid).encode(), "valid", refused=False
        )
    data, how = _mangled(rng, {"after": 1, "wait_s": 1.0, "offset": 0, "limit": 10})
    return Probe("query", subjects.STATUS_QUERY, data, how, refused=how != "nested 100")


def _ping(rng: random.Random, n: int) -> Probe:
    return Probe("ping", subjects.HEALTH_PING, rng.randbytes(rng.randrange(0, 200)), "ping", False)


def _event(rng: random.Random, n: int) -> Probe:
    task = f"fz{rng.randrange(max(n, 1))}"
    kind = rng.choice(["task_submitted", "output_parsed", "agent_dispatched.coder", "zz"])
    other = TaskCancelled(task_id=f"{task}-other", seq=1, reason="forged")
    out_of_place = OutputParsed(task_id=task, seq=5, agent="coder", dispatch_id="d", fields={})
    data, how = rng.choice(
        [
            (encode(other), "another task's event"),
            (encode(out_of_place), "seq out of place"),
            _mangled(rng, {"kind": "task_cancelled", "task_id": task, "seq": 1, "reason": "r"}),
        ]
    )
    subject = f"{subjects.EVENTS_ROOT}.{task}.{kind}"
    if how == "seq out of place":  # on its own subject: its place is what is wrong
        subject = subjects.event_subject(out_of_place)
    return Probe("event", subject, data, how, refused=True)


@dataclass
class Report:
    sent: Counter[str] = field(default_factory=Counter)
    asked: int = 0
    answered: int = 0
    answered_twice: int = 0
    latencies_s: list[float] = field(default_factory=list)
    refused: int = 0  # messages the daemon refuses by construction
    rss_before_kb: int = 0
    rss_after_kb: int = 0
    log_lines: int = 0
    refusal_lines: int = 0
    tracebacks: int = 0
    sending_s: float = 0.0

    @property
    def unanswered(self) -> int:
        return self.asked - self.answered

    def percentile_s(self, p: float) -> float:
        values = sorted(self.latencies_s)
        return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")

    def lines(self) -> list[str]:
        return [
            "sent: " + ", ".join(f"{k} {v}" for k, v in sorted(self.sent.items())),
            f"sending took {self.sending_s:.1f}s",
            f"answered {self.answered}/{self.asked} (unanswered {self.unanswered}, "
            f"answered twice {self.answered_twice})",
            f"answer latency: p50 {self.percentile_s(0.5):.3f}s, "
            f"p99 {self.percentile_s(0.99):.3f}s, "
            f"max {max(self.latencies_s, default=float('nan')):.3f}s",
            f"daemon RSS: {self.rss_before_kb / 1024:.0f} MiB before, "
            f"{self.rss_after_kb / 1024:.0f} MiB after",
            f"daemon log: {self.log_lines} lines ({self.refusal_lines} refusals) for "
            f"{self.refused} refused messages: {self.log_lines / max(self.refused, 1):.2f} "
            f"lines per refused message; tracebacks {self.tracebacks}",
        ]


def _shown(subject: str) -> str:
    return "kf.ev.<task>.<kind>" if subject.startswith(subjects.EVENTS_ROOT) else subject


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def fuzz(url: str, daemon_pid: int, daemon_log: Path, count: int, seed: int = 1) -> Report:
    """Send ``count`` probes to the daemon ``daemon_pid`` (logging to ``daemon_log``) and
    wait for every answer asked for (at most a minute after the last one was sent)."""
    sent = probes(count, seed)
    report = Report(sent=Counter(f"{p.target} on {_shown(p.subject)}" for p in sent))
    report.asked = sum(p.asks for p in sent)
    report.refused = sum(p.refused for p in sent)
    report.rss_before_kb = rss_kb(daemon_pid)
    log_start = daemon_log.stat().st_size
    asyncio.run(_send(url, sent, report))
    time.sleep(1.0)  # what the daemon still logs about the last messages
    report.rss_after_kb = rss_kb(daemon_pid)
    with daemon_log.open("rb") as f:
        f.seek(log_start)
        lines = f.read().decode(errors="replace").splitlines()
    report.log_lines = len(lines)
    report.refusal_lines = sum(any(m in line for m in REFUSAL_MARKS) for line in lines)
    report.tracebacks = sum("Traceback" in line for line in lines)
    return report


async def _send(url: str, sent: list[Probe], report: Report) -> None:
    nc = await nats.connect(url, pending_size=1 << 26)
    published: dict[int, float] = {}
    answers: Counter[int] = Counter()

    async def answered(msg: Msg) -> None:
        n = int(msg.subject.rsplit(".", 1)[1])
        answers[n] += 1
        if answers[n] == 1:
            report.latencies_s.append(time.monotonic() - published[n])

    await nc.subscribe(f"{INBOX}.>", cb=answered, pending_msgs_limit=1 << 20)
    started = time.monotonic()
    for n, probe in enumerate(sent):
        inbox = f"{INBOX}.{n}"
        published[n] = time.monotonic()
        # As any publisher may: a request on a stream's subject, which JetStream answers
        # once it stored the message.
        if probe.target == "command":
            headers = {subjects.REPLY_HEADER: inbox}
            await nc.request(probe.subject, probe.data, timeout=10, headers=headers)
        elif probe.target == "event":
            await nc.request(probe.subject, probe.data, timeout=10)
        else:
            await nc.publish(probe.subject, probe.data, reply=inbox)
    report.sending_s = time.monotonic() - started
    deadline = time.monotonic() + 60.0
    while len(answers) < report.asked and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(3.0)  # room for second answers, if any come
    report.answered = len(answers)
    report.answered_twice = sum(1 for k in answers.values() if k > 1)
    await nc.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        log = Path(tmp) / "daemon.log"
        script = REPO / "examples" / "scripted" / "relu.yaml"
        command = [sys.executable, "-m", "kernelflow", "daemon", "--nats-url", server.url]
        command += ["--roles", "conductor,designer,coder", "--llm", f"scripted:{script}"]
        with log.open("wb") as out:
            daemon = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        try:
            asyncio.run(_until_pinged(server.url))
            report = fuzz(server.url, daemon.pid, log, args.messages, args.seed)
            alive = daemon.poll() is None
        finally:
            daemon.terminate()
            daemon.wait(timeout=60)
    print(f"{args.messages} messages (seed {args.seed}); daemon still up: {alive}")
    print("\n".join(report.lines()))


async def _until_pinged(url: str, timeout_s: float = 60.0) -> None:
    nc = await nats.connect(url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                await nc.request(subjects.HEALTH_PING, b"{}", timeout=1)
                return
            except nats.errors.Error:
                if time.monotonic() > deadline:
                    raise
    finally:
        await nc.close()


if __name__ == "__main__":
    main()
