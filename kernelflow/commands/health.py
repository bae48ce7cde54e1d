"""``kernelflow health``: is everything a run needs up? The checks are
``kernelflow.health``'s (its doc lists them); this is their command line.

``--wait`` seconds to gather the daemons' answers, ``--min-daemons`` that must answer
(``--no-daemons``: none), ``--llm`` a provider spec to check instead of the configured
one; ``--json`` one object for machines. Exit status: 0 healthy (no ``fail``), 1
unhealthy, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from kernelflow.commands.options import add_connection_options
from kernelflow.health import DaemonsWanted, run_checks
from kernelflow.settings import Settings
from kernelflow.usage import UsageError


def cmd_health(args: argparse.Namespace, settings: Settings) -> int:
    if args.wait <= 0 or args.wait > 60:
        raise UsageError(f"--wait {args.wait:g}: expected seconds in (0, 60]")
    if args.min_daemons < 0:
        raise UsageError(f"--min-daemons {args.min_daemons}: expected 0 or more")
    daemons = DaemonsWanted(args.wait, args.min_daemons, args.no_daemons)
    report = run_checks(settings, daemons, getattr(args, "llm", None))
    if args.json:
        print(json.dumps(report.as_json(), indent=2, default=str))
    else:
        print(report.text())
    return 0 if report.healthy else 1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "health", help="check NATS, the streams, the daemons, the LLM provider and the tools"
    )
    p.add_argument("--json", action="store_true", help="one JSON object for machines")
    p.add_argument(
        "--wait", type=float, default=1.0, help="seconds to gather daemon answers (default 1)"
    )
    p.add_argument(
        "--min-daemons", type=int, default=1, help="daemons that must answer (default 1)"
    )
    p.add_argument(
        "--no-daemons", action="store_true", help="no daemon needs to answer (NATS-only check)"
    )
    p.add_argument("--llm", help="check this provider spec instead of the configured one")
    add_connection_options(p)
    p.set_defaults(func=cmd_health)
