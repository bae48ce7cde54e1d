"""The status read model, the answering side: per-task summaries a daemon keeps current
from the log, answering ``kernelflow status`` over NATS request/reply instead of every
caller re-reading the log. The protocol and the asking side (``query_status``, what
``kernelflow status`` and the dashboard call) are ``kernelflow.actors.readmodel_client``.

What it is: ``kernelflow.projections.metrics.MetricsProjection`` (a pure fold that remembers the
stream sequence of the last event it applied and ignores anything at or before it), fed
from ``KF_EVENTS`` in stream order on the bridge loop, and a responder on
``kf.query.status`` (queue group ``kf-readmodel``: one of the daemons that host a read
model answers each query).

Position and persistence. The fold's state and its position are one document, saved
together (every ``snapshot_every_s`` seconds when it moved, and on stop) in the JetStream
object store ``KF_READMODEL``: a head object that names the sealed pages of rows it
builds on (``kernelflow.actors.readmodel_snapshot``: a save writes the head and any newly sealed
page, not the whole history). On start the read model loads that snapshot and reads the
log from ``position + 1``; if it has none (or it is unusable: another fold version, a
recreated stream, a damaged or missing object) it rebuilds from the start. Why this and
not the consumer's ack floor: a durable consumer's acknowledged position and a snapshot
stored elsewhere can never be written atomically, so after a crash one would be ahead of
the other and events would be lost or counted twice. Keeping the position *inside* the
snapshot makes "state = fold(log[1..position])" true of every snapshot ever written, by
whichever daemon: the fold is deterministic, so two daemons' snapshots at one position are
equal, and a snapshot that is behind only costs catch-up time. The durable consumer
(``kf-readmodel-<instance>``, on ``kernelflow.events.consumers``' port; no acks, removed
by the server a minute after its daemon is gone) is just the cursor of one process:
recreated at ``position + 1`` on every start and whenever a gap in its delivery sequence
shows a message was lost in transit. The fold
also skips positions it already applied, so nothing is ever counted twice. The object
store chunks each object, so neither head nor page is limited by the NATS message size.
What older versions saved there (unpaged snapshots, older folds' heads and pages) is
removed when a read model starts, once untouched for an hour (``stale_objects``).

Queries (``readmodel_client`` says what they may ask) wait for the fold to reach the
position they name, and are answered in pages of rows in log order. Every query is
answered, at once when it is not one (``{"ok": false, "error": ...}``), unless its reply
subject is not an inbox (``subjects.reply_refusal``: an answer must never land in the
log); at most ``_MAX_WAITING`` wait at a time, later ones are answered as the fold stands.

A message of the log that is not an event of its task (``kernelflow.events.quarantine``;
the fold holds every event before its position, so each task's first event must be its
seq 1) moves the position and is counted (``quarantined`` in ``describe``), nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import msgspec

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.readmodel_client import PAGE, StatusQuery, status_row
from kernelflow.actors.readmodel_snapshot import PAGE_ROWS, Page, PagedMetrics, Snapshot, page_name
from kernelflow.events import subjects
from kernelflow.events.consumers import ConsumerNotFound, ConsumerSpec, Delivered
from kernelflow.events.model import QuarantinedEvent
from kernelflow.events.objects import ObjectNotFound, ObjectStore, digest_of
from kernelflow.events.pull import cancel_and_wait
from kernelflow.events.quarantine import HistoryCheck
from kernelflow.events.requests import Request, Serving
from kernelflow.projections.metrics import FOLD_VERSION, MetricsProjection

log = logging.getLogger("kernelflow.readmodel")

# The head's name (not the unpaged ``status-vN`` of earlier versions, which would read a
# head as a whole state and miss the paged rows).
SNAPSHOT = f"status-v{FOLD_VERSION}.head"
STALE_AFTER_S = 3600.0  # see ``stale_objects``
_BATCH = 256
_MAX_WAITING = 1000  # queries waiting for the fold to catch up, at most

_query_decoder = msgspec.json.Decoder(StatusQuery)


_OUR_OBJECT = re.compile(r"status-v(\d+)(\.head(\..+)?)?")


def stale_objects(objects: Iterable[tuple[str, str]], now: float, older_than_s: float) -> list[str]:
    """Which of the store's objects (name, mtime) earlier kernelflows left: unpaged
    snapshots (``status-vN``, before heads and pages) and the heads and pages of older
    fold versions, untouched for ``older_than_s``: a daemon of that version may still be
    running, and rewrites its snapshot at every save. A newer version's are not ours."""
    stale = []
    for name, mtime in objects:
        match = _OUR_OBJECT.fullmatch(name)
        if match is None:
            continue
        unpaged, version = match.group(2) is None, int(match.group(1))
        if not (unpaged or version < FOLD_VERSION):
            continue
        try:
            age = now - datetime.fromisoformat(mtime).timestamp()
        except ValueError:
            continue
        if age > older_than_s:
            stale.append(name)
    return stale


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64]


