"""Replay speed: folding the log into every projection vs just reading and decoding it.

Generates a synthetic log of N events with realistic sizes (LLM prompts of a few KB,
kernels of ~1.5 KB), writes it to JetStream (an embedded nats-server in a temp dir unless
--nats-url) and to an exported log file, then times, in the same run:

- raw: read + decode every event, through the offline tools' own sources (live:
  ``live_events``; file: ``FileSource``, read + decode + SHA-256 + order checks);
- replay: the same read folded into all projections (task state + repeat counters +
  trajectory per task, built when the task ends, and run metrics);
- dataset: ``export_grpo`` (two passes: metrics, then samples to parquet), against two
  raw passes.

Prints events/s, the ratio replay/raw (target >= 0.5) and peak RSS after each phase
(streaming: it should not grow with N). Each source is timed over several rounds of the
three phases, and the summary gives the median ratios: on a shared VM the speed of the
same code drifts by a third over minutes, and each round compares phases run back to back.

    .venv/bin/python bench/replay_speed.py --events 1000000 [--rounds 3] [--sources file]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog
from kernelflow.events.model import (
    AgentDispatched,
    ChatMessage,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    TaskFinished,
    TaskSubmitted,
    Usage,
    VerificationCompleted,
    VerificationReport,
    ends_task,
)
from kernelflow.host.nats_server import EmbeddedNats
from kernelflow.offline.grpo import export_grpo
from kernelflow.offline.sources import EventFilter, FileSource, Source, live_events
from kernelflow.projections import logfile
from kernelflow.projections.counters import repeat_counters
from kernelflow.projections.flow_grpo import GrpoOptions
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.projections.statistics import projection_metrics
from kernelflow.projections.task_state import TaskState, apply
from kernelflow.projections.trajectory import build_trajectory

SOURCE = "import torch\n" + "# reference model line\n" * 40
CODE = "import triton\n" + "    x = tl.load(ptr + offs, mask=m)  # kernel line\n" * 30
PROMPT = "You write Triton kernels. Context and history follow.\n" + "history line " * 200


def task_events(i: int, t0: float) -> list[Event]:
    """One task: designer, two coder/verifier rounds (fail, pass) — 22 events."""
    tid = f"b{i:07d}"
    out: list[Event] = []

    def add(e: Event) -> None:
        out.append(msgspec.structs.replace(e, seq=len(out) + 1, at=t0 + len(out) * 0.01))

    add(
        TaskSubmitted(
            task_id=tid,
            cause="cmd:1",
            task_name="relu",
            task_source=SOURCE,
            workflow_name="default",
            workflow_yaml="agent_info: {}",
            backend="triton",
            group_id=f"g{i // 4}",
        )
    )
    rounds = [
        ("designer", None),
        ("coder", None),
        ("verifier", "mismatch"),
        ("coder", None),
        ("verifier", "pass"),
    ]
    for step, (agent, verdict) in enumerate(rounds, 1):
        did = f"{tid}:d{step}"
        add(
            ConductorDecided(
                task_id=tid,
                after_agent="",
                options=[agent],
                mode="auto",
                chosen=agent,
                reason="next",
            )
        )
        add(AgentDispatched(task_id=tid, agent=agent, step=step, dispatch_id=did))
        if verdict is None:
            add(
                LLMCalled(
                    task_id=tid,
                    agent=agent,
                    dispatch_id=did,
                    provider="bench",
                    model="m",
                    messages=[
                        ChatMessage(role="system", content=PROMPT[:400]),
                        ChatMessage(role="user", content=PROMPT),
                    ],
                    response_text=CODE,
                    usage=Usage(input_tokens=900, output_tokens=400),
                    latency_s=1.0,
                )
            )
            add(OutputParsed(task_id=tid, agent=agent, dispatch_id=did, fields={"code": CODE}))
        else:
            report = VerificationReport(
                verdict=verdict, summary=verdict, speedup=1.2 if verdict == "pass" else None
            )  # type: ignore[arg-type]
            add(
                VerificationCompleted(
                    task_id=tid, agent="verifier", dispatch_id=did, code=CODE, report=report
                )
            )
    add(
        TaskFinished(
            task_id=tid, status="success", reason="ok", final_code=CODE, verdict="pass", speedup=1.2
        )
    )
    return out


def synthetic(n_events: int, concurrent: int = 64) -> Iterator[Event]:
    """Tasks interleaved ``concurrent`` at a time, as a busy daemon records them."""
    per_task = len(task_events(0, 0.0))
    n_tasks = max(1, n_events // per_task)
    for base in range(0, n_tasks, concurrent):
        batch = [task_events(i, 1e9 + i) for i in range(base, min(n_tasks, base + concurrent))]
        for k in range(per_task):
            for h in batch:
                yield h[k]


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# The repeat patterns the counters track (a workflow's ``sequence_patterns``).
SEQUENCES = {"cv": ["coder", "verifier"]}


class AllProjections:
    """Task state, counters and trajectory of each task (built when it ends), and the
    run metrics: what a full replay maintains."""

    def __init__(self) -> None:
        self.metrics = MetricsProjection()
        self.open: dict[str, tuple[TaskState, list[Event]]] = {}
        self.trajectories = 0
        self.steps = 0

    def apply(self, pos: int, e: Event) -> None:
        self.metrics.apply(pos, e)
        opened = self.open.get(e.task_id)
        if opened is None:
            opened = self.open[e.task_id] = (TaskState(e.task_id), [])
        state, events = opened
        apply(state, e)
        events.append(e)
        if ends_task(e):
            del self.open[e.task_id]
            self.steps += repeat_counters(state.history, SEQUENCES).step
            self.trajectories += len(build_trajectory(e.task_id, events).steps) > 0


class LoopSource(Source):
    """The live log through ``live_events``, as ``kernelflow replay`` reads it, on this
    script's own event loop (no daemon bridge)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, log: EventLog) -> None:
        self.loop, self.log = loop, log
        self.description = {"live": subjects.EVENTS_STREAM}

    def _feed(self, apply, end):  # type: ignore[no-untyped-def]
        async def run() -> int:
            last = 0
            events = live_events(self.log, EventFilter(), end)
            async with contextlib.aclosing(events):
                async for seq, e in events:
                    apply(seq, e)
                    last = seq
            return last

        return self.loop.run_until_complete(run())


