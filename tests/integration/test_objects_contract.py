"""One contract for object stores (``kernelflow.events.objects``: the read model's
snapshots, the verifiers' extensions), run against both adapters: JetStream's object
store on a nats-server of the test's own (as the daemon role, which makes the buckets),
and the memory buckets the memory bridge gives its bridges."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kernelflow.events import subjects
from kernelflow.events.memory_objects import MemoryBuckets
from kernelflow.events.nats_objects import NatsBuckets
from kernelflow.events.objects import Buckets, ObjectNotFound, digest_of
from tests.conftest import connect

BUCKET = subjects.READMODEL_BUCKET


async def contract(buckets: Buckets) -> None:
    assert await buckets.open(BUCKET) is None
    store = await buckets.create(BUCKET, description="test", replicas=1)
    assert await store.list() == []
    with pytest.raises(ObjectNotFound):
        await store.get("a")
    with pytest.raises(ObjectNotFound):
        await store.info("a")
    await store.put("a", b"first", description="position 1")
    await store.put("a", b"second", description="position 2")  # replaced
    await store.put("b", b"")
    reopened = await buckets.open(BUCKET)
    assert reopened is not None and await reopened.get("a") == b"second"
    info = await reopened.info("a")
    assert (info.name, info.size, info.description) == ("a", 6, "position 2")
    assert info.digest == digest_of(b"second") and info.mtime
    assert sorted(i.name for i in await reopened.list()) == ["a", "b"]
    await reopened.delete("a")
    with pytest.raises(ObjectNotFound):
        await store.get("a")
    with pytest.raises(ObjectNotFound):
        await store.delete("a")
    assert [i.name for i in await store.list()] == ["b"]
    again = await buckets.create(BUCKET, description="test", replicas=1)  # there already
    assert await again.get("b") == b""


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_the_memory_buckets_keep_the_contract(loop: asyncio.AbstractEventLoop) -> None:
    loop.run_until_complete(contract(MemoryBuckets()))


def test_jetstream_s_object_stores_keep_the_contract(
    loop: asyncio.AbstractEventLoop, private_nats: str
) -> None:
    async def run() -> None:
        nc = await connect(private_nats, "daemon")
        try:
            await contract(NatsBuckets(nc.jetstream()))
        finally:
            await nc.close()

    loop.run_until_complete(run())
