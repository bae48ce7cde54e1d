"""The cheap paths of the framework keep its guarantees: reads by batched direct gets, the
history remembered as soon as an append is acknowledged, and one conductor per task in a
process, to which triggers for that task are handed (and settled only once handled)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.conductor import _CLAIMS, Conductor
from kernelflow.actors.worker import Delivery, Message, Settlement
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import AgentDispatched, ConductorDecided, TaskCancelled, TaskSubmitted
from tests.conftest import connect
from tests.daemons import submitted_on_default, trigger_message
from tests.memory import running_bridge


def new_task() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def dispatch(task: str, n: int) -> AgentDispatched:
    return AgentDispatched(task_id=task, agent="coder", step=n + 1, dispatch_id=f"{task}:d{n}")


def test_direct_read_matches_a_read_from_the_leader(event_log: EventLog) -> None:
    """More events than one direct get returns, read whole and from a remembered point."""
    task = new_task()
    history = TaskHistory(task)
    for chunk in range(3):
        events = [dispatch(task, 120 * chunk + i) for i in range(120)]
        history = event_log.run(event_log.append(history, events))
    fresh = EventLog(event_log._nc)  # remembers nothing
    direct = event_log.run(fresh.read_task(task))
    by_leader = event_log.run(EventLog(event_log._nc).read_task(task, leader=True))
    assert direct == by_leader == history
    assert [e.seq for e in direct.events] == list(range(1, 361))
    more = event_log.run(event_log.append(direct, [dispatch(task, 360)]))
    assert fresh.remembered(task) == direct
    assert event_log.run(fresh.read_task(task)) == more  # fetches only the new event


def test_reads_fall_back_to_the_leader_without_direct_gets(bare_nats: str) -> None:
    async def scenario() -> None:
        nc = await connect(bare_nats, "daemon")
        js = nc.jetstream()
        # A stream made by hand without allow_direct: nobody answers direct gets.
        await nc.request(
            f"$JS.API.STREAM.CREATE.{subjects.EVENTS_STREAM}",
            json.dumps(
                {"name": subjects.EVENTS_STREAM, "subjects": [subjects.ALL_EVENTS]}
            ).encode(),
        )
        task = new_task()
        event = TaskCancelled(task_id=task, seq=1, reason="x")
        await js.publish(subjects.event_subject(event), encode(event))
        log = EventLog(nc)
        history = await log.read_task(task)
        assert [e.reason for e in history.events] == ["x"]  # type: ignore[attr-defined]
        assert (await log.read_task(new_task())).events == ()
        await nc.close()

    asyncio.run(scenario())


def test_an_append_is_remembered_when_its_ack_arrives(event_log: EventLog) -> None:
    """Another thread may look up the history (``remembered``) without the bridge loop,
    and a delivered event this process recorded needs no read."""
    task = new_task()
    history = event_log.run(
        event_log.append(TaskHistory(task), [dispatch(task, 0), dispatch(task, 1)])
    )
    assert event_log.remembered(task) is history
    first = history.events[0]
    assert event_log.run(event_log.history_through(first, history.last_stream_seq - 1)) is history


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    # The conductor's hand-over and the bridge's hop are not about NATS: on the memory log.
    with running_bridge() as b:
        yield b


class _Recorder:
    def __init__(self) -> None:
        self.settled: list[Settlement] = []
        self.released = 0

    def delivery(self, message: Message) -> Delivery:
        return Delivery(message, self.settled.append, self._release)

    def _release(self) -> None:
        self.released += 1


def test_a_trigger_for_a_task_being_advanced_is_handed_over(bridge: Bridge) -> None:
    """Two conductors of one process get triggers for one task: the second hands its
    trigger to the first, which advances the task and only then settles both."""
    task_id = new_task()
    submitted = submitted_on_default(task_id)
    history = bridge.call(bridge.log.append(TaskHistory(task_id), [submitted]))
    message = trigger_message(history)
    first, second = Conductor(bridge, llm=None), Conductor(bridge, llm=None)
    key = (bridge, task_id)
    assert _CLAIMS.claim(key, None)  # the first conductor is busy with the task
    handed = _Recorder()
    second.receive(handed.delivery(message))
    assert handed.released == 1 and handed.settled == []  # freed, not settled yet
    # The first conductor advances the task, then takes what was handed over and settles
    # it once it has looked at the task again.
    first._advance_claimed(key, history, [])
    assert handed.settled == ["ack"]
    events = bridge.call(bridge.log.read_task(task_id)).events
    assert [type(e) for e in events] == [TaskSubmitted, ConductorDecided, AgentDispatched]
    # Nothing is left claimed: the next trigger is handled (a no-op) and settled at once.
    again = _Recorder()
    second.receive(again.delivery(message))
    assert again.settled == ["ack"] and again.released == 0
    assert len(bridge.call(bridge.log.read_task(task_id)).events) == 3


def test_bridge_calls_answer_raise_and_time_out_on_the_callers_thread(bridge: Bridge) -> None:
    """The lean hop keeps ``Bridge.call``'s contract: the coroutine's result or exception
    on the caller's thread, TimeoutError when given up on, and posts run in order."""

    async def answer(value: int) -> int:
        await asyncio.sleep(0)
        return value

    async def fail() -> None:
        raise ValueError("from the loop")

    assert [bridge.call(answer(i)) for i in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="from the loop"):
        bridge.call(fail())
    with pytest.raises(TimeoutError):
        bridge.call(asyncio.sleep(5), timeout=0.05)
    seen: list[int] = []
    for i in range(100):
        bridge.post(lambda i=i: seen.append(i))
    assert bridge.call(answer(1)) == 1  # posted after them: runs after them
    assert seen == list(range(100))


def test_an_append_waits_for_its_stream_to_have_a_leader(bare_nats: str) -> None:
    """While a cluster elects a stream leader, publishes get "no responders": the append
    tries again (here: until the stream exists) and the event is stored once."""

    async def scenario() -> None:
        nc = await connect(bare_nats, "daemon")
        log = EventLog(nc)
        task = new_task()
        appending = asyncio.ensure_future(log.append(TaskHistory(task), [dispatch(task, 0)]))
        await asyncio.sleep(1.0)
        assert not appending.done()  # no stream: nobody answers yet
        await log.ensure_streams()
        history = await appending
        assert [e.seq for e in (await EventLog(nc).read_task(task)).events] == [1]
        assert history.last_stream_seq >= 1
        await nc.close()

    asyncio.run(scenario())
