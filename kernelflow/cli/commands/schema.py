"""``kernelflow schema``: the JSON Schema of the commands publishers may send (or, with
``--events``, of the events)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kernelflow.events.codec import json_schema
from kernelflow.host.exits import EXIT_OK
from kernelflow.host.settings import Settings


def register(subparsers: Any) -> None:
    schema = subparsers.add_parser("schema", help="JSON Schema of the commands publishers may send")
    schema.add_argument("--events", action="store_true", help="the events instead")
    schema.set_defaults(func=cmd_schema)


def cmd_schema(args: argparse.Namespace, settings: Settings) -> int:
    print(json.dumps(json_schema(events=args.events), indent=2))
    return EXIT_OK
