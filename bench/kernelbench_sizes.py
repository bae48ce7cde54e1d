"""The verifier's CPU size policy over every KernelBench level-1 and level-2 problem.

For each problem file under ``KernelBench/level{1,2}/`` of ROOT (a checkout of
github.com/ScalingIntelligence/KernelBench, or its git directory, read at HEAD) it asks
the policy for shape sets (:func:`kernelflow.verification.shapes.auto_shape_sets`,
device "cpu"), executes the task module with each set's overrides as the verifier's
sandbox does (:func:`kernelflow.verification.child.taskload.load_task`) and prints how
many problems get at least two sets, how many derive shapes at import and whether those
follow the overrides, and the largest input tensor the sets give. ``--verify-reference``
also builds and runs each shrunk reference on the CPU: its time, the largest tensor it
touches (inputs, parameters, outputs), and the sets it fails on (the verifier skips
those; where that is every set it checks the fallback sets, sizes scaled together,
:func:`kernelflow.verification.shapes.fallback_shape_sets`); its last line says how
many problems kept all their shape sets (the reference runs on every set the verifier
checks, none skipped) and names any that did not.

    .venv/bin/python bench/kernelbench_sizes.py PATH/TO/KernelBench [--verify-reference]

Runs the problems' own code in this process: point it at KernelBench only.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernelflow.verification.child.taskload import load_task  # noqa: E402
from kernelflow.verification.shapes import (  # noqa: E402
    auto_shape_sets,
    fallback_shape_sets,
    input_shapes,
)
from kernelflow.verification.taskfile import task_constants  # noqa: E402

LEVELS = "KernelBench/level[12]/*.py"


@dataclass
class Problem:
    name: str
    sets: list[dict[str, int]]
    derived: list[str]  # module-level names computed from the sizes at import
    derived_follow: bool = True
    max_input: int = 0  # elements of the largest input tensor, any set (static)
    seconds: list[float] = field(default_factory=list)  # reference run per set
    max_touched: int = 0  # elements of the largest tensor the reference touched
    failures: list[tuple[int, str]] = field(default_factory=list)  # (set index, error)
    fallback: list[dict[str, int]] = field(default_factory=list)  # checked where every set fails
    fallback_failures: list[tuple[int, str]] = field(default_factory=list)  # (set index, error)
    fallback_error: str | None = None  # the reference fails on every fallback set too

    @property
    def kept(self) -> bool:
        """The reference runs on every set the verifier checks: the policy's sets, or
        (where it fails on all of them) the fallback sets; none is skipped."""
        if not self.failures:
            return True
        every = len(self.failures) == len(self.sets)
        return every and bool(self.fallback) and not self.fallback_failures


def problems(root: Path) -> list[tuple[str, str]]:
    """(``level1/19_ReLU.py``, source) for every problem under ``root``: a checkout, or a
    git directory without a work tree (as ``fetch`` leaves a mirror), read at HEAD."""

    def number(name: str) -> tuple[str, int]:
        level, file = name.split("/")
        return level, int(file.split("_")[0])

    if (root / "KernelBench").is_dir():
        paths = {str(p.relative_to(root / "KernelBench")): p for p in root.glob(LEVELS)}
        found = [(name, paths[name].read_text()) for name in sorted(paths, key=number)]
    else:
        git = ["git", f"--git-dir={root}"]
        listing = subprocess.run(
            [*git, "ls-tree", "-r", "--name-only", "HEAD", "KernelBench/"],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        names = [n.removeprefix("KernelBench/") for n in listing if fnmatch(n, LEVELS)]
        found = [
            (name, subprocess.run(
                [*git, "show", f"HEAD:KernelBench/{name}"], capture_output=True, text=True,
                check=True,
            ).stdout)
            for name in sorted(names, key=number)
        ]  # fmt: skip
    if not found:
        raise SystemExit(f"no KernelBench/level1|level2 problems under {root}")
    return found


def derived_names(tree: ast.Module, sets: list[dict[str, int]]) -> list[str]:
    """Names whose value changes with a shape set although no set overrides them."""
    own = task_constants(tree).values
    overridden = {key.split("[")[0] for s in sets for key in s}
    changed = set()
    for sizes in sets:
        values = task_constants(tree, sizes).values
        changed |= {n for n, v in values.items() if n not in overridden and own.get(n) != v}
    return sorted(changed)


def survey(name: str, source: str, verify_reference: bool) -> Problem:
    tree = ast.parse(source)
    sets = auto_shape_sets(source, "cpu")
    problem = Problem(name, sets, derived_names(tree, sets))
    for index, sizes in enumerate(sets):
        problem.max_input = max(
            [problem.max_input, *(_numel(s) for s in input_shapes(tree, sizes))]
        )
        module = load_task(source, sizes, f"kb_{Path(name).stem}_{index}")
        expected = task_constants(tree, sizes).values
        if any(_plain(getattr(module, n, None)) != expected[n] for n in problem.derived):
            problem.derived_follow = False
        if verify_reference:
            run_reference(module, problem, index)
    if verify_reference and len(problem.failures) == len(sets):
        problem.fallback = fallback_shape_sets(source, "cpu")
        errors = [
            reference_error(load_task(source, sizes, f"kb_{Path(name).stem}_f{i}"), problem)
            for i, sizes in enumerate(problem.fallback)
        ]
        problem.fallback_failures = [(i, e) for i, e in enumerate(errors) if e is not None]
        if len(problem.fallback_failures) == len(errors):
            problem.fallback_error = errors[-1] if errors else "no fallback set"
    return problem


def run_reference(module: Any, problem: Problem, index: int) -> None:
    error = reference_error(module, problem)
    if error is not None:  # the verifier skips such a set
        problem.failures.append((index, error))


def reference_error(module: Any, problem: Problem) -> str | None:
    """Run the task's reference once; how it failed, if it did."""
    import torch

    started = time.perf_counter()
    try:
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).eval()
        inputs = module.get_inputs()
        with torch.no_grad():
            output = model(*inputs)
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:160]}"
    problem.seconds.append(time.perf_counter() - started)
    tensors = [*_tensors(inputs), *_tensors(output), *model.parameters(), *model.buffers()]
    problem.max_touched = max([problem.max_touched, *(t.numel() for t in tensors)])
    return None


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for v in value for t in _tensors(v)]
    return []


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _plain(value: Any) -> Any:
    return tuple(_plain(v) for v in value) if isinstance(value, list | tuple) else value


