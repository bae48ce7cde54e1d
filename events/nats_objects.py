"""Object stores on JetStream (``kernelflow.events.objects``' port): nats-py's object
store, its errors under the port's names."""

from __future__ import annotations

import nats.js.errors
from nats.js import JetStreamContext, api
from nats.js import object_store as nats_object_store

from kernelflow.events.objects import Buckets, ObjectInfo, ObjectNotFound, ObjectStore


def _info(info: api.ObjectInfo) -> ObjectInfo:
    return ObjectInfo(
        name=info.name,
        size=int(info.size or 0),
        digest=info.digest or "",
        description=info.description or "",
        mtime=info.mtime or "",
    )


class NatsObjectStore(ObjectStore):
    def __init__(self, store: nats_object_store.ObjectStore) -> None:
        self._store = store

    async def info(self, name: str) -> ObjectInfo:
        try:
            return _info(await self._store.get_info(name))
        except nats.js.errors.NotFoundError:  # ObjectNotFoundError too
            raise ObjectNotFound(name) from None

    async def get(self, name: str) -> bytes:
        try:
            result = await self._store.get(name)
        except nats.js.errors.NotFoundError:
            raise ObjectNotFound(name) from None
        return bytes(result.data or b"")

    async def put(self, name: str, data: bytes, *, description: str | None = None) -> None:
        await self._store.put(name, data, meta=api.ObjectMeta(name=name, description=description))

    async def delete(self, name: str) -> None:
        try:
            await self._store.delete(name)
        except nats.js.errors.NotFoundError:
            raise ObjectNotFound(name) from None

    async def list(self) -> list[ObjectInfo]:
        try:
            return [_info(i) for i in await self._store.list(ignore_deletes=True)]
        except nats.js.errors.NotFoundError:  # nothing stored yet
            return []


class NatsBuckets(Buckets):
    def __init__(self, js: JetStreamContext) -> None:
        self._js = js

    async def open(self, bucket: str) -> ObjectStore | None:
        try:
            return NatsObjectStore(await self._js.object_store(bucket))
        except nats.js.errors.BucketNotFoundError:
            return None

    async def create(self, bucket: str, *, description: str, replicas: int) -> ObjectStore:
        config = api.ObjectStoreConfig(
            description=description, storage=api.StorageType.FILE, replicas=replicas
        )
        return NatsObjectStore(await self._js.create_object_store(bucket, config=config))
