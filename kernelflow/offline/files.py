"""Log files on disk: read (plain or gzip-compressed, a damaged one refused as corrupt)
and written whole or not at all."""

from __future__ import annotations

import contextlib
import gzip
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from kernelflow.events.model import Event
from kernelflow.host.exits import UsageError
from kernelflow.projections import logfile


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[BinaryIO]:
    """A (possibly gzip-compressed) file opened to read; a damaged one is a corrupt log."""
    try:
        raw: Any = gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")  # noqa: SIM115
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from exc
    with raw:
        try:
            yield raw
        except (OSError, EOFError) as exc:  # a damaged gzip stream
            raise logfile.CorruptLogFile(f"{path}: cannot be read: {exc}") from exc


def open_lines(path: Path) -> Iterator[bytes]:
    """The lines of a (possibly gzip-compressed) file, as bytes with their newline."""
    with _reading(path) as raw:
        yield from raw


def open_blocks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of a (possibly gzip-compressed) file, ``size`` at a time."""
    with _reading(path) as raw:
        while block := raw.read(size):
            yield block


@contextlib.contextmanager
def atomic_output(path: Path) -> Iterator[Path]:
    """A temporary path that becomes ``path`` only if the block succeeds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()


def open_write(path: Path, final_name: str) -> BinaryIO:
    """``path`` opened to write, gzip-compressed when ``final_name`` ends in ``.gz``."""
    if final_name.endswith(".gz"):
        # mtime=0 and no file name in the gzip header: the same log gives the same bytes.
        return gzip.GzipFile(filename="", mode="wb", fileobj=path.open("wb"), mtime=0)  # type: ignore[return-value]
    return path.open("wb")


@contextlib.contextmanager
def refusing_corrupt() -> Iterator[None]:
    """A corrupt log file is the user's input error: exit 2 with one line saying why."""
    try:
        yield
    except logfile.CorruptLogFile as exc:
        raise UsageError(f"refusing {exc}") from exc


def verify_file(path: Path) -> logfile.FileSummary:
    with refusing_corrupt():
        return logfile.verify(open_lines(path), name=str(path))


def file_events(path: Path) -> Iterator[tuple[int, Event]]:
    with refusing_corrupt():
        yield from logfile.read_events(open_lines(path), name=str(path))
