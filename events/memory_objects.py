"""Object stores in memory (``kernelflow.events.objects``' port), for the memory bridge:
the buckets of one memory server, shared by its bridges. Safe from any thread.

Nothing here imports NATS.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from kernelflow.events.objects import Buckets, ObjectInfo, ObjectNotFound, ObjectStore, digest_of


class MemoryObjectStore(ObjectStore):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, tuple[bytes, ObjectInfo]] = {}

    def _found(self, name: str) -> tuple[bytes, ObjectInfo]:
        with self._lock:
            if name not in self._objects:
                raise ObjectNotFound(name)
            return self._objects[name]

    async def info(self, name: str) -> ObjectInfo:
        return self._found(name)[1]

    async def get(self, name: str) -> bytes:
        return self._found(name)[0]

    async def put(self, name: str, data: bytes, *, description: str | None = None) -> None:
        data = bytes(data)
        now = datetime.now(UTC).isoformat()
        info = ObjectInfo(name, len(data), digest_of(data), description or "", now)
        with self._lock:
            self._objects[name] = (data, info)

    async def delete(self, name: str) -> None:
        with self._lock:
            if self._objects.pop(name, None) is None:
                raise ObjectNotFound(name)

    async def list(self) -> list[ObjectInfo]:
        with self._lock:
            return [info for _, info in self._objects.values()]


class MemoryBuckets(Buckets):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, MemoryObjectStore] = {}

    async def open(self, bucket: str) -> ObjectStore | None:
        with self._lock:
            return self._buckets.get(bucket)

    async def create(self, bucket: str, *, description: str, replicas: int) -> ObjectStore:
        with self._lock:
            return self._buckets.setdefault(bucket, MemoryObjectStore())
