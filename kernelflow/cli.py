"""The ``kernelflow`` command: the parser of every subcommand (kernelflow.commands), and
what an error ends the command with: one line on stderr, no traceback, and an exit code
(kernelflow.usage lists them).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

import nats.errors
import nats.js.errors

from kernelflow.actors.bridge import NatsUnreachable
from kernelflow.actors.connection import (
    BadNatsUrl,
    CredentialsError,
    NatsAccessRefused,
    check_nats_url,
)
from kernelflow.commands import (
    agents,
    bench,
    connection,
    creds,
    daemon,
    export,
    health,
    log,
    replay,
    report,
    reverify,
    rollout,
    run,
    schema,
    serve_rewards,
    tasks,
    ui,
    verify,
    workflow,
)
from kernelflow.commands.options import TLS_FLAGS, apply_agent_flags
from kernelflow.common.suggest import did_you_mean
from kernelflow.llm import EndpointUnreachable
from kernelflow.nats_server import NatsServerError
from kernelflow.settings import Settings, SettingsError, parse_devices
from kernelflow.usage import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_TIMEOUT,
    CommandFailed,
    UsageError,
    WaitTimeout,
)

# In the order ``kernelflow --help`` lists them.
COMMANDS = (
    verify,
    run,
    daemon,
    tasks,
    workflow,
    schema,
    log,
    replay,
    export,
    report,
    reverify,
    rollout,
    bench,
    agents,
    health,
    creds,
    connection,
    ui,
    serve_rewards,
)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line, as every other error of a command is
    (kernelflow.usage), with the closest choice to a misspelt one."""

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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kernelflow",
        description="Event-sourced LLM agents that turn PyTorch operators into verified kernels.",
    )
    parser.add_argument("--version", action="version", version=f"kernelflow {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log actor activity to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("kernelflow")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "(not installed)"


def settings_from(args: argparse.Namespace) -> Settings:
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
    args = build_parser().parse_args(argv)
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
    except nats.js.errors.ServiceUnavailableError:
        print(
            "kernelflow: JetStream is not available on this NATS server (kernelflow keeps its "
            "log there: start nats-server with JetStream, e.g. `nats-server -js`)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except nats.errors.Error as exc:
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
