"""Compiled C++/CUDA extensions shared by the verifiers of a cluster, behind each node's
disk cache (:mod:`.extensions`): a candidate's extension is compiled once per cluster, not
once per verifier.

The engine sees the shared store through :class:`ExtensionStore`, two calls on bytes
keyed by the cache's key (:meth:`ExtensionSpec.key`): a daemon's verifier actor gives it
one on NATS JetStream's object store (``kernelflow.actors.extension_store``);
``kernelflow verify`` and every other use of the engine without NATS give none, and use
the disk cache alone. The flow, for each extension a candidate builds
(``engine._built_extensions``):

1. the disk cache has it: use it;
2. else the store has it: check it (:func:`unpack`), write it into the disk cache whole
   (aside, then renamed into place, as a build is stored), use it;
3. else build it (the build job, under the build lock), store it on disk, then put it
   into the store: best effort, a put that fails is logged and changes no verdict.

An entry is the library with what it was built from, checked on the way in: one JSON
line (format, key, module name, the spec: sources and flags, the library's size and
sha256), then the library's bytes. A get whose line does not parse, names another key,
module or spec, or whose library's size or digest differ, is ignored (logged): the
extension is built instead, and the put that follows replaces the entry. Entries larger
than ``max_bytes`` (``VerifierConfig.extension_share_max_bytes``, 64 MiB by default) are
neither put nor fetched.

What an entry cannot prove is who wrote it: whoever may write the bucket (the daemon and
verifier roles, docs/security.md) may put a library of their own under any key. Both can
record verdicts directly, so that gives them nothing they lacked; the library runs only
in the candidate's sandbox, as the candidate's code does.

Parent side: stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Protocol

from kernelflow.verification.backends.extension import ExtensionSpec
from kernelflow.verification.extensions import Extension, place, unbuilt

__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMAT",
    "BadEntry",
    "ExtensionStore",
    "fetch",
    "pack",
    "share",
    "unpack",
]

log = logging.getLogger("kernelflow.extensions")

FORMAT = "kernelflow-extension/1"
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class ExtensionStore(Protocol):
    """Where a cluster's verifiers share what they built: entries by key. Either call may
    raise (the store unreachable, a timeout): the engine logs it and goes on without."""

    def get(self, key: str) -> bytes | None:
        """The entry stored under ``key``; None when there is none (or one too large)."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing what was there."""
        ...


class BadEntry(ValueError):
    """An entry that is not what its key promises (why, in words)."""


def pack(extension: Extension, library: bytes) -> bytes:
    """The entry of ``extension`` built as ``library``."""
    header = {
        "format": FORMAT,
        "key": extension.entry.name,
        "module": extension.module,
        "spec": extension.spec.to_json(),
        "size": len(library),
        "sha256": hashlib.sha256(library).hexdigest(),
    }
    return json.dumps(header, sort_keys=True).encode() + b"\n" + library


def unpack(extension: Extension, data: bytes) -> bytes:
    """The library of an entry fetched for ``extension``; BadEntry if it is not one."""
    line, newline, library = data.partition(b"\n")
    try:
        header = json.loads(line) if newline else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise BadEntry("not an entry of this format")
    for field, wanted in (("key", extension.entry.name), ("module", extension.module)):
        if header.get(field) != wanted:
            raise BadEntry(f"its {field} is not the extension's")
    try:
        spec = ExtensionSpec.from_json(header["spec"])
    except (KeyError, TypeError, ValueError):
        spec = None
    if spec != extension.spec:
        raise BadEntry("its spec (sources, flags) is not the extension's")
    if header.get("size") != len(library):
        raise BadEntry(f"{len(library)} bytes of library, {header.get('size')!r} announced")
    if header.get("sha256") != hashlib.sha256(library).hexdigest():
        raise BadEntry("the library's sha256 does not match")
    return library


def fetch(extensions: list[Extension], shared: ExtensionStore, max_bytes: int) -> list[Extension]:
    """Bring those of ``extensions`` the disk cache lacks from ``shared`` into it; those
    still missing (to build). An entry that is not usable is logged and left out."""
    for extension in unbuilt(extensions):
        key = extension.entry.name
        try:
            data = shared.get(key)
        except Exception as exc:  # the store is a cache: building is always possible
            log.warning("shared extension store: getting %s failed: %r", key[:16], exc)
            continue
        if data is None:
            continue
        if len(data) > max_bytes:
            log.info("shared extension store: %s is over %d bytes: not used", key[:16], max_bytes)
            continue
        try:
            library = unpack(extension, data)
        except BadEntry as exc:
            log.warning(
                "shared extension store: entry %s ignored (%s); it is built again", key[:16], exc
            )
            continue
        place(extension, library)
        log.info(
            "extension %r (%s) fetched from the shared store: %d bytes, not built here",
            extension.spec.name,
            key[:16],
            len(library),
        )
    return unbuilt(extensions)


def share(extensions: list[Extension], shared: ExtensionStore, max_bytes: int) -> None:
    """Put ``extensions``, built into the disk cache, into ``shared`` for the other
    verifiers. Best effort: what fails is logged, nothing is raised."""
    for extension in extensions:
        key = extension.entry.name
        try:
            data = pack(extension, extension.library.read_bytes())
        except OSError as exc:
            log.warning("shared extension store: %s not shared: %r", key[:16], exc)
            continue
        if len(data) > max_bytes:
            log.info(
                "shared extension store: %s not shared: %d bytes, over the %d allowed",
                key[:16],
                len(data),
                max_bytes,
            )
            continue
        try:
            shared.put(key, data)
        except Exception as exc:
            log.warning("shared extension store: putting %s failed: %r", key[:16], exc)
            continue
        log.info("extension %r (%s) put into the shared store", extension.spec.name, key[:16])
