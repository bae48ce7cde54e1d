"""``kernelflow connection``: how a program of one's own reaches kernelflow's NATS, as
lines for the shell (``eval "$(kernelflow connection)"``) or one JSON object.

The embedded server listens on a loopback port of its own choosing, named in
``<data dir>/nats/server.json`` while it runs, and lets in only holders of the data dir's
keys: this prints its URL, the seed file of a role's key (``publisher`` unless
``--role``; the seed itself is never printed) and the inbox prefix that key's replies
must take (kernelflow.host.nats_auth). With ``--nats-url`` (or ``KF_NATS_URL``) it prints
what was given instead, so its output feeds back into itself.
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from kernelflow.actors.connection import ClientAuth, safe_url
from kernelflow.cli.commands.options import TLS_FLAGS, add_connection_options
from kernelflow.host.exits import EXIT_OK, CommandFailed, UsageError
from kernelflow.host.nats_auth import ROLES
from kernelflow.host.nats_server import local_keys, running_embedded_server
from kernelflow.host.settings import Settings

DEFAULT_ROLE = "publisher"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "connection",
        help="print the NATS URL and credentials for your own programs "
        '(eval "$(kernelflow connection)")',
    )
    p.add_argument(
        "--role",
        choices=list(ROLES),
        help=f"whose key of the embedded server (default {DEFAULT_ROLE}; docs/security.md)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object instead of shell lines")
    add_connection_options(p)
    p.set_defaults(func=cmd_connection)


def cmd_connection(args: argparse.Namespace, settings: Settings) -> int:
    if settings.nats_url:
        if args.role:
            raise UsageError("--role picks a key of the embedded server; with a URL, use --creds")
        found = given(settings)
        where = f"the NATS server at {safe_url(settings.nats_url)}"
    else:
        role = args.role or DEFAULT_ROLE
        found = embedded(settings, role)
        where = f"the embedded NATS server of {settings.data_dir}, as the {role} role"
    if args.json:
        print(json.dumps(found))
        return EXIT_OK
    print(f"# {where}")
    for name, value in found.items():
        print(f"export {ENV_NAMES[name]}={shlex.quote(value)}")
    return EXIT_OK


# What each value is called in the environment: the variables kernelflow's commands read,
# and the inbox prefix a NATS client of one's own passes to the server.
ENV_NAMES = {
    "url": "KF_NATS_URL",
    "creds": "KF_NATS_CREDS",
    "inbox_prefix": "KF_NATS_INBOX_PREFIX",
    **{flag.replace("-", "_"): "KF_NATS_" + flag.upper().replace("-", "_") for flag in TLS_FLAGS},
}


def embedded(settings: Settings, role: str) -> dict[str, str]:
    url = running_embedded_server(settings.nats_store)
    if url is None:
        raise CommandFailed(
            f"no embedded NATS server runs for the data dir {settings.data_dir}: start one with "
            "`kernelflow daemon` (it runs as long as the daemon does, on the same port when "
            "another kernelflow process carries it on)"
        )
    seed_file = local_keys(settings.nats_store).seed_file(role)
    return {"url": url, **with_inbox(ClientAuth(creds=seed_file))}


def given(settings: Settings) -> dict[str, str]:
    auth = settings.nats_auth
    found = {"url": settings.nats_url or "", **with_inbox(auth)}
    for flag in TLS_FLAGS:
        attr = flag.replace("-", "_")
        if (path := getattr(auth, attr)) is not None:
            found[attr] = str(path)
    return found


def with_inbox(auth: ClientAuth) -> dict[str, str]:
    """The credentials file and, for an nkey seed, the inbox prefix its replies take."""
    if auth.creds is None:
        return {}
    options = auth.options()  # CredentialsError for a file that cannot be used
    found = {"creds": str(auth.creds)}
    if "inbox_prefix" in options:
        found["inbox_prefix"] = options["inbox_prefix"]
    return found
