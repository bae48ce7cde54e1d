"""``kernelflow reverify``: check recorded kernels again with this verifier, record the new
verdicts (``KernelReverified``, tagged with the verifier version) and show what changed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from kernelflow.cli.commands.options import add_source_options
from kernelflow.host.exits import UsageError
from kernelflow.host.settings import Settings
from kernelflow.offline.reverify import Outcome, check_again, kernels_to_check, record
from kernelflow.offline.sources import LiveSource, source_for
from kernelflow.verification.engine import VERIFIER_VERSION


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "reverify",
        help="check recorded kernels again with this verifier and record the new verdicts",
    )
    add_source_options(p)
    p.add_argument(
        "--force",
        action="store_true",
        help=f"also kernels this verifier version ({VERIFIER_VERSION}) checked already",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="check and show, record nothing (--from: always)"
    )
    p.add_argument("--device", choices=["cpu", "cuda"], help="where to check (default: here)")
    p.add_argument("--trials", type=int, default=3, help="correctness trials per kernel")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per kernel")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.set_defaults(func=cmd_reverify)


def cmd_reverify(args: argparse.Namespace, settings: Settings) -> int:
    if args.trials < 1 or args.timeout <= 0:
        raise UsageError("--trials must be at least 1 and --timeout above 0")
    config = settings.verifier_config(
        trials=args.trials, timeout_s=args.timeout, device=args.device
    )
    with source_for(args, settings) as source:
        kernels, current = kernels_to_check(source, force=args.force)
        bridge = source.bridge if isinstance(source, LiveSource) else None
        recording = bridge is not None and not args.dry_run
        outcomes: list[Outcome] = []
        total = len(kernels)

        def done(outcome: Outcome) -> None:
            if recording and bridge is not None:
                record(bridge, outcome, force=args.force)
            outcomes.append(outcome)
            if not args.json:
                print(_line(outcome, len(outcomes), total), flush=True)

        print(
            f"reverify: {total} kernel(s) to check with verifier version {VERIFIER_VERSION}"
            f" ({current} checked by it already)"
            + ("" if recording else "; recording nothing (--dry-run or --from)"),
            file=sys.stderr,
            flush=True,
        )
        for _ in check_again(kernels, config, done):
            pass
    changed = [o for o in outcomes if o.changed]
    if args.json:
        print(
            json.dumps(
                {
                    "verifier_version": VERIFIER_VERSION,
                    "checked": len(outcomes),
                    "already_current": current,
                    "recorded": sum(o.recorded for o in outcomes),
                    "changed": [o.to_dict() for o in changed],
                    "unchanged": len(outcomes) - len(changed),
                },
                indent=2,
            )
        )
    else:
        lost = sum(1 for o in changed if o.kernel.verdict == "pass")
        print(
            f"checked {len(outcomes)}: {len(changed)} changed ({lost} passed before and do not "
            f"now, {len(changed) - lost} other), {len(outcomes) - len(changed)} unchanged; "
            f"{sum(o.recorded for o in outcomes)} recorded"
        )
    return 0


def _line(o: Outcome, n: int, total: int) -> str:
    k, r = o.kernel, o.report
    change = f"{k.verdict} → {r.verdict}" if o.changed else f"{r.verdict} (unchanged)"
    why = f": {r.summary}" if o.changed else ""
    differ = (
        f" [since the task started: {'; '.join(o.versions_differ)}]" if o.versions_differ else ""
    )
    return f"[{n}/{total}] {k.task_id} ({k.task_name}): {change}{why}{differ}"
