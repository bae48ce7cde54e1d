"""What a search costs beyond its candidates: the driver's own time per candidate.

    python bench/search_overhead.py [--strategy evolve] [--generations 3] [--delay 1.0]

An evolutionary search over the relu example (2 islands x 2 children a generation by
default), with a scripted model answering each LLM call after ``--delay`` seconds and the
real verifier (Triton in its CPU interpreter here), on a fresh embedded nats-server and an
in-process daemon, as ``kernelflow bench`` runs it. The driver's overhead is the time its
thread spends planning generations, folding the log into the search's database and
submitting candidates (``SearchRunner.overhead_s``), everything but waiting for the
candidates' LLM calls and verifications. The baseline, from the same run, is a candidate's
own time: from its submission to its end, read from the log.

Target (issue #30): overhead per candidate <= 5 % of a candidate's time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import CONDUCTOR_ROLE, Daemon, DaemonConfig
from kernelflow.actors.verifier import WarmUps
from kernelflow.host.nats_server import EmbeddedNats
from kernelflow.llm.scripted import ScriptedProvider
from kernelflow.search.driver import SearchRunner, SearchTask
from kernelflow.search.strategies import SearchConfig
from kernelflow.workflows.loader import load_workflow

REPO = Path(__file__).resolve().parent.parent


def scripted_model(workdir: Path, delay: float) -> Path:
    """The relu script's coder, every answer after ``delay``: its first answer is wrong for
    every other candidate (by number), so generations have failures to build on."""
    relu = yaml.safe_load((REPO / "examples/scripted/relu.yaml").read_text())
    good, bad = relu["coder"][1], relu["coder"][0]
    for entry in (good, bad):
        entry["latency_s"] = delay
    conductor = {**relu["conductor"][0], "latency_s": delay}
    script = {"coder": [{"choices": [good, bad]}, good, good], "conductor": [conductor] * 3}
    path = workdir / "script.yaml"
    path.write_text(yaml.safe_dump(script))
    return path


def one_run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    workflow, workflow_yaml = load_workflow("coder_only")
    search = SearchTask(
        search_id="bench-overhead",
        task_name="relu",
        task_source=(REPO / "examples/tasks/relu.py").read_text(),
        workflow=workflow.name,
        workflow_yaml=workflow_yaml,
        settings=SearchConfig(
            strategy=args.strategy,
            samples=args.samples,
            generations=args.generations,
            islands=args.islands,
            seed=1,
        ),
    )
    with EmbeddedNats(workdir / "nats") as server:
        bridge = Bridge(server.url).start()
        daemon = Daemon(
            bridge,
            DaemonConfig(
                roles=(CONDUCTOR_ROLE, *workflow.agents),
                llm=ScriptedProvider(scripted_model(workdir, args.delay)),
                pool_sizes={"coder": args.concurrency},
            ),
        ).start()
        # The sandbox readied before the clock starts, as a daemon's is by its first task.
        while any(w["state"] == WarmUps.WARMING for w in daemon.warm_ups.describe().values()):
            time.sleep(0.1)
        started = time.perf_counter()
        runner = SearchRunner(bridge, [search], concurrency=args.concurrency)
        db = runner.run()["bench-overhead"]
        wall = time.perf_counter() - started
        daemon.stop()
        bridge.stop()
    spans = [
        c.ended_at - c.submitted_at
        for c in db.ordered()
        if c.ended_at is not None and c.submitted_at is not None
    ]
    n = len(db.candidates)
    return {
        "candidates": n,
        "wall_s": wall,
        "candidate_s": statistics.fmean(spans),
        "overhead_per_candidate_s": runner.overhead_s / n,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", default="evolve")
    p.add_argument("--generations", type=int, default=3)
    p.add_argument("--islands", type=int, default=2)
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--delay", type=float, default=1.0, help="seconds per scripted LLM answer")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="kf-bench-") as tmp:
        r = one_run(args, Path(tmp))
    ratio = r["overhead_per_candidate_s"] / r["candidate_s"]
    print(
        f"{args.strategy}: {r['candidates']:.0f} candidates in {r['wall_s']:.1f}s; a candidate "
        f"takes {r['candidate_s']:.2f}s (submission to end, baseline); the driver spends "
        f"{1000 * r['overhead_per_candidate_s']:.1f} ms per candidate planning, folding and "
        f"submitting: ratio {ratio:.4f} (target <= 0.05)"
    )
    sys.exit(0 if ratio <= 0.05 else 1)


if __name__ == "__main__":
    main()
