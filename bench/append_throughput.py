"""EventLog append throughput versus raw JetStream publishes, same payloads, same server.

    python bench/append_throughput.py [--events 2000] [--rounds 5]

Both sides publish sequentially (each publish awaits its ack). The EventLog adds the
deterministic Nats-Msg-Id, the optimistic-concurrency headers on the task's subjects and
the event encoding; raw publishes send the already-encoded bytes with no headers. Rounds
alternate between the two so that drift on a shared machine hits both alike.
Target (issue #2): EventLog / raw >= 0.7.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import nats

from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import ChatMessage, Event, LLMCalled, Usage
from kernelflow.host.nats_server import EmbeddedNats


def sample_events(task_id: str, n: int) -> list[Event]:
    """LLM-call events of a realistic size (a ~1.5 KB prompt and a ~600 B answer)."""
    prompt = "Write a Triton kernel for the reference model below. " * 28
    return [
        LLMCalled(
            task_id=task_id,
            agent="coder",
            dispatch_id=f"{task_id}:d{i}",
            provider="scripted",
            model="bench",
            messages=[ChatMessage(role="user", content=prompt)],
            response_text="```python\nimport triton\n" + "x = 1\n" * 90 + "```",
            usage=Usage(input_tokens=400, output_tokens=150),
        )
        for i in range(n)
    ]


async def raw_round(log: EventLog, payloads: list[tuple[str, bytes]]) -> float:
    started = time.perf_counter()
    for subject, data in payloads:
        await log.publish_raw(subject, data)
    return len(payloads) / (time.perf_counter() - started)


async def eventlog_round(log: EventLog, events: list[Event]) -> float:
    history = TaskHistory(events[0].task_id)
    started = time.perf_counter()
    for event in events:
        history = await log.append(history, [event])
    return len(events) / (time.perf_counter() - started)


async def main(url: str, n: int, rounds: int) -> None:
    nc = await nats.connect(url)
    log = EventLog(nc)
    await log.ensure_streams()
    raw_rates, log_rates = [], []
    for r in range(rounds):
        raw_task, log_task = f"raw-{uuid.uuid4().hex[:8]}", f"log-{uuid.uuid4().hex[:8]}"
        raw_payloads = [
            (f"kf.ev.{raw_task}.llm_called", encode(e)) for e in sample_events(raw_task, n)
        ]
        raw_rates.append(await raw_round(log, raw_payloads))
        log_rates.append(await eventlog_round(log, sample_events(log_task, n)))
        print(f"round {r + 1}: raw {raw_rates[-1]:8.0f}/s   EventLog {log_rates[-1]:8.0f}/s")
    await nc.close()
    raw, ours = statistics.median(raw_rates), statistics.median(log_rates)
    size = len(encode(sample_events("x", 1)[0]))
    print(f"\n{n} sequential appends x {rounds} rounds, {size} B events, median of rounds")
    print(f"raw nats-py JetStream publish: {raw:8.0f} events/s")
    print(f"EventLog.append:               {ours:8.0f} events/s")
    print(f"ratio EventLog / raw:          {ours / raw:8.2f}   (target >= 0.70)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nats-url", help="measure against this server instead of a fresh one")
    args = parser.parse_args()
    if args.nats_url:
        asyncio.run(main(args.nats_url, args.events, args.rounds))
    else:
        with (
            tempfile.TemporaryDirectory(prefix="kf-bench-") as store,
            EmbeddedNats(Path(store)) as server,
        ):
            asyncio.run(main(server.url, args.events, args.rounds))
