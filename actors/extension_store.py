"""The verifiers' shared extension store on NATS: JetStream's object store
``KF_EXTENSIONS`` (``subjects.EXTENSIONS_BUCKET``; reached through the bridge's object
stores, ``kernelflow.events.objects``), as the engine's ``ExtensionStore``
(``kernelflow.verification.extension_store`` says what an entry holds and when it is
used). A daemon creates the bucket as it starts, with the streams' replicas; the
verifier actor hands the engine a :class:`NatsExtensionStore`, whose calls run on the
bridge loop and wait on the actor's thread (``Bridge.call``).

A store that is not there yet (a verifier-only node's key may not create it: a daemon
with the daemon key does), or NATS that does not answer, makes each check build what its
node lacks, as a node alone does; the bucket is looked for again after a while.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from kernelflow.actors.bridge import Bridge
from kernelflow.events import subjects
from kernelflow.events.objects import Buckets, ObjectNotFound, ObjectStore
from kernelflow.verification.engine import VerifierConfig

__all__ = ["NatsExtensionStore", "ensure_extension_bucket", "with_shared_extensions"]

log = logging.getLogger("kernelflow.extensions")

# How long a get or a put may take (an entry is at most 64 MiB by default).
CALL_TIMEOUT_S = 60.0
# How long a bucket found missing is taken to be missing before it is looked for again.
_RELOOK_S = 30.0


async def ensure_extension_bucket(buckets: Buckets, replicas: int) -> bool:
    """Create the bucket with ``replicas`` (the streams', ``KF_REPLICAS``) unless it is
    there; whether this call created it. Raises what the server answers (a role that may
    not create it: the request's timeout, a permissions violation on the connection)."""
    if await buckets.open(subjects.EXTENSIONS_BUCKET) is not None:
        return False
    await buckets.create(
        subjects.EXTENSIONS_BUCKET,
        description="kernelflow: C++/CUDA extensions the verifiers built, shared",
        replicas=replicas,
    )
    return True


class NatsExtensionStore:
    """``ExtensionStore`` on the bucket, for one verifier actor: ``get`` and ``put`` are
    called on the actor's thread and run on the bridge loop. ``max_bytes``: an entry
    larger than this is not downloaded (its size is in its metadata)."""

    def __init__(self, bridge: Bridge, max_bytes: int, timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.bridge = bridge
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self._store: ObjectStore | None = None  # on the loop only
        self._missing_since: float | None = None

    def get(self, key: str) -> bytes | None:
        if not self.bridge.connected:
            return None  # a check does not wait for NATS to build what it needs
        return self.bridge.call(self._get(key), timeout=self.timeout_s + 5)

    def put(self, key: str, data: bytes) -> None:
        if not self.bridge.connected:
            raise ConnectionError("NATS is not connected")
        self.bridge.call(self._put(key, data), timeout=self.timeout_s + 5)

    async def _get(self, key: str) -> bytes | None:
        store = await self._bucket()
        if store is None:
            return None
        try:
            info = await store.info(key)
        except ObjectNotFound:
            return None
        if info.size > self.max_bytes:
            log.info(
                "shared extension store: %s is %d bytes, over %d: not fetched",
                key[:16],
                info.size,
                self.max_bytes,
            )
            return None
        # The object store checks its own digest (DigestMismatchError); the entry's
        # own check is the engine's. Bounded on the loop too: an entry whose chunks are
        # gone would be waited for forever.
        return await asyncio.wait_for(store.get(key), self.timeout_s)

    async def _put(self, key: str, data: bytes) -> None:
        store = await self._bucket()
        if store is None:
            raise LookupError(f"no bucket {subjects.EXTENSIONS_BUCKET} on this NATS yet")
        await asyncio.wait_for(store.put(key, data), self.timeout_s)

    async def _bucket(self) -> ObjectStore | None:
        if self._store is not None:
            return self._store
        now = time.monotonic()
        if self._missing_since is not None and now - self._missing_since < _RELOOK_S:
            return None
        self._store = await self.bridge.buckets.open(subjects.EXTENSIONS_BUCKET)
        if self._store is None:
            if self._missing_since is None:
                log.info(
                    "shared extension store: no bucket %s on this NATS yet (a daemon with "
                    "the daemon key creates it): building what this node lacks",
                    subjects.EXTENSIONS_BUCKET,
                )
            self._missing_since = now
            return None
        self._missing_since = None
        return self._store


def with_shared_extensions(bridge: Bridge, config: VerifierConfig) -> VerifierConfig:
    """``config`` with the cluster's extension store on ``bridge`` (unless it has one, or
    shares nothing: ``extension_share_max_bytes`` 0)."""
    if config.shared_extensions is not None or config.extension_share_max_bytes <= 0:
        return config
    store = NatsExtensionStore(bridge, config.extension_share_max_bytes)
    return dataclasses.replace(config, shared_extensions=store)
