"""``kernelflow bench PROBLEMS``: search kernels for a directory of KernelBench-format
problems (KernelBench's own ``level1/``, ``level2/`` folders as they are), then report per
problem and for the run, with the benchmark card that says how it was measured.

The run is in the log: every candidate is a task (group = its problem's search), so a
bench killed at any point is continued by running the same command again (its run id is
derived from the problems and the settings; ``--run ID`` names one), and every bench is
training data.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelflow.actors.daemon import CONDUCTOR_ROLE
from kernelflow.actors.kinds.check import check_agents
from kernelflow.cli.commands.options import (
    LLM_HELP,
    add_agent_llm_options,
    add_connection_options,
    add_devices_option,
    add_policy_option,
    add_verifier_version_option,
)
from kernelflow.host.exits import UsageError
from kernelflow.host.runtime import connected, start_daemon, stopped_after
from kernelflow.host.settings import Settings
from kernelflow.host.stopping import interruptible
from kernelflow.offline.sources import BENCH_RUN
from kernelflow.projections.benchmark import (
    BENCH_FAST_P,
    PROBLEM,
    benchmark_card,
    problem_result,
    run_summary,
)
from kernelflow.projections.report import bench_text
from kernelflow.search.driver import (
    Budget,
    SearchRunner,
    SearchTask,
    SettingsChanged,
    print_progress,
)
from kernelflow.search.strategies import SearchConfig, UnknownStrategy, strategy_names
from kernelflow.verification.backends import DEFAULT_BACKEND, backend_names
from kernelflow.verification.policy import DEFAULT_POLICY
from kernelflow.verification.taskfile import TaskFileError, check_task_source
from kernelflow.workflows.loader import WorkflowError, parse_workflow, resolve_workflow

_NUMBERED = re.compile(r"^(\d+)_")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "bench", help="search kernels for a directory of KernelBench problems and report"
    )
    p.add_argument(
        "problems_dir", metavar="PROBLEMS", help="a problem file, or a directory of them"
    )
    p.add_argument("--problems", help="which problems, by their number: 1-20,25 (default: all)")
    p.add_argument(
        "--strategy", default="best_of_n", help=f"search strategy: {', '.join(strategy_names())}"
    )
    p.add_argument(
        "--samples",
        type=int,
        default=4,
        help="candidates per generation (evolve: per island; tree: per expanded kernel)",
    )
    p.add_argument("--generations", type=int, default=3, help="evolve, tree: generations")
    p.add_argument("--islands", type=int, default=2, help="evolve: islands")
    p.add_argument("--elites", type=int, default=3, help="evolve: archive size per island")
    p.add_argument(
        "--inspirations", type=int, default=2, help="evolve: kernels shown besides the parent"
    )
    p.add_argument(
        "--migrate-every", type=int, default=2, help="evolve: generations between migrations"
    )
    p.add_argument(
        "--expand", type=int, default=2, help="tree: best kernels expanded per generation"
    )
    p.add_argument("--seed", type=int, default=0, help="the strategy's seed")
    win = p.add_mutually_exclusive_group()
    win.add_argument(
        "--early-win",
        dest="early_win",
        action="store_true",
        default=None,
        help="end a problem's search at its first pass (best_of_n's default)",
    )
    win.add_argument(
        "--no-early-win", dest="early_win", action="store_false", help="run every planned candidate"
    )
    p.add_argument("--max-candidates", type=int, help="budget per problem: candidates")
    p.add_argument("--max-tokens", type=int, help="budget per problem: LLM tokens")
    p.add_argument("--max-dollars", type=float, help="budget per problem: LLM cost in USD")
    p.add_argument("--max-wall", type=float, help="budget per problem: seconds with work in flight")
    p.add_argument("--concurrency", type=int, default=4, help="candidates in flight at once")
    p.add_argument("--run", help="the run's id (default: derived from the problems and settings)")
    p.add_argument("--workflow", default="default", help="each candidate's workflow (name or YAML)")
    p.add_argument("--backend", default=DEFAULT_BACKEND, choices=backend_names())
    p.add_argument(
        "--no-compile-baseline",
        action="store_true",
        help="time against eager PyTorch only (its own daemon also times torch.compile of "
        "each reference, which takes seconds to minutes per candidate on the CPU)",
    )
    add_policy_option(p)
    p.add_argument("--deadline", type=float, help="seconds each candidate may take")
    p.add_argument("--llm", help=LLM_HELP)
    add_agent_llm_options(p)
    add_devices_option(p)
    p.add_argument(
        "--use-daemons",
        action="store_true",
        help="host no daemon here: the daemons on the NATS do the candidates' work",
    )
    add_connection_options(p)
    add_verifier_version_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.set_defaults(func=cmd_bench)


@dataclass(frozen=True)
class Problem:
    name: str  # the file's name
    key: str  # its id within the run: its number, else its name made safe
    number: int | None
    source: str


def find_problems(path: Path, selection: str | None) -> list[Problem]:
    """The problem files of ``path`` (a file, or a directory's ``*.py``), in KernelBench's
    order (by number, then name), those ``selection`` names; each checked to be a
    KernelBench task. Raises UsageError saying what is wrong."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = [f for f in path.glob("*.py") if not f.name.startswith("_")]
        if not files:
            subdirs = sorted(d.name for d in path.iterdir() if d.is_dir())
            hint = f" (it has folders: {', '.join(subdirs[:6])}; name one)" if subdirs else ""
            raise UsageError(f"{path}: no problem files (*.py){hint}")
    else:
        raise UsageError(f"{path}: no such file or directory")
    problems = [_problem(f) for f in files]
    problems.sort(key=lambda p: (p.number is None, p.number or 0, p.name))
    if selection:
        wanted = parse_selection(selection)
        chosen = [p for p in problems if p.number in wanted]
        missing = sorted(wanted - {p.number for p in chosen})
        if missing:
            raise UsageError(
                f"--problems {selection}: no problem numbered {', '.join(map(str, missing[:10]))} "
                f"in {path}"
            )
        problems = chosen
    keys = [p.key for p in problems]
    if len(set(keys)) != len(keys):
        raise UsageError(f"{path}: two problems share a number; select with --problems")
    return problems


def _problem(path: Path) -> Problem:
    try:
        source = path.read_text(encoding="utf-8")
        check_task_source(source, path.name)
    except (OSError, UnicodeDecodeError, TaskFileError) as exc:
        raise UsageError(f"{path}: not a usable KernelBench problem: {exc}") from exc
    numbered = _NUMBERED.match(path.name)
    number = int(numbered.group(1)) if numbered else None
    key = str(number) if number is not None else re.sub(r"[^A-Za-z0-9_]", "_", path.stem)[:24]
    return Problem(path.name, key, number, source)


def parse_selection(text: str) -> set[int]:
    """``1-20,25`` → {1, ..., 20, 25}."""
    chosen: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise UsageError(f"--problems {text!r}: expected numbers and ranges, e.g. 1-20,25")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise UsageError(f"--problems {text!r}: {part} is an empty range")
        chosen.update(range(first, last + 1))
    return chosen


def search_settings(args: argparse.Namespace) -> SearchConfig:
    settings = SearchConfig(
        strategy=args.strategy,
        samples=args.samples,
        seed=args.seed,
        generations=args.generations,
        islands=args.islands,
        elites=args.elites,
        inspirations=args.inspirations,
        migrate_every=args.migrate_every,
        expand=args.expand,
        early_win=args.early_win,
    )
    try:
        settings.check()
    except UnknownStrategy as exc:
        raise UsageError(f"--strategy: {exc}") from exc
    except ValueError as exc:
        raise UsageError(f"--{exc}") from exc
    return settings


def budget_of(args: argparse.Namespace) -> Budget:
    for flag in ("max_candidates", "max_tokens", "max_dollars", "max_wall"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise UsageError(f"--{flag.replace('_', '-')} must be above 0")
    return Budget(args.max_candidates, args.max_tokens, args.max_dollars, args.max_wall)


def run_id(problems: list[Problem], settings: SearchConfig, args: argparse.Namespace) -> str:
    """The default run id: the same problems and settings continue the same run."""
    digest = hashlib.sha256()
    for part in (
        settings.to_json(),
        args.workflow,
        args.backend,
        # A run under another policy is another run (strict's ids predate policies).
        "" if args.policy == DEFAULT_POLICY else f"policy={args.policy}",
        args.llm or "",
        json.dumps(budget_of(args).__dict__, sort_keys=True),
        *(f"{p.name}\0{p.source}" for p in problems),
    ):
        digest.update(part.encode() + b"\0")
    return f"bench-{digest.hexdigest()[:10]}"


def cmd_bench(args: argparse.Namespace, settings: Settings) -> int:
    problems = find_problems(Path(args.problems_dir), args.problems)
    strategy_settings = search_settings(args)
    budget = budget_of(args)
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    if args.deadline is not None and args.deadline <= 0:
        raise UsageError("--deadline must be above 0")
    try:
        workflow_name, workflow_yaml = resolve_workflow(args.workflow, settings.workflow_dirs)
        workflow = parse_workflow(workflow_yaml, workflow_name, source=args.workflow)
        check_agents(workflow)
    except WorkflowError as exc:
        raise UsageError(str(exc)) from exc
    run = args.run or run_id(problems, strategy_settings, args)
    if not re.fullmatch(r"[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*", run) or len(run) > 36:
        raise UsageError(f"--run {run!r}: letters, digits, '_' and '-' (at most 36)")
    searches = [
        SearchTask(
            search_id=f"{run}-{p.key}",
            task_name=Path(p.name).stem,
            task_source=p.source,
            workflow=workflow_name,
            workflow_yaml=workflow_yaml,
            backend=args.backend,
            policy=args.policy,
            settings=strategy_settings,
            budget=budget,
            deadline_s=args.deadline,
            metadata={BENCH_RUN: run, PROBLEM: p.name},
        )
        for p in problems
    ]
    print(
        f"bench {run}: {len(problems)} problem(s), {strategy_settings.strategy}; run the same "
        "command again to continue it",
        file=sys.stderr,
        flush=True,
    )
    # This run's own verifiers time torch.compile too, unless told not to.
    settings.compare_compile = not args.no_compile_baseline
    with interruptible(), connected(settings) as bridge:
        runner = SearchRunner(bridge, searches, args.concurrency, on_progress=print_progress)
        try:
            if args.use_daemons:
                databases = runner.run()
            else:
                roles = (CONDUCTOR_ROLE, *workflow.agents)
                pools = {a: args.concurrency for a in workflow.agents if a != "verifier"}
                # Its own candidates only: others' queued tasks wait for their daemons.
                daemon = start_daemon(bridge, settings, roles, pools, only=runner.owns)
                with stopped_after(daemon):
                    databases = runner.run()
        except SettingsChanged as exc:
            raise UsageError(str(exc)) from exc
    by_problem = {
        p.name: databases[s.search_id].as_of(args.verifier_version)
        for p, s in zip(problems, searches, strict=True)
    }
    results = [problem_result(name, db) for name, db in by_problem.items()]
    summary = run_summary(results, BENCH_FAST_P)
    card = benchmark_card(by_problem, results)
    if args.json:
        out = {
            "run": run,
            "settings": json.loads(strategy_settings.to_json()),
            **summary,
            "problems": [r.to_dict() for r in results],
            "card": card,
            "search_overhead_s": round(runner.overhead_s, 4),
        }
        print(json.dumps(out, indent=2))
    else:
        print(bench_text(run, results, summary, card))
    return 0