def report(problems: list[Problem], verify_reference: bool) -> None:
    total = len(problems)
    several = [p for p in problems if len(p.sets) >= 2]
    derived = [p for p in problems if p.derived]
    print(f"problems: {total}")
    print(f"  >= 2 shape sets: {len(several)}  (3 sets: {sum(len(p.sets) == 3 for p in problems)})")
    print(
        f"  derive shapes at import: {len(derived)}, following the overrides: "
        f"{sum(p.derived_follow for p in derived)}"
    )
    largest = max(problems, key=lambda p: p.max_input)
    print(f"  largest input tensor after shrinking: {largest.max_input} elements ({largest.name})")
    for p in problems:
        if len(p.sets) < 2 or not p.derived_follow:
            print(f"    {p.name}: {len(p.sets)} set(s), derived follow: {p.derived_follow}")
    if not verify_reference:
        return
    runs = [s for p in problems for s in p.seconds]
    failing = [p for p in problems if p.failures]
    touched = max(problems, key=lambda p: p.max_touched)
    rescued = [p for p in problems if p.fallback and p.fallback_error is None]
    broken = [p for p in problems if p.fallback_error is not None]
    print(f"  reference runs: {len(runs)} ok, {sum(len(p.failures) for p in failing)} failed")
    print(
        f"  problems the reference fails on every set: {len(rescued) + len(broken)}, "
        f"checked on the fallback sets: {len(rescued)}, the check fails: {len(broken)}; "
        f"with a set skipped: {len(failing) - len(rescued) - len(broken)}; "
        f"with >= 2 sets the reference runs on: {sum(len(p.seconds) >= 2 for p in problems)}"
    )
    print(
        f"  reference seconds per set: median {statistics.median(runs):.3f}, "
        f"max {max(runs):.3f}, total {sum(runs):.1f}"
    )
    print(f"  largest tensor a reference touched: {touched.max_touched} elements ({touched.name})")
    for p in sorted(problems, key=lambda p: -max(p.seconds, default=0))[:5]:
        print(f"    slowest: {p.name} {max(p.seconds, default=0):.3f} s over {p.sets}")
    for p in failing:
        for index, error in p.failures:
            print(f"    reference fails: {p.name} set {index + 1} {p.sets[index]}: {error}")
        if p.fallback:
            failed = [i + 1 for i, _ in p.fallback_failures]
            outcome = p.fallback_error or (
                f"the reference fails on set(s) {failed}" if failed else "the reference runs"
            )
            print(f"    fallback: {p.name} {p.fallback}: {outcome}")


def kept_line(problems: list[Problem]) -> str:
    """How many problems keep all their shape sets (the reference runs on every set the
    verifier checks), and which do not."""
    lost = [p for p in problems if not p.kept]
    on_fallback = sum(bool(p.failures) and p.kept for p in problems)
    line = (
        f"kept all their shape sets: {len(problems) - len(lost)} of {len(problems)} problems"
        f" ({on_fallback} on the fallback sets)"
    )
    if lost:
        line += "; lost a set: " + ", ".join(f"{p.name} ({_lost_sets(p)})" for p in lost)
    return line


def _lost_sets(problem: Problem) -> str:
    if problem.fallback_failures:
        return "fallback set " + ", ".join(str(i + 1) for i, _ in problem.fallback_failures)
    return "set " + ", ".join(str(i + 1) for i, _ in problem.failures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a KernelBench checkout, or its git directory")
    parser.add_argument("--verify-reference", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    surveyed = [survey(*problem, args.verify_reference) for problem in problems(args.root)]
    report(surveyed, args.verify_reference)
    print(f"survey took {time.perf_counter() - started:.1f} s")
    if args.verify_reference:
        print(kept_line(surveyed))
    else:
        print("kept all their shape sets: not known without --verify-reference")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
