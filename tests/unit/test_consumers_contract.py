"""One contract for durable consumers (``kernelflow.events.consumers``: the daemons' pools,
the read model's cursor), run against both adapters: the memory one here, JetStream's on
a nats-server of each test's own in tests/integration/test_consumers_contract_jetstream.py.
And the proof that the contract can fail: memory consumers that never deliver a message
again, or that ignore a pull's credit, fail the clauses about that.

Each clause is a coroutine function of a ``ConsumersUnderTest``: the consumers, the log
and the command queue on the same server (to put messages in the streams)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernelflow.events import subjects
from kernelflow.events.consumers import (
    ConsumerNotFound,
    ConsumerSpec,
    ConsumersPort,
    Delivered,
)
from kernelflow.events.log import EventLog
from kernelflow.events.memory import MemoryCommandQueue, MemoryEventLog, MemoryStreams
from kernelflow.events.memory_consumers import MemoryConsumers
from kernelflow.events.model import AgentDispatched, SubmitTask
from kernelflow.events.nats_consumers import NatsConsumers
from kernelflow.events.nats_queue import JetStreamCommandQueue
from kernelflow.events.port import EventLogPort
from kernelflow.events.pull import cancel_and_wait
from kernelflow.events.queue import CommandQueuePort
from tests.conftest import connect, keyed_nats

# Long enough for any delivery on a loaded machine: only a wait for something due.
WAIT_S = 30.0


@dataclass
class ConsumersUnderTest:
    consumers: ConsumersPort
    log: EventLogPort
    commands: CommandQueuePort


Clause = Callable[[ConsumersUnderTest], Coroutine[Any, Any, None]]
CONTRACT: list[Clause] = []


def clause(check: Clause) -> Clause:
    CONTRACT.append(check)
    return check


class Taker:
    """Pulls a consumer with ``room`` for as many messages, as a daemon's pool does; what
    it got waits in ``got``, and any delivery beyond its room is noted in ``over``."""

    def __init__(self, t: ConsumersUnderTest, stream: str, durable: str, room: int) -> None:
        self.room = room
        self.over: list[Delivered] = []
        self.got: asyncio.Queue[Delivered] = asyncio.Queue()
        self.pull = t.consumers.pull(stream, durable, lambda: self.room, self._deliver)
        self._task = asyncio.ensure_future(self.pull.run())

    def _deliver(self, delivered: Delivered) -> None:
        self.room -= 1
        if self.room < 0:
            self.over.append(delivered)
        self.got.put_nowait(delivered)

    async def next(self) -> Delivered:
        return await asyncio.wait_for(self.got.get(), WAIT_S)

    async def take(self, n: int) -> list[Delivered]:
        return [await self.next() for _ in range(n)]

    def give(self, n: int) -> None:
        self.room += n
        self.pull.credit_changed()

    async def stop(self) -> None:
        await cancel_and_wait([self._task])


@contextlib.asynccontextmanager
async def taking(t: ConsumersUnderTest, spec: ConsumerSpec, room: int = 100) -> Any:
    await t.consumers.create(spec)
    taker = Taker(t, spec.stream, spec.durable, room)
    try:
        yield taker
    finally:
        await taker.stop()


def new_task() -> str:
    return f"c-{uuid.uuid4().hex[:12]}"


def dispatch_subject(task: str, agent: str) -> str:
    return f"{subjects.EVENTS_ROOT}.{task}.agent_dispatched.{agent}"


def events_spec(*filters: str, **settings: Any) -> ConsumerSpec:
    return ConsumerSpec(
        subjects.EVENTS_STREAM, f"kf-test-{uuid.uuid4().hex[:8]}", filters, **settings
    )


# --------------------------------------------------------------------------- the clauses


@clause
async def a_consumer_delivers_its_filters_messages_in_order(t: ConsumersUnderTest) -> None:
    task = new_task()
    wanted = []
    for agent in ("coder", "designer", "coder", "verifier", "coder"):
        seq = await t.log.publish_raw(dispatch_subject(task, agent), agent.encode())
        if agent != "designer":
            wanted.append(seq)
    spec = events_spec(subjects.dispatches_for("coder"), subjects.dispatches_for("verifier"))
    async with taking(t, spec) as taker:
        got = await taker.take(len(wanted))
        assert [d.stream_seq for d in got] == wanted
        assert [d.consumer_seq for d in got] == [1, 2, 3, 4]
        assert [d.delivered for d in got] == [1, 1, 1, 1]
        assert [d.data for d in got] == [b"coder", b"coder", b"verifier", b"coder"]
        assert got[0].subject == dispatch_subject(task, "coder")
        state = await t.consumers.state(spec.stream, spec.durable)
        assert (state.pending, state.ack_pending, state.redelivered) == (0, 4, 0)


@clause
async def a_consumer_counts_what_it_has_not_delivered(t: ConsumersUnderTest) -> None:
    task = new_task()
    for _ in range(3):
        await t.log.publish_raw(dispatch_subject(task, "coder"), b"x")
    spec = events_spec(subjects.dispatches_for("coder"))
    await t.consumers.create(spec)
    state = await t.consumers.state(spec.stream, spec.durable)
    assert (state.name, state.pending, state.ack_pending) == (spec.durable, 3, 0)
    assert [s.name for s in await t.consumers.states(subjects.EVENTS_STREAM)] == [spec.durable]
    assert await t.consumers.states(subjects.COMMANDS_STREAM) == []


@clause
async def a_pull_never_takes_more_than_its_credit(t: ConsumersUnderTest) -> None:
    task = new_task()
    for i in range(7):
        await t.log.publish_raw(dispatch_subject(task, "coder"), str(i).encode())
    async with taking(t, events_spec(subjects.dispatches_for("coder")), room=2) as taker:
        got = await taker.take(2)
        for _ in range(5):
            await got[-1].ack()
            taker.give(1)
            got.append(await taker.next())
        assert [d.data for d in got] == [str(i).encode() for i in range(7)]
        assert taker.over == []


@clause
async def an_acked_message_is_done_a_nakked_one_comes_again(t: ConsumersUnderTest) -> None:
    task = new_task()
    for body in (b"a", b"b"):
        await t.log.publish_raw(dispatch_subject(task, "coder"), body)
    spec = events_spec(subjects.dispatches_for("coder"))
    async with taking(t, spec) as taker:
        first, second = await taker.take(2)
        await first.ack()
        await second.nak()
        again = await taker.next()
        assert (again.data, again.stream_seq) == (b"b", second.stream_seq)
        assert (again.delivered, again.consumer_seq) == (2, 3)
        state = await t.consumers.state(spec.stream, spec.durable)
        assert (state.ack_pending, state.redelivered) == (1, 1)
        await again.ack()
        await t.log.publish_raw(dispatch_subject(task, "coder"), b"c")
        assert (await taker.next()).data == b"c"  # not a nor b again


@clause
async def an_unsettled_message_comes_again_after_its_ack_wait(t: ConsumersUnderTest) -> None:
    await t.log.publish_raw(dispatch_subject(new_task(), "coder"), b"a")
    async with taking(t, events_spec(subjects.dispatches_for("coder"), ack_wait_s=1.0)) as taker:
        first = await taker.next()
        again = await taker.next()
        assert (again.stream_seq, again.delivered) == (first.stream_seq, 2)


@clause
async def a_message_is_delivered_at_most_max_deliveries_times(t: ConsumersUnderTest) -> None:
    task = new_task()
    await t.log.publish_raw(dispatch_subject(task, "coder"), b"a")
    spec = events_spec(subjects.dispatches_for("coder"), max_deliveries=2)
    async with taking(t, spec) as taker:
        await (await taker.next()).nak()
        last = await taker.next()
        assert (last.data, last.delivered) == (b"a", 2)
        await last.nak()
        await t.log.publish_raw(dispatch_subject(task, "coder"), b"b")
        assert (await taker.next()).data == b"b"


@clause
async def a_cursor_starts_where_it_is_told_and_waits_for_no_acks(t: ConsumersUnderTest) -> None:
    task = new_task()
    seqs = [await t.log.publish_raw(dispatch_subject(task, "coder"), b"x") for _ in range(3)]
    spec = events_spec(subjects.ALL_EVENTS, start_seq=seqs[1], acked=False, in_memory=True)
    async with taking(t, spec) as taker:
        got = await taker.take(2)
        assert [d.stream_seq for d in got] == seqs[1:]
        assert [d.consumer_seq for d in got] == [1, 2]
        state = await t.consumers.state(spec.stream, spec.durable)
        assert (state.pending, state.ack_pending) == (0, 0)


@clause
async def a_history_only_event_comes_with_its_header(t: ConsumersUnderTest) -> None:
    task = new_task()
    event = AgentDispatched(task_id=task, seq=1, agent="coder", step=1, dispatch_id=f"{task}:d1")
    await (await t.log.send_recorded(event, 0, history_only=True))
    async with taking(t, events_spec(subjects.dispatches_for("coder"))) as taker:
        assert subjects.HISTORY_ONLY_HEADER in (await taker.next()).headers


@clause
async def an_acked_command_leaves_the_queue(t: ConsumersUnderTest) -> None:
    command = SubmitTask(task_id=new_task(), task_source="x")
    await t.commands.publish(command, subjects.SUBMIT, {subjects.REPLY_HEADER: "_INBOX.x"})
    spec = ConsumerSpec(
        subjects.COMMANDS_STREAM,
        subjects.CONDUCTOR_COMMANDS_CONSUMER,
        (subjects.ALL_COMMANDS,),
    )
    async with taking(t, spec) as taker:
        delivered = await taker.next()
        assert delivered.subject == subjects.SUBMIT
        assert delivered.headers[subjects.REPLY_HEADER] == "_INBOX.x"
        assert await t.commands.waiting(subjects.SUBMIT) == 1
        await delivered.ack()
        for _ in range(int(WAIT_S / 0.05)):  # the server removes it as the ack arrives
            if await t.commands.waiting(subjects.SUBMIT) == 0:
                break
            await asyncio.sleep(0.05)
        assert await t.commands.waiting(subjects.SUBMIT) == 0


@clause
async def a_deleted_consumer_is_not_found(t: ConsumersUnderTest) -> None:
    spec = events_spec(subjects.ALL_EVENTS)
    with pytest.raises(ConsumerNotFound):
        await t.consumers.state(spec.stream, spec.durable)
    with pytest.raises(ConsumerNotFound):
        await t.consumers.delete(spec.stream, spec.durable)
    await t.consumers.create(spec)
    await t.consumers.create(spec)  # there already, as it is
    await t.consumers.delete(spec.stream, spec.durable)
    with pytest.raises(ConsumerNotFound):
        await t.consumers.state(spec.stream, spec.durable)
    assert await t.consumers.states(subjects.EVENTS_STREAM) == []


# --------------------------------------------------------------------------- the adapters


def in_memory(consumers_class: type[MemoryConsumers] = MemoryConsumers) -> Iterator[Any]:
    streams = MemoryStreams()
    loop = asyncio.new_event_loop()
    under_test = ConsumersUnderTest(
        consumers_class(streams), MemoryEventLog(streams), MemoryCommandQueue(streams)
    )
    try:
        yield under_test, loop.run_until_complete
    finally:
        loop.close()


def on_jetstream(store: Path) -> Iterator[Any]:
    """A server of the test's own, whose streams a daemon's log makes (the role that may
    make consumers)."""
    with keyed_nats(store, streams=False) as url:
        loop = asyncio.new_event_loop()
        nc = loop.run_until_complete(connect(url, "daemon"))
        log = EventLog(nc)
        loop.run_until_complete(log.ensure_streams())
        try:
            yield (
                ConsumersUnderTest(NatsConsumers(nc), log, JetStreamCommandQueue(nc)),
                loop.run_until_complete,
            )
        finally:
            loop.run_until_complete(nc.close())
            loop.close()


@pytest.mark.parametrize("check", CONTRACT, ids=[c.__name__ for c in CONTRACT])
def test_the_contract_in_memory(check: Clause) -> None:
    with contextlib.contextmanager(in_memory)() as (t, run):
        run(asyncio.wait_for(check(t), 2 * WAIT_S))


# --------------------------------------------------------------------------- broken ones


class NeverAgain(MemoryConsumers):
    """Delivers each message once: nothing unsettled, nakked or due comes again."""

    def settle(self, key: tuple[str, str], seq: int, again_in: float | None) -> None:
        super().settle(key, seq, None if again_in is None else 1e9)

    def take(self, key: tuple[str, str], wanted: int) -> tuple[list[Delivered], float | None]:
        taken, _ = super().take(key, wanted)
        return [d for d in taken if d.delivered == 1], None


class NoCredit(MemoryConsumers):
    """Hands a pull everything there is, whatever its credit."""

    def take(self, key: tuple[str, str], wanted: int) -> tuple[list[Delivered], float | None]:
        return super().take(key, 1000)


@pytest.mark.parametrize(
    ("broken", "fails"),
    [
        (
            NeverAgain,
            {
                "an_acked_message_is_done_a_nakked_one_comes_again",
                "an_unsettled_message_comes_again_after_its_ack_wait",
                "a_message_is_delivered_at_most_max_deliveries_times",
            },
        ),
        (NoCredit, {"a_pull_never_takes_more_than_its_credit"}),
    ],
    ids=["never again", "no credit"],
)
def test_broken_consumers_fail_the_clauses_about_what_they_break(
    broken: type[MemoryConsumers], fails: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(f"{__name__}.WAIT_S", 4.0)  # what never comes is waited for that long
    failed = set()
    for check in CONTRACT:
        with contextlib.contextmanager(in_memory)(broken) as (t, run):
            try:
                run(asyncio.wait_for(check(t), 2 * WAIT_S))
            except (AssertionError, TimeoutError):
                failed.add(check.__name__)
    assert failed == fails
