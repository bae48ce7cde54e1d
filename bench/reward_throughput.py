"""Rewards per second from the verifier pool, against today's local ``compute_score``.

200 responses (correct, mismatching, non-compiling and cheating candidates over four
problems: relu, sigmoid and sum_rows in Triton, on the CPU interpreter here; tanh GELU in
C++, the ``cpp`` backend, which compiles; some responses asked twice, as a trainer's
group asks) are scored by:

  (a) ``compute_score(pool=False)``: a fresh sandbox process per call, as verl's reward
      workers call it (``--local-threads`` at once, default: the cores). A sample of about
      ``--sample`` responses (every kind of candidate of each backend) is timed; its rate
      is reported as a sample's, and the whole mix's estimated from its mean call per kind;
  (b) ``compute_score_async`` against the verifier pool of one ``kernelflow daemon
      --roles conductor,verifier --pool verifier=N`` on the embedded NATS, N = 1 then 2
      (a fresh data dir for each: nothing judged before), all 200 at once;
  (c) ``kernelflow serve-rewards`` (two verifiers, a fresh data dir), 200 POSTs of
      ``/v1/reward`` at once.

For each: rewards per second, p50 and p99 latency of a request (asked to answered; all
are asked at once, so a latency includes the wait for a verifier), and how many were
answered without a verification of their own (from the log, or by the same task's in
flight). Then the ratio (b)/(a) against the target (>= 10x), one check's time by backend
in each, and what one reward costs NATS (events and bytes recorded, the trainer's
connection's messages) and the object store (the built extension's size). Exit status 1
below the target.

The correct C++ kernel's extension is built once before any of it, into the machine's
default extension cache (a cold build takes 30-80 s here), which every configuration
shares, as a node's verifiers share it; a source that failed to compile there is
remembered too (it fails again at once).

    .venv/bin/python bench/reward_throughput.py [--sample 15] [--responses 200]
    .venv/bin/python bench/reward_throughput.py --kill-one

``--kill-one``: two daemons (one verifier each) on one embedded NATS; when half of the
200 are answered, the daemon that does not host the server is killed (SIGKILL, its
process group); every response must still be rewarded, and the log must hold exactly one
``verification_completed`` per task (``KF_ACK_WAIT=10``: a dispatch the killed verifier
held is redelivered 10 s later).

Ctrl-C (or SIGTERM) stops it cleanly: daemons and the server are stopped, temp dirs
removed. docs/bench.md, "Rewards from the verifier pool", has a run's numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelflow.actors.health_pings import ping_daemons  # noqa: E402
from kernelflow.events.codec import encode  # noqa: E402
from kernelflow.events.model import TaskSubmitted, VerificationCompleted  # noqa: E402
from kernelflow.integrations.verl import compute_score, compute_score_async  # noqa: E402
from kernelflow.rewards import shared_client  # noqa: E402
from kernelflow.verification.backends.extension import wanted_extensions  # noqa: E402
from kernelflow.verification.engine import VerifierConfig, verify  # noqa: E402
from kernelflow.verification.extensions import (  # noqa: E402
    default_cache_dir,
    planned_extensions,
    toolchain,
)

TARGET = 10.0
TRIALS = 1  # every configuration's, so each judges the same work
KERNELFLOW = [sys.executable, "-m", "kernelflow"]
EXAMPLES = ROOT / "examples"


# --------------------------------------------------------------------------- responses


@dataclass(frozen=True)
class Response:
    problem: str
    kind: str  # correct, mismatch, compile, cheat
    backend: str
    task: str  # the reference source (the row's ground truth)
    text: str  # what the model answered: the code in a fenced block

    def row(self) -> tuple[str, str, str, dict[str, Any]]:
        """compute_score's first arguments for the response."""
        info = {"kernelflow": {"kind": "kernel", "backend": self.backend}}
        return f"kernelflow/{self.backend}", self.text, self.task, info


def _read(path: str) -> str:
    return (EXAMPLES / path).read_text()


def _edit(code: str, old: str, new: str) -> str:
    assert old in code, f"{old!r} not in the candidate"
    return code.replace(old, new)


