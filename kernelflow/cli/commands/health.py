"""``kernelflow health``: is everything a run needs up? The checks are
``kernelflow.host.health``'s (its doc lists them); this is their command line.

``--wait`` seconds to gather the daemons' answers, ``--min-daemons`` that must answer
(none by default: no daemon is no fault unless one is asked for; ``--no-daemons``: not
looked for), ``--llm`` a provider spec to check instead of the configured one, its
endpoints sent a one-token request; ``--json`` one object for machines. Exit status: 0
nothing wrong for what was asked (no ``fail``), 1 something is, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import shutil
from typing import Any

from kernelflow.cli.commands.options import add_connection_options
from kernelflow.host.exits import UsageError
from kernelflow.host.health import DaemonsWanted, run_checks
from kernelflow.host.settings import Settings


def cmd_health(args: argparse.Namespace, settings: Settings) -> int:
    if args.wait <= 0 or args.wait > 60:
        raise UsageError(f"--wait {args.wait:g}: expected seconds in (0, 60]")
    if args.min_daemons < 0:
        raise UsageError(f"--min-daemons {args.min_daemons}: expected 0 or more")
    if args.min_daemons and args.no_daemons:
        raise UsageError("--min-daemons asks for daemons, --no-daemons for none: pick one")
    daemons = DaemonsWanted(args.wait, args.min_daemons, args.no_daemons)
    report = run_checks(settings, daemons, getattr(args, "llm", None))
    if args.json:
        print(json.dumps(report.as_json(), indent=2, default=str))
    else:
        print(report.text(shutil.get_terminal_size((100, 24)).columns))
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
        "--min-daemons",
        type=int,
        default=0,
        help="daemons that must answer (default 0: those that answer are checked, none is "
        "required)",
    )
    p.add_argument("--no-daemons", action="store_true", help="do not look for daemons at all")
    p.add_argument(
        "--llm",
        metavar="SPEC",
        help="check this provider instead of the configured one, sending each endpoint it "
        "names a one-token request",
    )
    add_connection_options(p)
    p.set_defaults(func=cmd_health)
