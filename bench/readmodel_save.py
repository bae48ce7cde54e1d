"""The cost of a read model's periodic save once the log holds many tasks: the paged
snapshot (a head plus pages sealed once) versus saving the whole state, as before.

    python bench/readmodel_save.py [--tasks 50000] [--saves 10]

A ``ReadModel`` on an embedded nats-server folds ``--tasks`` synthetic tasks (20 events
each, as ``bench/replay_speed.py`` makes them), then, ``--saves`` times, folds the next
``--per-save`` tasks (the work of a busy daemon between two saves) and saves: timed
around ``ReadModel.save`` (encode and store). The baseline, in the same run on the same
state after each save, encodes the whole state and stores it as one object, which is
what every save did before pages. Prints the median time and the bytes each writes,
and the ratio whole / paged (how many times cheaper a save is now); then the time a
restarted read model takes to load head and pages, against reading the whole state back.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from replay_speed import task_events

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.readmodel import SNAPSHOT, ReadModel, Snapshot
from kernelflow.actors.readmodel_snapshot import page_name
from kernelflow.events import subjects
from kernelflow.events.objects import ObjectStore
from kernelflow.host.nats_server import EmbeddedNats
from kernelflow.projections.metrics import FOLD_VERSION


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=50_000, help="tasks in the log before")
    ap.add_argument("--saves", type=int, default=10)
    ap.add_argument("--per-save", type=int, default=20, help="tasks folded between saves")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        bridge = Bridge(server.url).start()
        try:
            run(bridge, args.tasks, args.saves, args.per_save)
        finally:
            bridge.stop()


def run(bridge: Bridge, n_tasks: int, saves: int, per_save: int) -> None:
    model = ReadModel(bridge, "bench", snapshot_every_s=3600).start()
    position = 0

    def fold(first: int, count: int) -> None:
        nonlocal position
        for i in range(first, first + count):
            for event in task_events(i, 1e9 + i):
                position += 1
                model.paged.apply(position, event)

    print(f"folding {n_tasks:,} tasks ({20 * n_tasks:,} events)", flush=True)
    bridge.call(_on_loop(fold, 0, n_tasks), timeout=3600)
    bridge.call(model.save(), timeout=600)  # the pages of the history, once
    print(f"  {model.paged.pages} pages sealed and stored", flush=True)

    async def snapshots() -> ObjectStore:
        store = await bridge.buckets.open(subjects.READMODEL_BUCKET)
        assert store is not None, "the read model made no snapshot store"
        return store

    async def store_info(name: str) -> int:
        return (await (await snapshots()).info(name)).size

    async def save_whole() -> int:
        store = await snapshots()
        doc = Snapshot(
            fold_version=FOLD_VERSION,
            stream_created="bench",
            saved_at=time.time(),
            state=model.projection.state,
        )
        data = msgspec.json.encode(doc)
        await store.put("bench-whole-state", data)
        return len(data)

    paged_s, whole_s, paged_bytes, whole_bytes = [], [], [], []
    for k in range(saves):
        pages_before = model.paged.pages
        bridge.call(_on_loop(fold, n_tasks + k * per_save, per_save), timeout=600)
        t = time.perf_counter()
        assert bridge.call(model.save(), timeout=600)
        paged_s.append(time.perf_counter() - t)
        written = [SNAPSHOT] + [
            page_name(SNAPSHOT, model.paged.page_rows, index)
            for index in range(pages_before, model.paged.pages)
        ]
        paged_bytes.append(sum(bridge.call(store_info(name)) for name in written))
        t = time.perf_counter()
        whole_bytes.append(bridge.call(save_whole(), timeout=600))
        whole_s.append(time.perf_counter() - t)
    model.stop()  # saves where it got to

    # A restart: the head and every page, against reading the whole state back. The log
    # holds no events (the bench folds them directly): it is moved on to the position
    # saved, so that the snapshot is not beyond its end: purged up to there, an operator's
    # act (``nats stream purge``) on a connection of its own, since kernelflow never
    # purges its log and has no port for it.
    async def move_log_to(position: int) -> None:
        nc = await nats.connect(bridge.nats_url)
        try:
            await nc.jetstream().purge_stream(subjects.EVENTS_STREAM, seq=position + 1)
        finally:
            await nc.close()

    async def load_whole() -> int:
        data = await (await snapshots()).get("bench-whole-state")
        return len(msgspec.json.decode(data, type=Snapshot).state.tasks)

    bridge.call(move_log_to(model.saved_position))
    t = time.perf_counter()
    restarted = ReadModel(bridge, "restarted", snapshot_every_s=3600).start(timeout_s=600)
    restart_paged = time.perf_counter() - t
    assert restarted.restored_from == model.saved_position, restarted.rebuilt_because
    assert len(restarted.projection.tasks) == len(model.projection.tasks)
    restarted.stop(save=False)
    t = time.perf_counter()
    assert bridge.call(load_whole(), timeout=600) == len(model.projection.tasks)
    restart_whole = time.perf_counter() - t

    p, w = statistics.median(paged_s), statistics.median(whole_s)
    pb, wb = statistics.median(paged_bytes), statistics.median(whole_bytes)
    rows = len(model.projection.tasks)
    print(f"a save with {rows:,} tasks in the read model (median of {saves}):")
    print(f"  whole state (before) {w * 1000:8.1f} ms  {wb / 1e6:8.2f} MB written")
    print(f"  head + new pages     {p * 1000:8.1f} ms  {pb / 1e6:8.2f} MB written")
    print(f"  ratio whole/paged: time {w / p:.1f}x, bytes {wb / pb:.1f}x")
    print(
        f"a restart reads the snapshot back: head + {model.paged.pages} pages "
        f"{restart_paged:.2f}s (the read model's start), whole state {restart_whole:.2f}s"
    )


async def _on_loop(fn, *args):  # type: ignore[no-untyped-def]
    """Fold on the bridge loop, where the read model's consumer folds."""
    fn(*args)


if __name__ == "__main__":
    main()