def _variants() -> dict[str, dict[str, list[str]]]:
    """Per problem, per kind, the distinct candidates (code)."""
    relu, sigmoid, rows = (
        _read("candidates/solutions/relu.py"),
        _read("candidates/solutions/sigmoid.py"),
        _read("candidates/solutions/sum_rows.py"),
    )
    gelu = _read("candidates/cpp/tanh_gelu_fused.py")
    return {
        "relu": {
            "correct": [
                _edit(relu, "BLOCK_SIZE = 1024", f"BLOCK_SIZE = {b}")
                for b in (256, 512, 1024, 2048)
            ],
            "mismatch": [
                _edit(relu, "tl.maximum(x, 0.0)", f"tl.maximum(x, {v})") for v in (0.01, 0.5)
            ],
            "compile": [
                _edit(relu, "tl.maximum(x, 0.0)", "tl.maximun(x, 0.0)"),
                _edit(
                    relu,
                    "def forward(self, x: torch.Tensor) -> torch.Tensor:",
                    "def forward(self, x)",
                ),
            ],
            "cheat": [
                _read(f"candidates/cheats/{c}.py")
                for c in ("torch_compute", "hidden_torch_op", "monkey_patch")
            ],
        },
        "sigmoid": {
            "correct": [sigmoid.replace("1024", str(b)) for b in (256, 512, 1024, 2048)],
            "mismatch": [
                _edit(sigmoid, "tl.exp(-x)", "tl.exp(x)"),
                _edit(sigmoid, "1.0 / (", "2.0 / ("),
            ],
            "compile": [
                _edit(sigmoid, "tl.exp(-x)", "tl.expp(-x)"),
                _edit(sigmoid, "return y", "return y)"),
            ],
            "cheat": [_edit(sigmoid, "return y", "return torch.sigmoid(x)")],
        },
        "sum_rows": {
            "correct": [
                _edit(rows, "BLOCK_SIZE=256", f"BLOCK_SIZE={b}") for b in (64, 128, 256, 512)
            ],
            "mismatch": [_edit(rows, "tl.sum(acc, axis=0)", "tl.max(acc, axis=0)")],
            "compile": [_edit(rows, "tl.zeros((BLOCK_SIZE,)", "tl.zeroes((BLOCK_SIZE,)")],
            "cheat": [_edit(rows, "return out", "return x.sum(dim=1)")],
        },
        "tanh_gelu": {
            # One C++ source among the correct ones (one build); the mismatch is Python's.
            "correct": [gelu],
            "mismatch": [
                _edit(gelu, "gelu.tanh_gelu(x)", "gelu.tanh_gelu(x.narrow(0, 0, x.shape[0] // 2))")
            ],
            "compile": [_edit(gelu, "#include <cmath>", "#include <cmath>\nthis is not C++;")],
            "cheat": [_read("candidates/cpp/aten_gelu.py")],
        },
    }


TASKS = {
    "relu": ("tasks/relu.py", "triton"),
    "sigmoid": ("tasks/sigmoid.py", "triton"),
    "sum_rows": ("tasks/sum_rows.py", "triton"),
    "tanh_gelu": ("kernelbench/level1/12_tanh_gelu.py", "cpp"),
}
# Of 200: responses per problem, and the share of each kind (the rest correct). A C++
# check costs ~20 s here (its timing, on the CPU), a Triton one under a second: the C++
# problem is asked less, and more of it again.
COUNTS = {"relu": 64, "sigmoid": 62, "sum_rows": 62, "tanh_gelu": 12}
SHARES = {"mismatch": 0.2, "compile": 0.15, "cheat": 0.15}
REPEATS = {"relu": 0.3, "sigmoid": 0.3, "sum_rows": 0.3, "tanh_gelu": 0.6}  # asked again


def responses(total: int = 200, seed: int = 7) -> list[Response]:
    """``total`` responses (200: the mix of COUNTS), shuffled; distinct responses differ by
    a comment where they share a candidate, as a model's samples do."""
    rng = random.Random(seed)
    variants = _variants()
    out: list[Response] = []
    for problem, count in COUNTS.items():
        count = max(1, round(count * total / 200))
        path, backend = TASKS[problem]
        task = _read(path)
        fresh = count - round(count * REPEATS[problem])
        kinds = [k for k, share in SHARES.items() for _ in range(max(1, round(fresh * share)))]
        kinds += ["correct"] * (fresh - len(kinds))
        distinct = []
        for n, kind in enumerate(kinds):
            pool = variants[problem][kind]
            code = f"# sample {n} of {problem}\n" + pool[n % len(pool)]
            distinct.append(Response(problem, kind, backend, task, f"```python\n{code}```\n"))
        out += distinct + [rng.choice(distinct) for _ in range(count - fresh)]
    rng.shuffle(out)
    return out[:total]


