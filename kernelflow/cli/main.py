"""The ``kernelflow`` command: the parser of every subcommand (kernelflow.cli.commands), and
what an error ends the command with: one line on stderr, no traceback, and an exit code
(kernelflow.host.exits lists them).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NoReturn

from kernelflow.common.suggest import did_you_mean
from kernelflow.host.exits import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    CommandFailed,
    UsageError,
    WaitTimeout,
)

if TYPE_CHECKING:
    from kernelflow.host.settings import Settings

# Every command, in the order ``kernelflow --help`` lists them: the module of
# kernelflow.cli.commands that registers it, and its line in that list. A command's module
# (and all it imports: torch, NATS, the actors) is imported only when the command runs,
# so that ``--help`` and ``--version`` answer at once (tests/integration/test_cli_start.py
# keeps these lines equal to the modules' own).
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("verify", "verify a candidate kernel against a task (sandboxed; no NATS)"),
    "run": ("run", "one-shot: embedded NATS + in-process daemon, run one task"),
    "daemon": ("daemon", "long-running daemon hosting actor pools"),
    "submit": ("tasks", "publish a task for the daemons and print its id"),
    "status": ("tasks", "state of one task, or of every task in the log"),
    "cancel": ("tasks", "cancel a task that is still running"),
    "workflow": ("workflow", "list the workflows, check one, or describe one"),
    "schema": ("schema", "JSON Schema of the commands publishers may send"),
    "log": ("log", "export, import or verify the event log"),
    "fork": ("fork", "a new task from one of a task's events, its history reused as recorded"),
    "replay": ("replay", "a task's trajectory, counters or metrics, from the log or a file"),
    "export": ("export", "training data from the log"),
    "report": ("report", "run metrics: per task, per workflow, overall"),
    "reverify": (
        "reverify",
        "check recorded kernels again with this verifier and record the new verdicts",
    ),
    "rollout": ("rollout", "run a prompt dataset N times through an agent and score it"),
    "bench": ("bench", "search kernels for a directory of KernelBench problems and report"),
    "agents": (
        "agents",
        "list agent kinds, tools and kernel backends (built-in and plugins)",
    ),
    "health": (
        "health",
        "check NATS, the streams, the daemons, the LLM provider and the tools",
    ),
    "creds": (
        "creds",
        "write NATS credentials for a role (publisher, reader, daemon, verifier)",
    ),
    "connection": (
        "connection",
        "print the NATS URL and credentials for your own programs "
        '(eval "$(kernelflow connection)")',
    ),
    "ui": ("ui", "serve the live web dashboard of the tasks and the log"),
    "serve-rewards": (
        "serve_rewards",
        "serve the verifier pool's rewards over HTTP (OpenRLHF's --remote_rm_url, JSON)",
    ),
}


def command_module(name: str) -> ModuleType:
    """The module of kernelflow.cli.commands that registers and runs command ``name``."""
    return importlib.import_module(f"kernelflow.cli.commands.{COMMANDS[name][0]}")


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line, as every other error of a command is
    (kernelflow.host.exits), with the closest choice to a misspelt one."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {_suggesting(message)} ({self.prog} --help)\n")


def _suggesting(message: str) -> str:
    """argparse's "invalid choice" error, with a "did you mean" where a choice is close."""
    message = message.removeprefix("argument ")
    bad = re.fullmatch(r"(.+): invalid choice: '(.*)' \(choose from (.*)\)", message)
    if bad is None:
        return message
    what, given, listed = bad.groups()
    choices = re.findall(r"'([^']*)'", listed)
    return f"{what} {given!r} is not one of {', '.join(choices)}{did_you_mean(given, choices)}"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser for ``argv``: the command it names registered in full (its module
    imported), every other command by its name and help line only."""
    parser = _Parser(
        prog="kernelflow",
        description="Event-sourced LLM agents that turn PyTorch operators into verified kernels.",
    )
    parser.add_argument("--version", action="version", version=f"kernelflow {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log actor activity to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    chosen = _command_of(sys.argv[1:] if argv is None else argv)
    module = COMMANDS[chosen][0] if chosen is not None else None
    registered = False
    for name, (of, line) in COMMANDS.items():
        if of != module:
            sub.add_parser(name, help=line, add_help=False)
        elif not registered:  # a module registers all of its commands at once
            command_module(name).register(sub)
            registered = True
    return parser


def _command_of(argv: list[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), if it is one."""
    for word in argv:
        if word in ("-v", "--verbose"):
            continue
        return word if word in COMMANDS else None
    return None


