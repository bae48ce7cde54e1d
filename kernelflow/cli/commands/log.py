"""``kernelflow log export|import|verify``: the event log to and from portable files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kernelflow.cli.commands.options import add_connection_options, add_source_options
from kernelflow.events.errors import TransportError
from kernelflow.host.exits import CommandFailed, UsageError
from kernelflow.host.runtime import connected
from kernelflow.host.settings import Settings
from kernelflow.offline.files import verify_file
from kernelflow.offline.log_export import export_log
from kernelflow.offline.log_import import ImportConflict, import_file
from kernelflow.offline.sources import source_for
from kernelflow.progress import for_terminal


def register(subparsers: Any) -> None:
    log = subparsers.add_parser("log", help="export, import or verify the event log")
    log_sub = log.add_subparsers(dest="log_command", required=True)

    exp = log_sub.add_parser("export", help="write the log (or part of it) to a portable file")
    exp.add_argument("--out", required=True, help="output file (.jsonl, or .jsonl.gz)")
    add_source_options(exp)
    exp.set_defaults(func=cmd_log_export)

    imp = log_sub.add_parser("import", help="append an exported log file to this NATS")
    imp.add_argument("file")
    add_connection_options(imp)
    imp.set_defaults(func=cmd_log_import)

    ver = log_sub.add_parser("verify", help="check an exported log file's integrity")
    ver.add_argument("file")
    ver.add_argument("--json", action="store_true")
    ver.set_defaults(func=cmd_log_verify)


def cmd_log_export(args: argparse.Namespace, settings: Settings) -> int:
    out = Path(args.out)
    with source_for(args, settings) as source:
        summary = export_log(source, out, source.flt)
    quarantined = f" and {summary.quarantined} quarantine record(s)" if summary.quarantined else ""
    print(
        f"exported {summary.records - summary.quarantined} events of {len(summary.tasks)} "
        f"tasks{quarantined} to {out} (sha256 {summary.sha256})"
    )
    return 0


def cmd_log_import(args: argparse.Namespace, settings: Settings) -> int:
    path = Path(args.file)
    summary = verify_file(path)
    with connected(settings) as bridge:
        try:
            progress = for_terminal(sys.stderr)
            result = bridge.call(import_file(bridge.log, path, summary, progress))
        except ImportConflict as exc:
            raise UsageError(str(exc)) from exc
        except TransportError as exc:
            raise CommandFailed(
                f"NATS failed during the import ({exc}); the events it acknowledged are "
                "kept: import again to continue"
            ) from exc
    left_out = f", {result.quarantined} quarantine record(s) left out" if result.quarantined else ""
    print(
        f"imported {path}: {result.appended} events appended, {result.skipped} already "
        f"present, {result.tasks} tasks{left_out}"
    )
    return 0


def cmd_log_verify(args: argparse.Namespace, settings: Settings) -> int:
    summary = verify_file(Path(args.file))
    info = {
        "file": args.file,
        "records": summary.records,
        "tasks": len(summary.tasks),
        # Messages of the exported log that were not events of their task.
        "quarantined": summary.quarantined,
        "sha256": summary.sha256,
        "filter": summary.header.filter,
    }
    print(
        json.dumps(info)
        if args.json
        else f"{args.file}: ok, " + ", ".join(f"{k} {v}" for k, v in info.items() if k != "file")
    )
    return 0
