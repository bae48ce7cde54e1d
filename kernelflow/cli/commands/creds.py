"""``kernelflow creds``: credentials for a role (kernelflow.host.nats_auth), as an nkey seed
file that any NATS client reads (``--creds FILE`` here, ``nats --nkey FILE``, nats-py's
``nkeys_seed``).

Without ``--new``: the credentials the embedded server of the data dir knows for the role,
e.g. to give another user of the machine publisher rights only. With ``--new``: a new key
for a server of one's own, whose configuration (deploy/nats-server.conf) gets the user
entry printed, or added to ``--users-file``. The seed is written to ``--out`` (mode 0600,
never over an existing file) and never printed. ``--users-file`` alone rewrites a users
file's permissions as this version of kernelflow requires (after an upgrade).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kernelflow.actors.connection import public_key_of
from kernelflow.host.exits import EXIT_OK, UsageError
from kernelflow.host.nats_auth import (
    ROLES,
    add_user,
    new_seed,
    user_entry,
    users_of,
    write_secret,
    write_users,
)
from kernelflow.host.nats_server import local_keys
from kernelflow.host.settings import Settings


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "creds",
        help="write NATS credentials for a role (publisher, reader, daemon, verifier)",
        description="Roles: "
        + "; ".join(f"{name}: {role.summary}" for name, role in ROLES.items())
        + ". See docs/security.md.",
    )
    p.add_argument("role", nargs="?", choices=list(ROLES), help="the role the credentials have")
    p.add_argument("--out", metavar="FILE", help="where to write the seed (created, mode 0600)")
    p.add_argument(
        "--new",
        action="store_true",
        help="a new key, for a server you configure (prints its user entry), instead of the "
        "embedded server's",
    )
    p.add_argument(
        "--users-file",
        metavar="FILE",
        help="the users file of deploy/nats-server.conf: with --new, add the user to it; "
        "alone, rewrite its users' permissions as this kernelflow requires",
    )
    p.add_argument("--data-dir", help="the embedded server's data dir (env KF_DATA_DIR)")
    p.set_defaults(func=cmd_creds)


def cmd_creds(args: argparse.Namespace, settings: Settings) -> int:
    if args.users_file and not (args.role or args.out or args.new):
        return refresh(Path(args.users_file))
    if not args.role or not args.out:
        raise UsageError("name a role and --out FILE (or only --users-file FILE)")
    if args.users_file and not args.new:
        raise UsageError("--users-file takes a new key: pass --new too")
    role, out = ROLES[args.role], Path(args.out)
    if args.new:
        seed = new_seed()
    else:
        seed = local_keys(settings.nats_store).seed_file(role.name).read_bytes().strip()
    try:
        write_secret(out, seed + b"\n")
    except FileExistsError:
        raise UsageError(f"--out {out}: exists; not replaced (a seed may be in use)") from None
    except OSError as exc:
        raise UsageError(f"--out {out}: {exc.strerror or exc}") from None
    key = public_key_of(seed)
    if not args.new:
        print(
            f"wrote the {role.name} credentials of the embedded server of {settings.data_dir} "
            f"to {out} (public key {key}): use them with --creds {out} or KF_NATS_CREDS"
        )
        return EXIT_OK
    print(f"wrote a new {role.name} key to {out} (public key {key}); keep the file secret")
    if args.users_file:
        add_user(Path(args.users_file), role, key)
        print(f"added it to {args.users_file}: reload the server (nats-server --signal reload)")
    else:
        print("its entry for authorization.users of the server's configuration:")
        print(f"  {user_entry(role, key)}")
    return EXIT_OK


def refresh(users_file: Path) -> int:
    users = users_of(users_file)
    if not users:
        raise UsageError(f"--users-file {users_file}: no users of kernelflow's in it")
    write_users(users_file, users)
    print(f"rewrote the permissions of {len(users)} user(s) in {users_file}: reload the server")
    return EXIT_OK
