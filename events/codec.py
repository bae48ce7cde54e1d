"""JSON on the wire, so that any NATS client can publish commands and read events.

Decoding follows the schema's evolution (see ``kernelflow.events.model``): an event of an
older ``v`` for which an upcaster is registered is upgraded to today's shape first, and an
event of a kind this version does not know becomes an ``UnknownEvent`` instead of an
error, so a daemon of an older version never wedges on a task a newer one wrote to.

Whatever a publisher sends, decoding either returns or raises ``MalformedMessage``: a
command over ``MAX_COMMAND_BYTES`` is refused unread, and JSON nested too deeply for the
decoder (``RecursionError``) is malformed like any other.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, cast

import msgspec

from kernelflow.events.model import (
    BACKEND_NAME_PATTERN,
    EVENT_TYPES,
    TASK_ID_PATTERN,
    AnyCommand,
    AnyEvent,
    Command,
    Event,
    QuarantinedEvent,
    SubmitTask,
    TaskId,
    UnknownEvent,
)


class MalformedMessage(ValueError):
    """A payload that is not a valid command or event. The message says what is wrong."""


# msgspec's names of JSON types, as a message says them.
_TYPE_WORDS = {
    "str": "text",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "object": "an object",
    "array": "a list",
    "null": "null",
}

# The patterns of the schema's names, as a message says them.
_PATTERN_WORDS = {
    TASK_ID_PATTERN: "1 to 64 letters, digits, '_' or '-'",
    BACKEND_NAME_PATTERN: "a lowercase letter, then up to 31 of a-z, 0-9, '_' or '-'",
}


def in_words(exc: msgspec.DecodeError) -> str:
    """What msgspec found wrong, said in a message's terms: the field first, types by
    name ("deadline_s: expected a number > 0.0", not "Expected `float` > 0.0 - at
    `$.deadline_s`")."""
    what, _, where = str(exc).partition(" - at `")
    what = what.replace("Object missing required field", "missing field")
    what = re.sub(r"`([^`]*)`", lambda m: _TYPE_WORDS.get(m[1], m[1]), what)
    what = re.sub(r"text matching regex '([^']*)'", lambda m: _PATTERN_WORDS.get(m[1], m[0]), what)
    if what[1:2].islower():  # "Expected", "Invalid"; not "JSON"
        what = what[:1].lower() + what[1:]
    field = where.rstrip("`").removeprefix("$").removeprefix(".")
    return f"{field}: {what}" if field else what


_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(AnyEvent)
_command_decoder = msgspec.json.Decoder(AnyCommand)
_object_decoder = msgspec.json.Decoder(dict[str, Any])
_quarantine_record_decoder = msgspec.json.Decoder(QuarantinedEvent)
QUARANTINE_RECORD_START = b'{"kind":"__quarantined__"'
# The largest command a daemon reads (JetStream's default message limit is 1 MiB; a
# server configured for more still never makes a daemon decode more than this).
MAX_COMMAND_BYTES = 4 << 20

KNOWN_KINDS = frozenset(cast(str, t.__struct_config__.tag) for t in EVENT_TYPES)
# A kind becomes a subject token (kf.ev.<task>.<kind>): an unknown one must be a safe name.
_KIND = re.compile(r"[a-z][a-z0-9_]{0,63}")

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


class _Envelope(msgspec.Struct, kw_only=True):
    """What every event has, whatever its kind: enough to place an unknown one."""

    v: int = 1
    task_id: TaskId
    seq: int = 0
    at: float = 0.0
    cause: str = ""


def upcaster(kind: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
    """Register a function that turns the JSON object of a ``kind`` event recorded at
    schema version ``from_version`` into the object of the next version (setting ``v``).
    Decoding chains them, so an event of any old version reads as today's."""
    if kind not in KNOWN_KINDS:
        raise ValueError(f"upcaster for unknown event kind {kind!r}")

    def register(fn: Upcaster) -> Upcaster:
        key = (kind, from_version)
        if key in _UPCASTERS:
            raise ValueError(f"an upcaster for {kind} v{from_version} is already registered")
        _UPCASTERS[key] = fn
        return fn

    return register


def encode(message: Event | Command | msgspec.Struct) -> bytes:
    if type(message) is UnknownEvent:
        return message.raw  # as it was recorded: this version cannot re-encode it
    return _encoder.encode(message)


def decode_event(data: bytes) -> Event:
    try:
        return _decode_event(data)
    except RecursionError:
        raise MalformedMessage("not a kernelflow event: JSON nested too deeply") from None


def _decode_event(data: bytes) -> Event:
    try:
        event: Event = _event_decoder.decode(data)
    except msgspec.DecodeError as exc:
        return _decode_unusual(data, exc)
    if _UPCASTERS and (event.kind, event.v) in _UPCASTERS:
        return _upcast(_object_decoder.decode(data))
    return event


def decode_record(data: bytes) -> Event:
    """An exported log file's record: an event, or the ``QuarantinedEvent`` an export
    wrote for a message of the log that was not one. (Only files hold such records: the
    live log's messages go through ``decode_event``, which refuses them.)"""
    if not data.startswith(QUARANTINE_RECORD_START):
        return decode_event(data)
    try:
        return _quarantine_record_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedMessage(f"not a quarantine record: {exc}") from None


def _decode_unusual(data: bytes, error: msgspec.DecodeError) -> Event:
    """An event the fast path refused: an old version to upcast, a kind from a newer
    version, or not an event at all."""
    try:
        obj = _object_decoder.decode(data)
    except msgspec.DecodeError:
        raise MalformedMessage(f"not a kernelflow event: {error}") from None
    kind, version = obj.get("kind"), obj.get("v")
    if isinstance(kind, str) and isinstance(version, int) and (kind, version) in _UPCASTERS:
        return _upcast(obj)
    if not isinstance(kind, str) or kind in KNOWN_KINDS:
        raise MalformedMessage(f"not a kernelflow event: {error}")
    try:
        envelope = msgspec.convert(obj, _Envelope)
    except msgspec.ValidationError as exc:
        raise MalformedMessage(f"not a kernelflow event: {in_words(exc)}") from None
    if not _KIND.fullmatch(kind):
        raise MalformedMessage(f"not a kernelflow event: kind {kind[:80]!r} is not a name")
    return UnknownEvent(
        v=envelope.v,
        task_id=envelope.task_id,
        seq=envelope.seq,
        at=envelope.at,
        cause=envelope.cause,
        original_kind=kind,
        raw=bytes(data).strip(),
    )


def _upcast(obj: dict[str, Any]) -> Event:
    key = (obj["kind"], obj["v"])
    while key in _UPCASTERS:
        obj = _UPCASTERS[key](dict(obj))
        if not isinstance(obj.get("v"), int) or obj["v"] <= key[1]:
            raise MalformedMessage(f"the upcaster of {key[0]} v{key[1]} did not raise v")
        key = (obj["kind"], obj["v"])
    try:
        return cast(Event, msgspec.convert(obj, AnyEvent))
    except msgspec.ValidationError as exc:
        raise MalformedMessage(f"not a kernelflow event after upcasting: {in_words(exc)}") from None


def decode_command(data: bytes) -> Command:
    if len(data) > MAX_COMMAND_BYTES:
        raise MalformedMessage(
            f"not a kernelflow command: {len(data)} bytes, over the limit of {MAX_COMMAND_BYTES}"
        )
    try:
        command: Command = _command_decoder.decode(data)
        if type(command) is SubmitTask and b'"workflow"' in data:
            # Maybe v1's name of the workflow (absent ``v`` reads as today's: look again).
            obj = _object_decoder.decode(data)
            if obj.get("v", 1) < 2 and "workflow" in obj:
                command = msgspec.convert(_submit_task_v2(obj), AnyCommand)
    except msgspec.DecodeError as exc:  # a ValidationError too
        raise MalformedMessage(f"not a kernelflow command: {in_words(exc)}") from exc
    except RecursionError:
        raise MalformedMessage("not a kernelflow command: JSON nested too deeply") from None
    return command


def _submit_task_v2(obj: dict[str, Any]) -> dict[str, Any]:
    """A ``submit_task`` of v1, or written without ``v``: its ``workflow`` is v2's
    ``workflow_name`` (the name ``TaskSubmitted`` records it under)."""
    renamed = {k: v for k, v in obj.items() if k != "workflow"}
    renamed.setdefault("workflow_name", obj["workflow"])
    return {**renamed, "v": 2}


def checked_command(command: Command) -> Command:
    """``command`` as a daemon will read it. Constructing a command checks no constraint of
    the schema (a task id's alphabet, a positive deadline): a publisher checks here, since
    a daemon can only refuse what breaks them, after it was published."""
    return decode_command(encode(command))


def to_builtins(message: msgspec.Struct) -> dict[str, Any]:
    return cast(dict[str, Any], msgspec.to_builtins(message))


def json_schema(*, events: bool = False) -> dict[str, Any]:
    """JSON Schema of what publishers may send (commands), or of the events they may read."""
    return msgspec.json.schema(AnyEvent if events else AnyCommand)


@upcaster("task_submitted", from_version=1)
def _routed_before_version_2(obj: dict[str, Any]) -> dict[str, Any]:
    """A task recorded before ``routing_version`` was decided by the first routing rules
    (``TaskSubmitted.routing_version``; docs/workflows.md, "Routing")."""
    return {**obj, "routing_version": 1, "v": 2}
