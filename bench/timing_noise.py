"""The timing's own noise, and whether the verifier says so: a kernel timed against itself,
or against a slower reference, by the real verifier, on a quiet or a loaded machine.

    python bench/timing_noise.py [--mode self|faster] [--runs 3] [--hog N] [--threads N]
                                 [--extra S] [--old]

``--mode self`` (default): the reference of the task is the fused C++ GELU of
examples/candidates/cpp/ (its module, with ``ModelNew`` renamed ``Model``), the candidate
is the same module: the verifier builds and times the same code in the judge's process
(the baseline) and in the candidate's (``kernelflow verify --backend cpp``'s path,
interleaved rounds and all). The true ratio is 1, so every conclusive speedup is wrong:
a run must come out inconclusive (the interval holds 1, or spans more than 2x). The judge
compiles its copy in each run (its sandbox starts empty): a run takes about a compile's
time.

``--mode faster``: the same fused kernel against the task it was written for
(examples/kernelbench/level1/12_tanh_gelu.py, eager PyTorch's unfused tanh GELU, at
1024 x 1024): truly faster, so a conclusive speedup above 1 is right, one below 1 wrong.
On a quiet machine the runs should be conclusive: the rule does not hide real speedups.

``--hog N`` starts N busy processes (pure Python loops) that load the cores while the runs
go, and stops them at the end, on Ctrl-C and on SIGTERM alike (each also ends when this
process does). ``--extra S``: the seconds of more rounds an inconclusive speedup gets
(``VerifierConfig.timing_extra_s``, default 10). ``--old``: the committed logic before
speedups said whether they were conclusive (6 rounds, no more, no timing slot), printed
as it printed them, with what the rule says of each.

Each run prints the speedup, its 95 % interval, whether it is conclusive, the rounds and
the load average; the summary, how many runs gave a confident figure on the wrong side of
1 (the target: 0).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from kernelflow.verification.engine import VerifierConfig, verify

REPO = Path(__file__).resolve().parent.parent
KERNEL = REPO / "examples/candidates/cpp/tanh_gelu_fused.py"
UNFUSED = REPO / "examples/kernelbench/level1/12_tanh_gelu.py"
SIZES = """

batch_size = 512
dim = 512


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
"""
# A busy loop that ends when the process that started it does (its parent changes).
HOG = (
    "import os, sys\n"
    "parent = int(sys.argv[1])\n"
    "while os.getppid() == parent:\n"
    "    sum(range(100000))\n"
)


def self_task() -> str:
    """The kernel's module as a task: its ``ModelNew`` as the reference ``Model``."""
    return KERNEL.read_text().replace("class ModelNew(", "class Model(") + SIZES


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the hogs are stopped on the way out


@contextmanager
def hogs(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` busy processes for the duration of the block; stopped however it ends."""
    started: list[subprocess.Popen[bytes]] = []
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        for _ in range(count):
            started.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOG, str(os.getpid())],
                    start_new_session=True,  # Ctrl-C reaches this process, which stops them
                )
            )
        yield started
    finally:
        for hog in started:
            hog.terminate()
        for hog in started:
            try:
                hog.wait(5)
            except subprocess.TimeoutExpired:
                hog.kill()
                hog.wait()
        signal.signal(signal.SIGTERM, previous)


def conclusive(interval: list[float]) -> bool:
    """The rule (kernelflow.projections.speedups.interval_conclusive), for --old's runs."""
    from kernelflow.projections.speedups import interval_conclusive

    return bool(interval_conclusive(interval))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--mode", choices=["self", "faster"], default="self")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--threads", type=int, help="CPU threads of the timing (default: every core)")
    p.add_argument("--hog", type=int, default=0, metavar="N", help="busy processes meanwhile")
    p.add_argument("--extra", type=float, default=10.0, help="seconds of more rounds (0: none)")
    p.add_argument("--old", action="store_true", help="the logic before conclusive speedups")
    p.add_argument("--cache", help="extension cache dir (default: a temporary one)")
    args = p.parse_args()
    if args.mode == "self":
        task, shapes = self_task(), ({},)
    else:
        task, shapes = UNFUSED.read_text(), ({"batch_size": 1024, "dim": 1024},)
    truth = "1 (the kernel against itself)" if args.mode == "self" else "above 1"
    label = "old logic (6 rounds, no more)" if args.old else f"up to {args.extra:g} s more"
    print(f"{args.mode}: true speedup {truth}; {args.hog} hog(s); {label}", flush=True)
    confident = wrong = right = inconclusive = 0
    with tempfile.TemporaryDirectory(prefix="kf-noise-") as scratch, hogs(args.hog):
        config = VerifierConfig(
            extension_cache=args.cache or scratch,
            trials=1,
            shapes=shapes,
            threads=args.threads,
            timing_extra_s=0.0 if args.old else args.extra,
            timing_slots=0 if args.old else 1,
            timing_lock_dir=str(Path(scratch, "timing")),
        )
        for run in range(1, args.runs + 1):
            report = verify(task, KERNEL.read_text(), backend="cpp", config=config)
            timing = report.timing
            if report.speedup is None or timing is None:
                sys.exit(f"run {run}: {report.verdict}: {report.summary} {report.errors}")
            low, high = timing.speedup_ci95
            sure = conclusive([low, high])
            if args.old:
                # It printed every figure as it was: each a confident claim.
                rule = "conclusive" if sure else "inconclusive"
                said = f"printed as a figure; the rule: {rule}"
                sure = True
            else:
                said = "conclusive" if report.speedup_conclusive else "INCONCLUSIVE"
            if not sure:
                inconclusive += 1
            else:
                confident += 1
                wrong_side = args.mode == "self" or report.speedup < 1.0
                wrong += wrong_side
                right += not wrong_side
            print(
                f"run {run}: speedup {report.speedup:.3f}x, 95 % interval [{low:.3f}, "
                f"{high:.3f}], {said}; {timing.rounds} rounds of {timing.reps} calls, "
                f"{timing.threads} thread(s); load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    runs = confident + inconclusive
    print(
        f"summary ({args.mode}, {args.hog} hog(s), {'old' if args.old else 'new'} logic): "
        f"{runs} runs: {confident} confident figure(s), {wrong} on the wrong side of 1 "
        f"(target 0; truth {truth}), {right} right, {inconclusive} inconclusive"
    )


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        print("interrupted (the hogs are stopped)", file=sys.stderr)
        sys.exit(130)
