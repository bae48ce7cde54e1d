"""The subject scheme. Every event of a task lives under ``kf.ev.<task_id>.``.

``kf.ev.<task_id>.<kind>``                 most events
``kf.ev.<task_id>.agent_dispatched.<agent>`` work for one agent role (agents filter on it)
``kf.cmd.submit`` / ``kf.cmd.cancel``         commands from publishers (work-queue stream)
``kf.errors``                               refusals of commands (core NATS)
``kf.query.status``                         status queries a daemon's read model answers
``kf.health.ping``                          health pings every daemon answers
``$O.KF_READMODEL.>``                       the read model's snapshots (an object store)
``$O.KF_EXTENSIONS.>``                      the verifiers' shared extensions (an object store)

The durable consumers (``kernelflow.events.consumers``): ``kf-conductor-commands`` (the
commands), ``kf-conductor`` (the events that call for a decision), ``kf-agent-<role>``
(an agent role's dispatches), ``kf-readmodel-<instance>`` (a read model's cursor).

Every subject, stream, bucket and consumer name kernelflow uses is here, and only here
(``tests/unit/test_architecture.py`` holds the code to it): what names another is built from
these.

Answers (to a command's ``KF-Reply``, a status query's or a ping's reply subject) go only
to an inbox: see ``reply_refusal``.
"""

from __future__ import annotations

from kernelflow.events.model import DECISION_TRIGGERS, AgentDispatched, Event

EVENTS_STREAM = "KF_EVENTS"
COMMANDS_STREAM = "KF_CMD"
# The JetStream object store of the C++/CUDA extensions the verifiers of a cluster built,
# shared so that a source is compiled once per cluster (docs/clusters.md, "Compiled
# extensions, shared"): its bucket, the stream JetStream keeps it in, and its subjects.
EXTENSIONS_BUCKET = "KF_EXTENSIONS"
EXTENSIONS_STREAM = f"OBJ_{EXTENSIONS_BUCKET}"
EXTENSIONS_SUBJECTS = f"$O.{EXTENSIONS_BUCKET}.>"
# The read model's snapshots (``kernelflow.actors.readmodel``): the same, for its store.
READMODEL_BUCKET = "KF_READMODEL"
READMODEL_STREAM = f"OBJ_{READMODEL_BUCKET}"
READMODEL_SUBJECTS = f"$O.{READMODEL_BUCKET}.>"

EVENTS_ROOT = "kf.ev"
ALL_EVENTS = f"{EVENTS_ROOT}.>"
COMMANDS_ROOT = "kf.cmd"
ALL_COMMANDS = f"{COMMANDS_ROOT}.>"
SUBMIT = f"{COMMANDS_ROOT}.submit"
CANCEL = f"{COMMANDS_ROOT}.cancel"
# Replies to commands (accepted task id or an error) go to the subject a publisher names in
# this header; refusals of unparseable commands are also published on ERRORS.
REPLY_HEADER = "KF-Reply"
# On an event copied into a forked task (docs/workflows.md, "Forking a task"): history for
# the folds, no work for the daemons' consumers (they ack it at once).
HISTORY_ONLY_HEADER = "KF-History-Only"
ERRORS = "kf.errors"
# Requests among processes, on core NATS (no stream): the status queries a daemon's read
# model answers (``kernelflow.actors.readmodel_client``; one read model of the queue group
# ``READMODEL_GROUP`` answers each), the pings every daemon answers
# (``kernelflow.actors.health_pings``).
STATUS_QUERY = "kf.query.status"
READMODEL_GROUP = "kf-readmodel"
HEALTH_PING = "kf.health.ping"
# The durable consumers the daemons share (see the module's doc).
CONDUCTOR_COMMANDS_CONSUMER = "kf-conductor-commands"
CONDUCTOR_CONSUMER = "kf-conductor"
_AGENT_CONSUMER = "kf-agent-"
_MAX_REPLY_CHARS = 255


def reply_refusal(subject: str) -> str | None:
    """Why a daemon does not answer on ``subject``; None: it does.

    A reply subject is the publisher's inbox: a plain subject (printable ASCII, no white
    space, no empty token, no wildcard ``*`` or ``>``) outside kernelflow's namespace
    (``kf``: an answer there would be recorded in the log, or taken for a command or a
    query) and the server's (``$JS.``, ``$SYS.``, ``$KV.``...: an answer there is an API
    request). ``_INBOX.>``, what NATS clients make, is one; so is any subject of the
    publisher's own elsewhere (``_INBOX_alice.>``, ``myapp.replies.7``)."""
    if not subject:
        return "no reply subject"
    if len(subject) > _MAX_REPLY_CHARS:
        return f"reply subject longer than {_MAX_REPLY_CHARS} characters"
    shown = repr(subject[:80])
    if not (subject.isascii() and subject.isprintable()) or " " in subject:
        return f"reply subject {shown} is not printable ASCII without spaces"
    tokens = subject.split(".")
    if "" in tokens or "*" in subject or ">" in subject:
        return f"reply subject {shown} has an empty token or a wildcard"
    if tokens[0].lower() == "kf":
        return f"reply subject {shown} is in kernelflow's namespace (kf.)"
    if subject.startswith("$"):
        return f"reply subject {shown} is in the server's namespace ($)"
    return None


def task_of(subject: str) -> str:
    """The task a message is about, from its subject: ``kf.ev.<task_id>.<kind>...``."""
    return subject[len(EVENTS_ROOT) + 1 :].partition(".")[0]


def matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` is one of those NATS means by ``pattern`` (``*``: any one token;
    ``>`` at the end: one token or more)."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or (token != "*" and token != tokens[i]):
            return False
    return len(tokens) == len(wanted)


def task_events(task_id: str) -> str:
    return f"{EVENTS_ROOT}.{task_id}.>"


def event_subject(event: Event) -> str:
    subject = f"{EVENTS_ROOT}.{event.task_id}.{event.kind}"
    if isinstance(event, AgentDispatched):
        subject += f".{event.agent}"
    return subject


def agent_consumer(role: str) -> str:
    """The durable consumer the daemons hosting agent ``role`` share."""
    return f"{_AGENT_CONSUMER}{role}"


def readmodel_consumer(instance: str) -> str:
    """The cursor of read model ``instance`` (a name safe in a consumer's)."""
    return f"{READMODEL_GROUP}-{instance}"


def role_of_consumer(name: str) -> str | None:
    """The role whose work the durable consumer ``name`` holds; None: not a daemon's."""
    if name in (CONDUCTOR_COMMANDS_CONSUMER, CONDUCTOR_CONSUMER):
        return "conductor"
    if name.startswith(_AGENT_CONSUMER):
        return name.removeprefix(_AGENT_CONSUMER)
    return None


def dispatches_for(agent: str) -> str:
    return f"{EVENTS_ROOT}.*.agent_dispatched.{agent}"


def of_kind(kind: type[Event]) -> str:
    """Every task's events of ``kind`` (an event type)."""
    return f"{EVENTS_ROOT}.*.{kind.__struct_config__.tag}"


def decision_triggers() -> list[str]:
    return [of_kind(t) for t in DECISION_TRIGGERS]