def timed(label: str, n: int, fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    print(
        f"  {label:<34} {n / dt:>10,.0f} events/s  {dt:7.1f}s  peak RSS {rss_mb():7.0f} MB",
        flush=True,
    )
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--nats-url", help="use this server (its KF_EVENTS stream must be empty)")
    ap.add_argument(
        "--rounds", type=int, default=3, help="raw/replay/dataset rounds per source (median)"
    )
    ap.add_argument(
        "--sources",
        default="jetstream,file",
        help="which sources to time (the log is written to JetStream and exported either way)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.nats_url:
            run(args.nats_url, args.events, args.rounds, Path(tmp), args.sources)
        else:
            with EmbeddedNats(Path(tmp) / "nats") as server:
                run(server.url, args.events, args.rounds, Path(tmp), args.sources)


def run(url: str, n_target: int, rounds: int, tmp: Path, sources: str) -> None:
    wanted = {name.strip().lower() for name in sources.split(",") if name.strip()}
    if not wanted or not wanted <= {"jetstream", "file"}:
        raise SystemExit(f"--sources {sources!r}: expected jetstream, file or both")
    loop = asyncio.new_event_loop()
    nc = loop.run_until_complete(nats.connect(url, pending_size=64 * 1024 * 1024))
    log = EventLog(nc)
    loop.run_until_complete(log.ensure_streams())
    print(f"generating ~{n_target:,} events into JetStream ({url})", flush=True)

    async def fill() -> tuple[int, int]:
        # Publishes acknowledged a window at a time: fire-and-forget publishes outrun
        # JetStream on a slow disk and some are dropped. Within a window they stay in order
        # (one connection), so every task's events are stored in sequence.
        n = size = 0
        inbox = nc.new_inbox()
        acks: list[bytes] = []
        window_done = asyncio.Event()
        window = 0

        async def on_ack(msg) -> None:  # type: ignore[no-untyped-def]
            acks.append(msg.data)
            if len(acks) >= window:
                window_done.set()

        sub = await nc.subscribe(inbox, cb=on_ack)

        async def settle() -> None:
            await nc.flush()
            await asyncio.wait_for(window_done.wait(), 60)
            failed = [a for a in acks if b'"error"' in a]
            assert not failed, f"JetStream refused events: {failed[0]!r}"
            acks.clear()
            window_done.clear()

        for e in synthetic(n_target):
            data = encode(e)
            await nc.publish(
                subjects.event_subject(e), data, reply=inbox, headers={"Nats-Msg-Id": e.event_id}
            )
            n += 1
            window += 1
            size += len(data)
            if window == 2000:
                await settle()
                window = 0
        if window:
            await settle()
        await sub.unsubscribe()
        return n, size

    t = time.perf_counter()
    n, size = loop.run_until_complete(fill())
    print(
        f"  wrote {n:,} events ({size / 1e6:,.0f} MB) in {time.perf_counter() - t:.1f}s; "
        f"peak RSS {rss_mb():.0f} MB"
    )
    stored = loop.run_until_complete(log.end_seq())  # the stream held nothing before
    assert stored == n, f"stream holds {stored} of {n} events"

    live = LoopSource(loop, log)
    path = tmp / "log.jsonl"
    writer = logfile.LogWriter()
    with path.open("wb") as f:
        f.write(writer.header())
        t = time.perf_counter()
        live.feed(lambda _, e: f.write(writer.record(e)))
        f.write(writer.trailer())
    print(
        f"  exported to a file ({path.stat().st_size / 1e6:,.0f} MB) "
        f"in {time.perf_counter() - t:.1f}s"
    )

    results = {}
    timed_sources = [("JetStream", live), ("file", FileSource(path, EventFilter()))]
    for name, source in [(n, s) for n, s in timed_sources if n.lower() in wanted]:
        print(f"{name}:")
        ratios = []
        for r in range(rounds):
            print(f" round {r + 1}:")
            ratios.append(one_round(source, n, tmp / f"{name}.parquet"))
        replay = statistics.median(a for a, _ in ratios)
        dataset = statistics.median(b for _, b in ratios)
        results[name] = (replay, dataset)
        print(f"  median over {rounds} rounds: replay/raw {replay:.2f}   dataset/raw {dataset:.2f}")
    loop.run_until_complete(nc.close())
    loop.close()
    print(
        "summary (target >= 0.5): "
        + "; ".join(f"{k}: replay {a:.2f}, dataset {b:.2f}" for k, (a, b) in results.items())
    )


def one_round(source: Source, n: int, out: Path) -> tuple[float, float]:
    """Raw read, replay and dataset export one after the other; their ratios."""
    count = [0]

    def tick(*_: object) -> None:
        count[0] += 1

    raw = timed("raw read + decode", n, lambda: source.feed(tick))
    assert count[0] == n
    proj = AllProjections()
    replay = timed("replay into all projections", n, lambda: source.feed(proj.apply))
    m = projection_metrics(proj.metrics)
    assert m.tasks == proj.trajectories and not proj.open
    dataset = timed(
        "dataset export (2 passes)", 2 * n, lambda: export_grpo(source, out, GrpoOptions())
    )
    print(f"  ratio replay/raw {raw / replay:.2f}   dataset/raw {2 * raw / dataset:.2f}")
    return raw / replay, 2 * raw / dataset


if __name__ == "__main__":
    main()