def _version() -> str:
    try:
        return importlib.metadata.version("kernelflow")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "(not installed)"


def settings_from(args: argparse.Namespace) -> Settings:
    from kernelflow.actors.connection import BadNatsUrl, check_nats_url
    from kernelflow.cli.commands.options import TLS_FLAGS
    from kernelflow.host.settings import Settings, parse_devices

    settings = Settings()
    if getattr(args, "nats_url", None):
        settings.nats_url = args.nats_url
    if settings.nats_url:
        try:
            check_nats_url(settings.nats_url)  # before anything starts
        except BadNatsUrl as exc:
            given = "--nats-url" if getattr(args, "nats_url", None) else "KF_NATS_URL"
            raise UsageError(f"{given}: {exc}") from None
    if getattr(args, "connect_timeout", None):
        settings.connect_timeout_s = args.connect_timeout
    if getattr(args, "data_dir", None):
        settings.data_dir = Path(args.data_dir)
    if getattr(args, "creds", None):
        settings.nats_creds = Path(args.creds)
    for flag in TLS_FLAGS:
        attr = flag.replace("-", "_")
        if getattr(args, attr, None):
            setattr(settings, attr, Path(getattr(args, attr)))
    if getattr(args, "llm", None):
        settings.llm = args.llm
    devices, gpus = getattr(args, "devices", None), getattr(args, "gpus", None)
    if devices and gpus:
        raise UsageError("--devices and --gpus (its older name): give one")
    if devices:
        settings.devices = parse_devices(devices, "--devices")
    elif gpus:
        settings.devices = parse_devices(gpus, "--gpus")
    return settings


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
    # What the command's errors are (imported with the command, which needs them anyway).
    from kernelflow.actors.bridge import NatsUnreachable
    from kernelflow.actors.connection import CredentialsError, NatsAccessRefused
    from kernelflow.cli.commands.options import apply_agent_flags
    from kernelflow.events.errors import JetStreamUnavailable, TransportError
    from kernelflow.host.nats_server import NatsServerError
    from kernelflow.host.settings import SettingsError
    from kernelflow.llm import EndpointUnreachable

    logging.basicConfig(
        level=logging.INFO if args.verbose or args.command == "daemon" else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # asyncio warns so whenever a server ends a TLS connection that nats-py reads: harmless.
    logging.getLogger("asyncio").addFilter(lambda record: "eof_received" not in record.getMessage())
    try:
        apply_agent_flags(args, os.environ)
        return int(args.func(args, settings_from(args)))
    except (UsageError, SettingsError, NatsServerError, EndpointUnreachable) as exc:
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (CredentialsError, NatsAccessRefused) as exc:
        # Credentials, TLS settings or a role that cannot do this: fixed in the options.
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (NatsUnreachable, CommandFailed) as exc:
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except JetStreamUnavailable:
        print(
            "kernelflow: JetStream is not available on this NATS server (kernelflow keeps its "
            "log there: start nats-server with JetStream, e.g. `nats-server -js`)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except TransportError as exc:
        # The server went away or stopped answering mid-command: one line, not a traceback.
        print(f"kernelflow: NATS failed before the command finished: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except WaitTimeout as exc:
        print(f"kernelflow: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``kernelflow report | head``): stop quietly, as a tool killed
        # by SIGPIPE would, and keep the interpreter's final flush from failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