def stratified(items: list[Response], size: int, seed: int = 1) -> list[Response]:
    """About ``size`` of ``items``, each kind of each backend in its share (at least one
    of each: a C++ check costs another order of time than a Triton one)."""
    rng = random.Random(seed)
    by_kind: dict[tuple[str, str], list[Response]] = {}
    for r in items:
        by_kind.setdefault((r.backend, r.kind), []).append(r)
    picked = []
    for group in by_kind.values():
        share = max(1, round(size * len(group) / len(items)))
        picked += rng.sample(group, min(share, len(group)))
    rng.shuffle(picked)
    return picked


# --------------------------------------------------------------------------- processes


@contextlib.contextmanager
def daemon(
    data_dir: Path, verifiers: int, log: Path, **env: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``kernelflow daemon --roles conductor,verifier --pool verifier=N`` on the embedded
    NATS of ``data_dir``, in a session of its own; stopped (SIGTERM, then SIGKILL) after."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [
                *KERNELFLOW,
                "daemon",
                "--roles",
                "conductor,verifier",
                "--pool",
                f"verifier={verifiers}",
            ],
            cwd=ROOT,
            env=_env(data_dir, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for(log, "daemon started", proc)
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
    env.update(KF_DATA_DIR=str(data_dir), KF_EXTENSION_CACHE=str(default_cache_dir()), **extra)
    return env


def _wait_for(log: Path, text: str, proc: subprocess.Popen[Any], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"no {text!r} from {proc.args}:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


def wait_for_verifiers(daemons: int) -> None:
    """Until ``daemons`` daemons answer with their verifiers ready (warmed up: not part of
    what is timed)."""
    bridge = shared_client().start()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        answers = bridge.call(ping_daemons(bridge.requests, 0.5))
        ready = [
            a
            for a in answers
            if a.get("verifier") and all("backends" in v for v in a["verifier"].values())
        ]
        if len(ready) >= daemons:
            return
        time.sleep(0.5)
    sys.exit(f"the verifiers of {daemons} daemon(s) did not get ready within 180 s")


def configuration(name: str, tmp: Path) -> Path:
    """A fresh data dir, where this process's reward client (``shared_client``, the one
    compute_score_async uses) looks from now on."""
    data_dir = tmp / name
    os.environ["KF_DATA_DIR"] = str(data_dir)
    os.environ.pop("KF_NATS_URL", None)
    os.environ.pop("KF_REWARD_POOL", None)
    return data_dir


@contextlib.contextmanager
def client() -> Iterator[None]:
    """This process's reward client, closed after the block: before the daemons stop (a
    client of their embedded server would start one of its own once they are gone)."""
    try:
        yield
    finally:
        shared_client().close()


# --------------------------------------------------------------------------- measuring


@dataclass
class Result:
    name: str
    count: int
    wall_s: float
    latencies: list[float]
    shared: int  # answered without a verification of their own
    wrong: int  # rewards that are not what the candidate's kind should get

    @property
    def rate(self) -> float:
        return self.count / self.wall_s

    def line(self, note: str = "") -> str:
        p50 = statistics.median(self.latencies)
        p99 = _percentile(self.latencies, 0.99)
        return (
            f"{self.name:<37} {self.rate:7.2f} rewards/s  p50 {p50:6.2f} s  p99 {p99:6.2f} s  "
            f"from the log {self.shared:3d} of {self.count}{note}"
            + (f"  WRONG REWARDS: {self.wrong}" if self.wrong else "")
        )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _wrong(items: list[Response], scores: list[float]) -> int:
    return sum((s == 1.0) != (r.kind == "correct") for r, s in zip(items, scores, strict=True))


def local(items: list[Response], threads: int) -> Result:
    """(a): compute_score in this process, a fresh sandbox process per call."""

    def one(r: Response) -> tuple[float, float]:
        started = time.perf_counter()
        result = compute_score(*r.row(), trials=TRIALS, pool=False)
        assert isinstance(result, dict)
        return float(result["score"]), time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        done = list(pool.map(one, items))
    wall = time.perf_counter() - started
    scores = [s for s, _ in done]
    return Result(
        "(a) compute_score, local", len(items), wall, [t for _, t in done], 0, _wrong(items, scores)
    )


async def _pooled(
    items: list[Response], halfway: asyncio.Event | None = None
) -> tuple[float, list[dict[str, Any]], list[float]]:
    answered = 0

    async def one(r: Response) -> tuple[dict[str, Any], float]:
        nonlocal answered
        started = time.perf_counter()
        result = await compute_score_async(*r.row(), trials=TRIALS)
        assert isinstance(result, dict)
        answered += 1
        if halfway is not None and answered >= len(items) // 2:
            halfway.set()
        return result, time.perf_counter() - started

    started = time.perf_counter()
    done = await asyncio.gather(*(one(r) for r in items))
    return time.perf_counter() - started, [d for d, _ in done], [t for _, t in done]


def pooled(name: str, items: list[Response]) -> tuple[Result, list[dict[str, Any]]]:
    """(b): compute_score_async, all at once, on this process's shared client."""
    wall, results, latencies = asyncio.run(_pooled(items))
    judged = len({r["task_id"] for r in results if "task_id" in r})
    coded = sum("task_id" in r for r in results)
    scores = [float(r["score"]) for r in results]
    return Result(name, len(items), wall, latencies, coded - judged, _wrong(items, scores)), results


async def _over_http(
    url: str, items: list[Response]
) -> tuple[float, list[dict[str, Any]], list[float]]:
    import httpx2

    limits = httpx2.Limits(max_connections=len(items), max_keepalive_connections=len(items))
    async with httpx2.AsyncClient(base_url=url, timeout=900, limits=limits) as http:

        async def one(r: Response) -> tuple[dict[str, Any], float]:
            started = time.perf_counter()
            body = {"task": r.task, "response": r.text, "backend": r.backend, "trials": TRIALS}
            answer = await http.post("/v1/reward", json=body)
            assert answer.status_code == 200, answer.text
            return answer.json(), time.perf_counter() - started

        started = time.perf_counter()
        done = await asyncio.gather(*(one(r) for r in items))
    return time.perf_counter() - started, [d for d, _ in done], [t for _, t in done]


def over_http(url: str, items: list[Response]) -> Result:
    """(c): serve-rewards, a POST per response, all at once."""
    wall, results, latencies = asyncio.run(_over_http(url, items))
    # As for (b): a repeat asked while its task is judged waits for it (not from_log).
    coded = [r["task_id"] for r in results if r["task_id"] is not None]
    shared = len(coded) - len(set(coded))
    scores = [float(r["reward"]) for r in results]
    return Result(
        "(c) serve-rewards, 2 verifiers", len(items), wall, latencies, shared, _wrong(items, scores)
    )


@contextlib.contextmanager
def serving(data_dir: Path, log: Path) -> Iterator[str]:
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*KERNELFLOW, "serve-rewards", "--port", "0", "--max-in-flight", "256"],
            cwd=ROOT,
            env=_env(data_dir),
            stdout=subprocess.PIPE,
            stderr=out,
            text=True,
            start_new_session=True,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("kernelflow serve-rewards: http://"):
            sys.exit(f"serve-rewards did not start: {line}{log.read_text()[-2000:]}")
        yield line.split()[2].rstrip("/")
    finally:
        stop(proc, signal.SIGTERM)


def log_costs(expected_tasks: int) -> dict[str, float]:
    """What the log of this configuration holds per reward task: events, their bytes, and
    each task's verifications (read through the EventLog of this process's client)."""

    async def read(bridge: Any) -> list[Any]:
        return [event async for _, event in bridge.log.read(start_seq=1)]

    bridge = shared_client().start()
    events = bridge.call(read(bridge))
    tasks = {e.task_id for e in events}
    verifications = Counter(e.task_id for e in events if isinstance(e, VerificationCompleted))
    backends = {e.task_id: e.backend for e in events if isinstance(e, TaskSubmitted)}
    checks: dict[str, list[float]] = {}
    for e in events:
        if isinstance(e, VerificationCompleted):
            checks.setdefault(backends[e.task_id], []).append(e.report.duration_s)
    stats = bridge.nc.stats
    return {
        **{f"check_s:{b}": statistics.mean(d) for b, d in checks.items()},
        "tasks": len(tasks),
        "events": len(events) / max(1, len(tasks)),
        "bytes": sum(len(encode(e)) for e in events) / max(1, len(tasks)),
        "once": sum(verifications[t] == 1 for t in tasks),
        "expected": expected_tasks,
        "client_msgs": (stats["in_msgs"] + stats["out_msgs"]),
        "client_bytes": (stats["in_bytes"] + stats["out_bytes"]),
    }


def built_extensions() -> dict[str, int]:
    """The libraries built in the shared cache, by entry: their sizes."""
    return {p.parent.name: p.stat().st_size for p in default_cache_dir().glob("*/library.so")}


def kernel_library() -> Path:
    """Where the shared cache keeps the correct C++ kernel's library once built."""
    code = _variants()["tanh_gelu"]["correct"][0]
    toolchain_id = toolchain(sys.executable)
    [extension] = planned_extensions(wanted_extensions(code), default_cache_dir(), toolchain_id)
    return extension.library


def warm_extensions() -> float:
    """Build the correct C++ kernel once into the shared cache (found there if built)."""
    task, _ = TASKS["tanh_gelu"]
    config = VerifierConfig(trials=TRIALS, extension_cache=str(default_cache_dir()))
    started = time.perf_counter()
    report = verify(
        _read(task), _variants()["tanh_gelu"]["correct"][0], backend="cpp", config=config
    )
    if not report.passed:
        sys.exit(f"the C++ kernel did not pass: {report.summary}")
    return time.perf_counter() - started


# --------------------------------------------------------------------------- runs


def throughput(args: argparse.Namespace, tmp: Path) -> int:
    items = responses(args.responses)
    kinds = Counter(r.kind for r in items)
    distinct = len({r.text + r.task for r in items})
    print(
        f"{len(items)} responses ({distinct} distinct): "
        + ", ".join(f"{kinds[k]} {k}" for k in ("correct", "mismatch", "compile", "cheat"))
        + f"; problems {', '.join(f'{p} ({TASKS[p][1]})' for p in COUNTS)}; trials {TRIALS}; "
        f"{os.cpu_count()} cores here",
        flush=True,
    )
    library = kernel_library()
    found = library.exists()
    took = warm_extensions()
    print(
        f"the C++ kernel checked once, its extension {'found' if found else 'built'} in the "
        f"shared cache ({default_cache_dir()}): {took:.1f} s",
        flush=True,
    )

    sample = stratified(items, args.sample)
    a = local(sample, args.local_threads)
    print(a.line(f"  (a sample of {len(sample)}, {args.local_threads} at once)"), flush=True)
    local_s: dict[tuple[str, str], list[float]] = {}
    for r, took in zip(sample, a.latencies, strict=True):
        local_s.setdefault((r.backend, r.kind), []).append(took)
    # The sample has every kind of candidate of each backend, not in the mix's shares:
    # the mix's rate, from the sample's mean call of each.
    a_rate = len(items) / (
        sum(statistics.mean(local_s[r.backend, r.kind]) for r in items) / args.local_threads
    )
    print(
        f"{'':<37} {a_rate:7.2f} rewards/s for the whole mix, estimated from the sample's "
        "mean call by backend and kind",
        flush=True,
    )
    by_backend: dict[str, list[float]] = {}
    for (backend, _), took in local_s.items():
        by_backend.setdefault(backend, []).extend(took)

    built_before = built_extensions()
    results: list[Result] = []
    costs: dict[str, float] = {}
    for verifiers in (1, 2):
        data_dir = configuration(f"b{verifiers}", tmp)
        with daemon(data_dir, verifiers, tmp / f"b{verifiers}.log"), client():
            wait_for_verifiers(1)
            shared_client().start().nc.stats.update(in_msgs=0, out_msgs=0, in_bytes=0, out_bytes=0)
            b, answers = pooled(
                f"(b) compute_score_async, {verifiers} verifier{'s' * (verifiers > 1)}", items
            )
            print(b.line(), flush=True)
            results.append(b)
            if verifiers == 1:
                costs = log_costs(len({a["task_id"] for a in answers if "task_id" in a}))
                costs["client_msgs"] /= len(items)
                costs["client_bytes"] /= len(items)
    data_dir = configuration("c", tmp)
    with daemon(data_dir, 2, tmp / "c.log"), client():
        wait_for_verifiers(1)
        with serving(data_dir, tmp / "serve.log") as url:
            c = over_http(url, items)
    print(c.line(), flush=True)

    print()
    for b in results:
        print(
            f"ratio {b.name.removeprefix('(b) ')} / (a): {b.rate / a_rate:5.1f}x "
            f"(target >= {TARGET:g}x)"
        )
    print(f"ratio (c) / (a): {c.rate / a_rate:5.1f}x")
    print(
        "one check, by backend (a: a local call, 2 at once; b: the verifier's own time, "
        "from the log of (b), 1 verifier): "
        + "; ".join(
            f"{b}: a {statistics.mean(t):.2f} s, b {costs[f'check_s:{b}']:.2f} s "
            f"({statistics.mean(t) / costs[f'check_s:{b}']:.1f}x)"
            for b, t in sorted(by_backend.items())
            if f"check_s:{b}" in costs
        )
    )
    new = len(set(built_extensions()) - set(built_before))
    so = library.stat().st_size
    print(
        f"per reward task (log of (b), 1 verifier): {costs['events']:.1f} events, "
        f"{costs['bytes'] / 1024:.1f} KiB of events; {costs['once']:.0f} of {costs['tasks']:.0f} "
        f"tasks verified exactly once; the trainer's connection: "
        f"{costs['client_msgs']:.1f} messages, {costs['client_bytes'] / 1024:.1f} KiB per request"
    )
    print(
        f"the C++ kernel's built extension (library.so): {so / 1024 / 1024:.2f} MiB, built once "
        f"before (a); extensions built during (a), (b) and (c): {new}"
    )
    wrong = a.wrong + c.wrong + sum(b.wrong for b in results)
    best = max(b.rate for b in results) / a_rate
    return 0 if best >= TARGET and not wrong else 1


def kill_one(args: argparse.Namespace, tmp: Path) -> int:
    items = responses(args.responses)
    data_dir = configuration("kill", tmp)
    with daemon(data_dir, 1, tmp / "first.log", KF_ACK_WAIT="10"), client():
        # The second joins the first's embedded server: killing it kills a verifier only.
        with daemon(data_dir, 1, tmp / "second.log", KF_ACK_WAIT="10") as second:
            wait_for_verifiers(2)

            async def run() -> tuple[float, list[dict[str, Any]], list[float]]:
                halfway = asyncio.Event()
                scoring = asyncio.ensure_future(_pooled(items, halfway))
                await halfway.wait()
                os.killpg(second.pid, signal.SIGKILL)
                print(f"halfway: killed the second daemon (pid {second.pid}, SIGKILL)", flush=True)
                return await scoring

            wall, answers, latencies = asyncio.run(run())
        ids = {a["task_id"] for a in answers if "task_id" in a}
        costs = log_costs(len(ids))
    wrong = _wrong(items, [float(a["score"]) for a in answers])
    print(
        f"rewarded {len(answers)} of {len(items)} in {wall:.1f} s "
        f"(p99 {_percentile(latencies, 0.99):.1f} s); "
        f"{wrong} rewards not what the candidate deserves; {costs['once']:.0f} of {len(ids)} tasks "
        f"with exactly one verification_completed ({costs['tasks']:.0f} tasks in the log)"
    )
    ok = len(answers) == len(items) and not wrong and costs["once"] == len(ids) == costs["tasks"]
    print("ok" if ok else "FAILED")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--responses", type=int, default=200)
    p.add_argument("--sample", type=int, default=15, help="responses (a) times (default 15)")
    p.add_argument(
        "--local-threads", type=int, default=os.cpu_count() or 1, help="(a)'s calls at once"
    )
    p.add_argument("--kill-one", action="store_true", help="the kill run instead (see above)")
    args = p.parse_args()
    # Ctrl-C and SIGTERM unwind alike (daemons stopped, temp dirs removed), also where the
    # shell started this without job control (SIGINT ignored, and so in every child).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with tempfile.TemporaryDirectory(prefix="kf-reward-bench-") as tmp:
        try:
            return (kill_one if args.kill_one else throughput)(args, Path(tmp))
        except KeyboardInterrupt:
            print("\ninterrupted: daemons stopped, temp dirs removed", file=sys.stderr)
            return 130


if __name__ == "__main__":
    raise SystemExit(main())