class ReadModel:
    """Runs on the bridge loop. ``start``/``stop`` are called from another thread."""

    def __init__(
        self,
        bridge: Bridge,
        instance: str,
        *,
        snapshot_every_s: float = 5.0,
        persist: bool = True,
        consumer_check_s: float = 10.0,
        page_rows: int = PAGE_ROWS,
        stale_after_s: float = STALE_AFTER_S,
    ) -> None:
        self.bridge = bridge
        self.instance = instance
        self.durable = subjects.readmodel_consumer(_safe_name(instance))
        # Replaced once the store is open; a restored fold keeps its own page size.
        self.paged = PagedMetrics(page_rows=page_rows, seal=False)
        self.snapshot_every_s = snapshot_every_s
        self.stale_after_s = stale_after_s
        self.consumer_check_s = consumer_check_s
        self.persist = persist
        self.restored_from = 0  # the position of the snapshot it started from
        self.rebuilt_because = ""  # why it started from scratch, if it did
        self.saved_position = 0
        self._store: ObjectStore | None = None
        self._stream_created = ""
        self._moved = asyncio.Event()  # set (and replaced) whenever the position moves
        self._tasks: list[asyncio.Task[None]] = []
        self._queries: set[asyncio.Task[None]] = set()
        self._serving: Serving | None = None
        self._stopping = ""  # what ``stop`` is doing (said if it runs out of time)

    @property
    def projection(self) -> MetricsProjection:
        return self.paged.projection

    @property
    def position(self) -> int:
        return self.projection.position

    def describe(self) -> dict[str, Any]:
        """For the health responder (called on the loop)."""
        return {
            "position": self.position,
            "tasks": len(self.projection.tasks),
            "restored_from": self.restored_from,
            "rebuilt_because": self.rebuilt_because,
            "saved_position": self.saved_position,
            "sealed_pages": self.paged.pages,
            "persist": self._store is not None,
            "quarantined": self.projection.state.quarantined,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 60.0) -> ReadModel:
        self.bridge.call(self._start(), timeout=timeout_s)
        return self

    async def _start(self) -> None:
        info = await self.bridge.log.info()
        self._stream_created = info.created
        if self.persist:
            try:
                self._store = await self._open_store()
                self.paged = PagedMetrics(self._stream_created, self.paged.page_rows)
                await self._restore(info.end_seq)
            except Exception as exc:  # run without persistence rather than not at all
                log.warning("read model: no snapshot store (%r); folding from the start", exc)
                self._store = None
                self.paged = PagedMetrics(self._stream_created, seal=False)
                self.rebuilt_because = f"snapshot store unavailable: {exc!r}"
        self._serving = await self.bridge.requests.serve(
            subjects.STATUS_QUERY, self._on_query, group=subjects.READMODEL_GROUP
        )
        self._tasks.append(asyncio.create_task(self._consume(), name="kf-readmodel"))
        if self._store is not None:
            self._tasks.append(asyncio.create_task(self._snapshots(), name="kf-readmodel-snap"))
        log.info(
            "read model at position %d (%s); following %s",
            self.position,
            f"restored from {self.restored_from}" if self.restored_from else "from the start",
            subjects.EVENTS_STREAM,
        )

    def stop(self, timeout_s: float = 10.0, *, save: bool = True) -> None:
        """Stop following the log and answering; save the position reached (``save=False``
        leaves the store as a crash would). Bounded: a daemon's stop must fit in its
        service's stop timeout, and a final snapshot not saved only means the next start
        folds the few seconds since the last periodic one again."""
        self._stopping = "waiting for the bridge loop"
        try:
            self.bridge.call(self._stop(save), timeout=timeout_s)
        except Exception as exc:
            log.warning(
                "read model: stop did not finish within %gs (%s: %r); the next start "
                "catches up from position %d",
                timeout_s,
                self._stopping,
                exc,
                self.saved_position,
            )

    async def _stop(self, save: bool) -> None:
        self._stopping = "leaving the status queries' group"
        if self._serving is not None:
            with contextlib.suppress(Exception):
                await self._serving.stop()
        self._stopping = "waiting for its reader and queries to stop"
        await cancel_and_wait([*self._tasks, *self._queries])
        if not self.bridge.connected:
            # Each request would wait out its timeout. The next start catches up from the
            # last snapshot saved; the server drops the idle cursor by itself.
            log.info("read model: NATS unreachable; position %d not saved", self.position)
            return
        try:
            if save:
                self._stopping = f"saving its snapshot at position {self.position}"
                await self.save()
        except Exception as exc:
            log.warning("read model: final snapshot failed: %r", exc)
        self._stopping = "deleting its consumer"
        with contextlib.suppress(Exception):
            await self.bridge.consumers.delete(subjects.EVENTS_STREAM, self.durable)

    # ------------------------------------------------------------------ snapshots

    async def _open_store(self) -> ObjectStore:
        buckets = self.bridge.buckets
        store = await buckets.open(subjects.READMODEL_BUCKET)
        if store is not None:
            return store
        return await buckets.create(
            subjects.READMODEL_BUCKET,
            description="kernelflow read-model snapshots (state + log position)",
            replicas=self.bridge.streams.replicas,
        )

    async def _restore(self, stream_last_seq: int) -> None:
        assert self._store is not None
        try:
            data = await asyncio.wait_for(self._store.get(SNAPSHOT), 30.0)
        except ObjectNotFound:
            self.rebuilt_because = "no snapshot yet"
            return
        except Exception as exc:  # damaged, half-replaced, timed out: refold
            self.rebuilt_because = f"snapshot unreadable: {exc!r}"
            return
        try:
            snap = msgspec.json.decode(data or b"", type=Snapshot)
        except msgspec.DecodeError as exc:
            self.rebuilt_because = f"snapshot undecodable: {exc}"
            return
        why = ""
        if snap.fold_version != FOLD_VERSION:
            why = f"snapshot of fold version {snap.fold_version}, this is {FOLD_VERSION}"
        elif snap.stream_created != self._stream_created:
            why = f"snapshot of another {subjects.EVENTS_STREAM} (created {snap.stream_created})"
        elif snap.state.position > stream_last_seq:
            why = f"snapshot at {snap.state.position}, beyond the log's end {stream_last_seq}"
        if why:
            self.rebuilt_because = why
            return
        pages = []
        for index in range(snap.pages):
            name = page_name(SNAPSHOT, snap.page_rows, index)
            try:
                page = await asyncio.wait_for(self._store.get(name), 30.0)
                pages.append(msgspec.json.decode(page or b"", type=Page))
            except Exception as exc:  # missing, damaged, timed out: refold
                self.rebuilt_because = f"snapshot page {name} unreadable: {exc!r}"
                return
        try:
            self.paged = PagedMetrics.restore(snap, pages)
        except ValueError as exc:
            self.rebuilt_because = f"snapshot inconsistent: {exc}"
            return
        self.restored_from = self.saved_position = snap.state.position

    async def save(self) -> bool:
        """Store the state with its position, unless a snapshot at least as far exists:
        the pages sealed since the last save, then the head."""
        if self._store is None or self.position <= self.saved_position:
            return False
        await self._store_pages()  # whoever stores the head, they are the log's pages
        with contextlib.suppress(Exception):
            stored = await self._store.info(SNAPSHOT)
            if _position_of(stored.description) >= self.position:
                self.saved_position = self.position  # another daemon got as far
                return False
        await self._store_pages()  # any sealed meanwhile
        # Nothing awaits from the check that every page is stored to this encode.
        position = self.position
        data = msgspec.json.encode(self.paged.head(time.time()))
        await self._store.put(SNAPSHOT, data, description=f"position {position}")
        self.saved_position = position
        return True

    async def _store_pages(self) -> None:
        assert self._store is not None
        unstored = self.paged.unstored
        while unstored:
            index, data = unstored[0]
            name = page_name(SNAPSHOT, self.paged.page_rows, index)
            try:
                stored = (await self._store.info(name)).digest == digest_of(data)
            except ObjectNotFound:
                stored = False
            if not stored:  # another daemon of this log may have stored it: the same bytes
                await self._store.put(name, data)
            unstored.pop(0)

    async def _remove_stale_objects(self) -> None:
        assert self._store is not None
        objects = await self._store.list()
        now = time.time()
        stale = stale_objects(((o.name, o.mtime) for o in objects), now, self.stale_after_s)
        for name in stale:
            await self._store.delete(name)
        if stale:
            log.info(
                "read model: removed %d snapshot object(s) older versions left in %s: %s",
                len(stale),
                subjects.READMODEL_BUCKET,
                ", ".join(stale),
            )

    async def _snapshots(self) -> None:
        try:
            await self._remove_stale_objects()
        except Exception as exc:  # only space is lost; the next start tries again
            log.warning("read model: removing older versions' snapshots failed: %r", exc)
        while True:
            await asyncio.sleep(self.snapshot_every_s)
            try:
                await self.save()
            except Exception as exc:  # the next one will do
                log.warning("read model: snapshot failed: %r", exc)

    # ------------------------------------------------------------------ folding

    async def _consume(self) -> None:
        while True:
            try:
                await self._follow()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS restarting, consumer gone, a gap: go again
                log.warning("read model: following the log from %d: %r", self.position + 1, exc)
                await asyncio.sleep(0.5)

    async def _follow(self) -> None:
        consumers = self.bridge.consumers
        with contextlib.suppress(ConsumerNotFound):
            await consumers.delete(subjects.EVENTS_STREAM, self.durable)
        await consumers.create(
            ConsumerSpec(
                subjects.EVENTS_STREAM,
                self.durable,
                (subjects.ALL_EVENTS,),
                start_seq=self.position + 1,
                acked=False,
                idle_expiry_s=60.0,
                in_memory=True,
            )
        )
        gap: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gap_at = 0
        expected = 1  # the consumer's own delivery sequence: a jump means a lost message
        check = HistoryCheck(self._last_seq)

        def deliver(msg: Delivered) -> None:
            nonlocal expected, gap_at
            if gap.done():
                return
            if msg.consumer_seq != expected:
                gap_at = msg.consumer_seq
                gap.set_result(None)
                return
            expected += 1
            event = check.place(msg.subject, msg.data, msg.stream_seq)
            if type(event) is QuarantinedEvent:
                self.bridge.log.report_quarantined(event)
            if self.paged.apply(msg.stream_seq, event):
                self._moved.set()
                self._moved = asyncio.Event()

        async def watch() -> None:
            # A consumer removed under us (e.g. after a long disconnect) answers no pulls.
            while True:
                await asyncio.sleep(self.consumer_check_s)
                await consumers.state(subjects.EVENTS_STREAM, self.durable)

        pull = consumers.pull(subjects.EVENTS_STREAM, self.durable, lambda: _BATCH, deliver)
        running = {asyncio.create_task(pull.run()), asyncio.create_task(watch())}
        try:
            done, _ = await asyncio.wait({*running, gap}, return_when=asyncio.FIRST_COMPLETED)
            if gap in done:
                raise RuntimeError(f"delivery {gap_at} arrived where {expected} was expected")
            for task in done:
                task.result()  # raises why it stopped
        finally:
            await cancel_and_wait(running)

    def _last_seq(self, task_id: str) -> int:
        """The seq of the task's last event folded (0: none)."""
        t = self.projection.tasks.get(task_id)
        return t.last_seq if t is not None else 0

    async def caught_up(self, position: int, wait_s: float) -> bool:
        """Wait until the fold applied ``position`` (at most ``wait_s``)."""
        deadline = asyncio.get_running_loop().time() + wait_s
        while self.position < position:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait(), left)
        return True

    # ------------------------------------------------------------------ queries

    async def _on_query(self, msg: Request) -> None:
        task = asyncio.create_task(self._answer(msg))  # a waiting query blocks no other
        self._queries.add(task)
        task.add_done_callback(self._queries.discard)

    async def _answer(self, msg: Request) -> None:
        if not _answerable(msg):
            return
        try:
            query = _query_decoder.decode(msg.data or b"{}")
        except (msgspec.DecodeError, RecursionError) as exc:
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            log.warning("read model: refused a status query: %s", why)
            await _respond(msg, {"ok": False, "error": f"bad status query: {why}"})
            return
        try:
            reply = await self._reply(query, waiting=len(self._queries))
        except Exception as exc:  # still answer: the asker would wait out its timeout
            log.warning("read model: status query failed: %r", exc)
            reply = {"ok": False, "error": f"status query failed: {exc!r}"}
        await _respond(msg, reply)

    async def _reply(self, query: StatusQuery, waiting: int) -> dict[str, Any]:
        wait_s = min(max(query.wait_s, 0.0), 30.0) if waiting <= _MAX_WAITING else 0.0
        offset, limit = max(query.offset, 0), min(max(query.limit, 1), PAGE)
        behind = not await self.caught_up(query.after, wait_s)
        reply: dict[str, Any] = {
            "ok": True,
            "instance": self.instance,
            "position": self.position,
            "behind": behind,
        }
        if query.task_id is not None:
            t = self.projection.tasks.get(query.task_id)
            reply["row"] = status_row(t) if t is not None else None
        else:
            rows = self.paged.rows  # a page of them without copying every row's reference
            reply["total"] = len(rows)
            reply["rows"] = [status_row(t) for t in rows[offset : offset + limit]]
        return reply


def _answerable(msg: Request) -> bool:
    """Whether a query asks for an answer on an inbox (saying so when it does not)."""
    if not msg.reply_to:
        return False
    why = subjects.reply_refusal(msg.reply_to)
    if why is not None:
        log.warning("read model: not answering a status query: %s", why)
    return why is None


async def _respond(msg: Request, body: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        await msg.respond(json.dumps(body).encode())


def _position_of(description: str | None) -> int:
    match = re.fullmatch(r"position (\d+)", description or "")
    return int(match.group(1)) if match else 0
