"""JSON on the wire, so that any NATS client can publish commands and read events."""

from __future__ import annotations

from typing import Any

import msgspec

from kernelflow.events.model import AnyCommand, AnyEvent, Command, Event


class MalformedMessage(ValueError):
    """A payload that is not a valid command or event. The message says what is wrong."""


_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(AnyEvent)
_command_decoder = msgspec.json.Decoder(AnyCommand)


def encode(message: Event | Command | msgspec.Struct) -> bytes:
    return _encoder.encode(message)


def decode_event(data: bytes) -> Event:
    try:
        return _event_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedMessage(f"not a kernelflow event: {exc}") from exc


def decode_command(data: bytes) -> Command:
    try:
        return _command_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise MalformedMessage(f"not a kernelflow command: {exc}") from exc


def checked_command(command: Command) -> Command:
    """``command`` as a daemon will read it. Constructing a command checks no constraint of
    the schema (a task id's alphabet, a positive deadline): a publisher checks here, since
    a daemon can only refuse what breaks them, after it was published."""
    return decode_command(encode(command))


def to_builtins(message: msgspec.Struct) -> dict[str, Any]:
    return msgspec.to_builtins(message)


def json_schema(*, events: bool = False) -> dict[str, Any]:
    """JSON Schema of what publishers may send (commands), or of the events they may read."""
    return msgspec.json.schema(AnyEvent if events else AnyCommand)
