"""The exported log file: a portable, self-checking copy of (part of) the event log.

Format (JSON lines, UTF-8; optionally gzip-compressed by the tools when the name ends in
``.gz``):

    line 1      header   {"format": "kernelflow-log", "version": 1, "schema": 1,
                          "filter": {...}}
    lines 2..n  records  one event each, exactly as on the wire (``kernelflow.events.codec.encode``)
    last line   trailer  {"end": "kernelflow-log", "records": N, "sha256": "<hex>"}

``sha256`` is taken over the bytes of the header and record lines, newlines included. A
file is valid only if the trailer is present, the count and digest match, and every
task's events are in order (``seq`` 1, 2, 3... with no gap). A message of the log that
was not an event of its task (see ``kernelflow.events.quarantine``) is exported as a
quarantine record, ``{"kind": "__quarantined__", ...}``: where it was (subject, stream
sequence), why it was quarantined, its size and first bytes (``evidence``, base64). It
has no place in its task's sequence; readers count it (``FileSummary.quarantined``) and
skip it, and an import leaves it out. Records are in log order, so
importing them in file order preserves every task's order. Nothing in the file depends on
when it was written: the same log exports to the same bytes.

This module is pure: it turns events into lines and lines back into events; the tools
open the files.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import msgspec

from kernelflow.events.codec import MalformedMessage, decode_record, encode
from kernelflow.events.model import SCHEMA_VERSION, Event, QuarantinedEvent

FORMAT = "kernelflow-log"
VERSION = 1


class CorruptLogFile(ValueError):
    """The file is not a complete, unmodified kernelflow log export."""


class Header(msgspec.Struct, frozen=True, kw_only=True):
    format: str
    version: int
    schema: int = SCHEMA_VERSION
    filter: dict[str, str] = {}


class Trailer(msgspec.Struct, frozen=True, kw_only=True):
    end: str
    records: int
    sha256: str


class LogWriter:
    """Build an export line by line: ``header()``, ``record(event)`` for each event in
    log order, then ``trailer()``."""

    def __init__(self, filter: dict[str, str] | None = None) -> None:
        self._hash = hashlib.sha256()
        self._filter = dict(sorted((filter or {}).items()))
        self.records = 0

    def header(self) -> bytes:
        line = msgspec.json.encode(Header(format=FORMAT, version=VERSION, filter=self._filter))
        self._hash.update(line + b"\n")
        return line + b"\n"

    def record(self, event: Event) -> bytes:
        line = encode(event) + b"\n"
        self._hash.update(line)
        self.records += 1
        return line

    def trailer(self) -> bytes:
        t = Trailer(end=FORMAT, records=self.records, sha256=self._hash.hexdigest())
        return msgspec.json.encode(t) + b"\n"


@dataclass
class FileSummary:
    header: Header
    records: int
    sha256: str
    tasks: dict[str, int] = field(default_factory=dict)  # task id → events in the file
    quarantined: int = 0  # quarantine records (not events, not in ``tasks``)


def _line_no_newline(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\n") else line


def _header(it: Iterator[bytes], h: hashlib._Hash, name: str) -> Header:
    try:
        first = next(it)
    except StopIteration:
        raise CorruptLogFile(f"{name}: empty file, not a kernelflow log export") from None
    try:
        header = msgspec.json.decode(_line_no_newline(first), type=Header)
    except msgspec.DecodeError as exc:
        raise CorruptLogFile(f"{name}: line 1 is not a kernelflow log header ({exc})") from None
    if header.format != FORMAT:
        raise CorruptLogFile(f"{name}: format {header.format!r}, expected {FORMAT!r}")
    if header.version > VERSION:
        raise CorruptLogFile(
            f"{name}: file version {header.version} is newer than this kernelflow ({VERSION})"
        )
    h.update(first if first.endswith(b"\n") else first + b"\n")
    return header


# A trailer line follows a newline: records are single-line JSON objects that begin
# with their "kind", so this never occurs inside one.
_TRAILER_START = b'{"end":'
_TRAILER_MARK = b"\n" + _TRAILER_START
_NEWLINE = ord("\n")


def _is_trailer(body: bytes) -> bool:
    return body.startswith(_TRAILER_START)


def _check_end(
    body: bytes, it: Iterator[bytes], h: hashlib._Hash, count: int, line_no: int, name: str
) -> None:
    """The trailer ``body`` (line ``line_no``) matches the ``count`` records and digest
    ``h`` before it, and nothing follows it."""
    try:
        trailer = msgspec.json.decode(body, type=Trailer)
    except msgspec.DecodeError as exc:
        raise CorruptLogFile(f"{name}: line {line_no}: bad trailer ({exc})") from None
    if trailer.records != count:
        raise CorruptLogFile(
            f"{name}: trailer says {trailer.records} records, the file has {count}"
        )
    if trailer.sha256 != h.hexdigest():
        raise CorruptLogFile(
            f"{name}: SHA-256 mismatch: the file was modified or damaged "
            f"(expected {trailer.sha256}, got {h.hexdigest()})"
        )
    for extra in it:
        if extra.strip():
            raise CorruptLogFile(f"{name}: data after the trailer (line {line_no + 1})")


def _truncated(name: str, count: int) -> CorruptLogFile:
    return CorruptLogFile(f"{name}: no trailer: the file is truncated ({count} records read)")


def read_events(lines: Iterable[bytes], *, name: str = "log file") -> Iterator[tuple[int, Event]]:
    """Yield ``(record number, event)`` from an export's lines, checking as it goes; the
    digest can only be checked at the end, so a caller that must not act on a corrupt
    file runs ``verify`` (or ``check_digest``) first. Raises ``CorruptLogFile`` naming
    the line."""
    it = iter(lines)
    h = hashlib.sha256()
    _header(it, h, name)
    last_seq: dict[str, int] = {}
    count = 0
    line_no = 1
    for raw in it:
        line_no += 1
        if _is_trailer(raw):
            _check_end(_line_no_newline(raw), it, h, count, line_no, name)
            return
        # The line as read, newline and all: no copies of it (records are kilobytes).
        h.update(raw if raw.endswith(b"\n") else raw + b"\n")
        try:
            event = decode_record(raw)  # JSON allows the trailing newline
        except MalformedMessage as exc:
            raise CorruptLogFile(f"{name}: line {line_no}: {exc}") from None
        if type(event) is not QuarantinedEvent:
            expected = last_seq.get(event.task_id, 0) + 1
            if event.seq != expected:
                raise CorruptLogFile(
                    f"{name}: line {line_no}: task {event.task_id} event seq {event.seq}, "
                    f"expected {expected} (events out of order or missing)"
                )
            last_seq[event.task_id] = event.seq
        count += 1
        yield count, event
    raise _truncated(name, count)


@dataclass
class FileDigest:
    header: Header
    records: int
    sha256: str


def check_digest(blocks: Iterable[bytes], *, name: str = "log file") -> FileDigest:
    """Check that an export is complete and unmodified (header, record count, SHA-256)
    from its bytes, in blocks of any size, without splitting or decoding its records:
    a fraction of ``verify``'s time. What only decoding shows (a record that is not an
    event, events out of order: an exporter's bug, since the digest matches)
    ``read_events`` still refuses as it reaches it."""
    it = iter(blocks)
    h = hashlib.sha256()
    block = b""
    while b"\n" not in block and (more := next(it, None)) is not None:
        block += more
    first, newline, block = block.partition(b"\n")
    header = _header(iter([first + newline] if first or newline else []), h, name)
    records = 0  # newlines hashed after the header's: one per record
    pending = b""  # the last bytes seen, not hashed yet: a trailer may begin in them
    newline_before = True  # the byte hashed just before ``pending`` is a newline
    while True:
        data = pending + block
        if newline_before and data.startswith(_TRAILER_START):
            at = 0
        else:
            at = data.find(_TRAILER_MARK) + 1 or -1  # where the trailer line starts
        if at >= 0:
            h.update(memoryview(data)[:at])
            records += data.count(b"\n", 0, at)
            rest = data[at:]
            while b"\n" not in rest and (more := next(it, None)) is not None:
                rest += more
            trailer, _, after = rest.partition(b"\n")
            _check_end(trailer, itertools.chain([after], it), h, records, records + 2, name)
            return FileDigest(header, records, h.hexdigest())
        # No trailer starts in ``data``, unless in its last bytes: the next block may
        # complete it.
        done = max(0, len(data) - len(_TRAILER_START))
        if done:
            h.update(memoryview(data)[:done])
            records += data.count(b"\n", 0, done)
            newline_before = data[done - 1] == _NEWLINE
        pending = data[done:]
        more = next(it, None)
        if more is None:
            raise _truncated(name, records + len(pending.splitlines()))
        block = more


def verify(lines: Iterable[bytes], *, name: str = "log file") -> FileSummary:
    """Check a whole export; return what it holds (raises ``CorruptLogFile``)."""
    tasks: dict[str, int] = {}
    h = hashlib.sha256()
    records = quarantined = 0
    header: Header | None = None

    def tee() -> Iterator[bytes]:
        nonlocal header
        for i, line in enumerate(lines):
            if i == 0:
                with contextlib.suppress(msgspec.DecodeError):  # read_events says why
                    header = msgspec.json.decode(_line_no_newline(line), type=Header)
            if not _is_trailer(line):
                h.update(line if line.endswith(b"\n") else line + b"\n")
            yield line

    for records, event in read_events(tee(), name=name):  # noqa: B007
        if type(event) is QuarantinedEvent:
            quarantined += 1
        else:
            tasks[event.task_id] = tasks.get(event.task_id, 0) + 1
    assert header is not None
    return FileSummary(header, records, h.hexdigest(), tasks, quarantined)
