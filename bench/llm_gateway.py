"""The LLM gateway under a burst: 200 concurrent calls through the anthropic provider (the
real SDK, real HTTP on loopback) to a local Anthropic-compatible server that answers every
request after a fixed delay.

Ideal time = delay x ceil(calls / concurrency limit): what a perfect gateway holding
exactly ``limit`` calls in flight would take. Prints the measured time, the ratio
(target <= 1.15) and the latency the gateway adds to each call (the successful attempt's
time minus the server's delay), p50 and p99.

    python bench/llm_gateway.py [--calls 200] [--limit 16] [--delay 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kernelflow.events.model import ChatMessage  # noqa: E402
from kernelflow.llm import make_provider  # noqa: E402
from kernelflow.llm.base import LLMRequest  # noqa: E402
from kernelflow.llm.config import Limits, LLMConfig  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def burst(calls: int, limit: int) -> tuple[float, list[float], int]:
    provider = make_provider(
        "anthropic:claude-bench", LLMConfig(limits=Limits(max_concurrency=limit, timeout_s=60))
    )
    gateway = provider.gateway("anthropic")

    def request(i: int) -> LLMRequest:
        messages = [
            ChatMessage(role="system", content="You are the coder. " * 50),
            ChatMessage(role="user", content=f"call {i}: write a kernel"),
        ]
        return LLMRequest(task_id=f"bench-{i}", agent="coder", call_index=0, messages=messages)

    await provider.complete(request(-1))  # warm up: SDK import, first connection
    gateway.timings.clear()
    started = time.perf_counter()
    await asyncio.gather(*(provider.complete(request(i)) for i in range(calls)))
    elapsed = time.perf_counter() - started
    return elapsed, [t.service_s for t in gateway.timings], gateway.peak_in_flight


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.25)
    args = parser.parse_args()
    # The server runs in its own process, so its threads do not compete with the gateway
    # for this interpreter's GIL.
    serve = ["-m", "tests.fake_llm_servers", "anthropic", "--delay", str(args.delay)]
    server = subprocess.Popen(
        [sys.executable, *serve, "--api-key", "bench-key"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        os.environ["ANTHROPIC_BASE_URL"] = server.stdout.readline().strip()
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        elapsed, service, peak = asyncio.run(burst(args.calls, args.limit))
    finally:
        server.terminate()
        server.wait()
    ideal = args.delay * math.ceil(args.calls / args.limit)
    added = [(s - args.delay) * 1000 for s in service]
    print(
        f"{args.calls} calls, concurrency limit {args.limit}, "
        f"server delay {args.delay * 1000:.0f} ms"
    )
    print(f"measured {elapsed:.3f} s   ideal {ideal:.3f} s   ratio {elapsed / ideal:.3f}")
    print(
        f"added latency per call: p50 {percentile(added, 0.50):.1f} ms   "
        f"p99 {percentile(added, 0.99):.1f} ms   mean {statistics.fmean(added):.1f} ms"
    )
    print(f"peak calls in flight: {peak} (limit {args.limit})")
    print("target: ratio <= 1.15:", "met" if elapsed / ideal <= 1.15 else "NOT met")


if __name__ == "__main__":
    main()
