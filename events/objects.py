"""Object stores: named blobs in a bucket, shared by the processes of one NATS (the read
model's snapshots, ``KF_READMODEL``; the verifiers' compiled extensions,
``KF_EXTENSIONS``: ``kernelflow.events.subjects`` names them). The interface; on
JetStream it is ``kernelflow.events.nats_objects``'s, in memory
``kernelflow.events.memory_objects``'s.

Nothing here imports NATS.
"""

from __future__ import annotations

import base64
import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass


class ObjectNotFound(LookupError):
    """No such object in the bucket (or it was deleted)."""


def digest_of(data: bytes) -> str:
    """An object's digest as stores give it (``ObjectInfo.digest``): ``SHA-256=`` and the
    URL-safe base64 of the SHA-256 of its bytes."""
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


@dataclass(frozen=True)
class ObjectInfo:
    name: str
    size: int
    digest: str
    # What its writer said of it (``put``'s ``description``), "" for nothing.
    description: str
    # When it was written, ISO 8601 ("" where the store does not say).
    mtime: str


class ObjectStore(ABC):
    """One bucket. Use it from one event loop (a bridge's)."""

    @abstractmethod
    async def info(self, name: str) -> ObjectInfo:
        """What the store holds under ``name``; ObjectNotFound when nothing."""

    @abstractmethod
    async def get(self, name: str) -> bytes:
        """The object's bytes (checked against its digest); ObjectNotFound when none."""

    @abstractmethod
    async def put(self, name: str, data: bytes, *, description: str | None = None) -> None:
        """Store ``data`` under ``name``, replacing what was there."""

    @abstractmethod
    async def delete(self, name: str) -> None:
        """Remove the object; ObjectNotFound when there is none."""

    @abstractmethod
    async def list(self) -> list[ObjectInfo]:
        """Every object in the bucket (none deleted), in no particular order."""


class Buckets(ABC):
    """The buckets of one NATS."""

    @abstractmethod
    async def open(self, bucket: str) -> ObjectStore | None:
        """The bucket, if it is there (None: not made yet)."""

    @abstractmethod
    async def create(self, bucket: str, *, description: str, replicas: int) -> ObjectStore:
        """Make the bucket (file storage, ``replicas`` copies), or open it if it is there."""
