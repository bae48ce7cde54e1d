"""Who may do what on kernelflow's NATS, enforced by nats-server itself: the roles, the
subjects each may publish and subscribe to, the nkeys that stand for them, and the server
configuration that gives each key its role (the embedded server's, and deploy/'s).

Roles (docs/security.md has the tables, and what each entry is for):

- ``publisher``: submits and cancels tasks, follows them, asks for status and health;
- ``reader``: reads (``log export``, ``export grpo``, ``report``, ``replay``, ``status``);
- ``daemon``: what a daemon does (appends events, takes work from its durable consumers
  and looks at the commands queued there, creates the streams, keeps the read model's
  object store) and what a publisher does
  (``kernelflow run`` is both; ``log import`` appends too);
- ``verifier``: a verifier-only daemon (``daemon --roles verifier --no-read-model``):
  records verification results, and giving up on one, and shares the extensions it
  built (the object store ``KF_EXTENSIONS``, which only the daemon role creates); nothing
  else.

No role may delete, purge or change a stream, nor delete a consumer but the daemon. A
user subscribes under ``_INBOX`` only to its own inbox (``_INBOX.<its public key>.>``,
where kernelflow's clients take their replies), so no user sees the replies another gets
(the inbox names among them): where a role may answer on others' inboxes, that is all it
can do with them. (NATS's ``allow_responses`` is not used: it would let a verifier answer
a ping whose reply subject is a stream's delete request.)

Keys are NATS nkeys: a user holds its seed (``SU…``, in a file only it may read) and the
server knows its public key (``U…``); nothing secret is in a server configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nkeys

from kernelflow.actors.connection import inbox_prefix, public_key_of
from kernelflow.events import subjects
from kernelflow.events.model import AgentFailed, VerificationCompleted
from kernelflow.workflows.model import VERIFIER

# The role of kernelflow's own processes on the embedded server: ``run`` hosts a daemon and
# submits to it.
OWNER_ROLE = "daemon"
_EVENTS, _COMMANDS = subjects.EVENTS_STREAM, subjects.COMMANDS_STREAM
_SNAPSHOTS = subjects.READMODEL_STREAM  # the stream of the read model's object store


def _api(*tokens: str) -> str:
    return ".".join(("$JS.API", *tokens))


def _acks(stream: str, consumer: str = "*") -> tuple[str, ...]:
    """Acknowledging (ack, nak, in progress) what ``consumer`` delivered, in both forms of
    the subject a server may use (the newer one adds a domain and an account hash)."""
    return (f"$JS.ACK.{stream}.{consumer}.>", f"$JS.ACK.*.*.{stream}.{consumer}.>")


# What every role does: look at the streams (each connection checks them) and their
# consumers (``kernelflow health``), read events, ask for status and for health.
_READING = (
    _api("INFO"),
    *(_api("STREAM.INFO", s) for s in (_EVENTS, _COMMANDS)),
    *(_api("CONSUMER.LIST", s) for s in (_EVENTS, _COMMANDS)),
    *(_api("CONSUMER.INFO", s, "*") for s in (_EVENTS, _COMMANDS)),
    # Events by sequence (kernelflow.events.scan): batched direct gets from any replica,
    # message gets from the stream's leader. No consumer: creating one may reconfigure
    # another (docs/security.md).
    _api("DIRECT.GET", _EVENTS),
    _api("STREAM.MSG.GET", _EVENTS),
    subjects.STATUS_QUERY,
    subjects.HEALTH_PING,
)
_COMMANDING = (subjects.SUBMIT, subjects.CANCEL)
# Events as they are recorded, and refused commands: what one may read anyway, live.
_WATCHING = (subjects.ALL_EVENTS, subjects.ERRORS)
# The read model's snapshots: an object store (chunks and metadata under $O.<bucket>, an
# object's metadata read by a message get, its chunks through an ordered consumer that
# expires by itself; an object is replaced by purging its old chunks).
_SNAPSHOTTING = (
    subjects.READMODEL_SUBJECTS,
    *(_api(verb, _SNAPSHOTS) for verb in ("STREAM.INFO", "STREAM.CREATE", "STREAM.PURGE")),
    _api("STREAM.MSG.GET", _SNAPSHOTS),
    _api("STREAM.NAMES"),  # an ordered consumer looks its stream up by subject
    _api("CONSUMER.CREATE", _SNAPSHOTS),
    f"$JS.FC.{_SNAPSHOTS}.>",  # the ordered consumers' flow control
    f"$JS.FC.*.*.{_SNAPSHOTS}.>",
)

# The verifiers' shared extensions (``subjects.EXTENSIONS_BUCKET``): an object store used
# as the read model's is; putting an entry again (one found damaged, rebuilt) purges its
# old chunks. Creating it is the daemon role's alone: a stream create names the stream's
# subjects, and a stream of the verifier's making could capture others' messages.
_EXTENSIONS = subjects.EXTENSIONS_STREAM
_SHARING_EXTENSIONS = (
    subjects.EXTENSIONS_SUBJECTS,
    *(_api(verb, _EXTENSIONS) for verb in ("STREAM.INFO", "STREAM.PURGE", "STREAM.MSG.GET")),
    _api("STREAM.NAMES"),
    _api("CONSUMER.CREATE", _EXTENSIONS),
    f"$JS.FC.{_EXTENSIONS}.>",
    f"$JS.FC.*.*.{_EXTENSIONS}.>",
)


@dataclass(frozen=True)
class Role:
    name: str
    summary: str
    publish: tuple[str, ...]
    # Besides the user's own inbox.
    subscribe: tuple[str, ...] = ()


ROLES = {
    role.name: role
    for role in (
        Role(
            "publisher",
            "submit and cancel tasks, follow them, ask for status and health",
            (*_READING, *_COMMANDING),
            subscribe=_WATCHING,
        ),
        Role(
            "reader",
            "read the log (export, report, replay, status)",
            _READING,
            subscribe=_WATCHING,
        ),
        Role(
            "daemon",
            "everything a daemon does, and what a publisher does",
            (
                *_READING,
                *_COMMANDING,
                subjects.ALL_EVENTS,
                subjects.ERRORS,
                "_INBOX.>",  # answers: to commands (KF-Reply), status queries, pings
                *(_api("STREAM.CREATE", s) for s in (_EVENTS, _COMMANDS)),
                *(_api("CONSUMER.DURABLE.CREATE", s, "*") for s in (_EVENTS, _COMMANDS)),
                *(_api("CONSUMER.MSG.NEXT", s, "*") for s in (_EVENTS, _COMMANDS)),
                # Its read model's cursor, recreated on every start.
                _api("CONSUMER.DELETE", _EVENTS, "*"),
                # The conductor: whether a submit queued before a cancel is unsettled (a
                # cancel of a task not in the log yet waits for its submit).
                _api("STREAM.MSG.GET", _COMMANDS),
                *_acks(_EVENTS),
                *_acks(_COMMANDS),
                *_SNAPSHOTTING,
                *(s for s in _SHARING_EXTENSIONS if s not in _SNAPSHOTTING),
                _api("STREAM.CREATE", _EXTENSIONS),
            ),
            subscribe=(*_WATCHING, subjects.STATUS_QUERY, subjects.HEALTH_PING),
        ),
        Role(
            VERIFIER,
            "a verifier-only daemon: record verification results and nothing else",
            (
                *_READING,
                subjects.of_kind(VerificationCompleted),
                subjects.of_kind(AgentFailed),  # giving up on a candidate that keeps failing
                _api("CONSUMER.DURABLE.CREATE", _EVENTS, subjects.agent_consumer(VERIFIER)),
                _api("CONSUMER.MSG.NEXT", _EVENTS, subjects.agent_consumer(VERIFIER)),
                *_acks(_EVENTS, subjects.agent_consumer(VERIFIER)),
                "_INBOX.>",  # answers to health pings
                *_SHARING_EXTENSIONS,
            ),
            subscribe=(subjects.HEALTH_PING,),
        ),
    )
}


# --------------------------------------------------------------------------- configuration


def user_entry(role: Role, public_key: str) -> str:
    """The ``authorization.users`` entry that gives the key ``public_key`` ``role``: one
    line, its role named at the end (``users_of`` reads it back)."""
    permissions = {
        "publish": list(role.publish),
        "subscribe": [f"{inbox_prefix(public_key)}.>", *role.subscribe],
    }
    entry = {"nkey": public_key, "permissions": permissions}
    return f"{json.dumps(entry)}  # {role.name}"


def authorization(users: list[tuple[str, Role]]) -> str:
    """The server configuration that lets in these (public key, role) users, and no one
    else."""
    lines = ["authorization {", "  users = ["]
    lines += [f"    {user_entry(role, key)}" for key, role in users]
    return "\n".join([*lines, "  ]", "}"]) + "\n"


USERS_HEADER = """\
# The users of kernelflow's nats-server (deploy/nats-server.conf includes this file), one
# a line, each with its role's permissions (docs/security.md). Written by kernelflow:
#   kernelflow creds ROLE --new --out SEED --users-file THIS   adds a user;
#   kernelflow creds --users-file THIS    gives every user the permissions its role has in
#                                         the kernelflow that runs it (after an upgrade).
# Delete a line, then reload the server (nats-server --signal reload), to let that key in
# no more.
"""
_ENTRY = re.compile(r'^\s*\{"nkey": "(U[A-Z0-9]+)".*#\s*([a-z]+)\s*$')


def users_of(users_file: Path) -> list[tuple[str, Role]]:
    """The (public key, role) users of a users file this module wrote (none if missing)."""
    if not users_file.exists():
        return []
    found = (_ENTRY.match(line) for line in users_file.read_text().splitlines())
    return [(m[1], ROLES[m[2]]) for m in found if m is not None and m[2] in ROLES]


def write_users(users_file: Path, users: list[tuple[str, Role]]) -> None:
    users_file.write_text(USERS_HEADER + authorization(users))


def add_user(users_file: Path, role: Role, public_key: str) -> None:
    """Add a user of ``role`` to a users file (made when missing), replacing an entry for
    the same key; every entry gets the permissions of this version of kernelflow."""
    users = [(key, had) for key, had in users_of(users_file) if key != public_key]
    write_users(users_file, [*users, (public_key, role)])


# --------------------------------------------------------------------------- keys


def new_seed() -> bytes:
    """A new user nkey seed (``SU…``)."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def write_secret(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data``, readable by its owner only, whole or not at all;
    FileExistsError if something is there already (a seed in use is never replaced)."""
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.link(temp, path)
    finally:
        os.unlink(temp)


class LocalKeys:
    """The keys of the embedded server of one data dir: a seed per role in
    ``<directory>/<role>.nk`` (the directory 0700, each file 0600), made on first use and
    kept. Every kernelflow process using that data dir takes its credentials from here."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def seed_file(self, role: str) -> Path:
        path = self.directory / f"{role}.nk"
        if not path.exists():
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Another process may make it first: then theirs is the one.
            with contextlib.suppress(FileExistsError):
                write_secret(path, new_seed() + b"\n")
        return path

    def public_key(self, role: str) -> str:
        return public_key_of(self.seed_file(role).read_bytes().strip())

    def server_authorization(self) -> str:
        """The embedded server's configuration: every role, one user each."""
        return authorization([(self.public_key(name), role) for name, role in ROLES.items()])
