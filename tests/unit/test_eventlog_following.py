"""A following read (``EventLogPort.read(follow=True)``, events/port.py) and a message
heard of before it is stored: NATS hands a subscriber its copy of a published event as the
stream queues its own, so on a loaded server the read can look, find nothing, and hear of
nothing more. It looks again soon instead of at its idle pace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from kernelflow.events import subjects
from kernelflow.events.memory import MemoryEventLog
from kernelflow.events.model import TaskCancelled
from kernelflow.events.port import StopWatching, Stored, TaskHistory

TASK = "c-heard-early"


class HeardEarly(MemoryEventLog):
    """A log whose notifications the test sends (``hear``), and which says when a look
    (one pass over what is stored) is over."""

    def __init__(self) -> None:
        super().__init__()
        self.wakes: list[Callable[[], None]] = []
        self.looks = 0
        self.looked = asyncio.Event()

    async def watch(self, subject: str, wake: Callable[[], None]) -> StopWatching:
        self.wakes.append(wake)

        async def stop() -> None:
            self.wakes.remove(wake)

        return stop

    async def _batches(
        self, seq: int, subject: str, *, through: int | None
    ) -> AsyncGenerator[list[Stored], None]:
        async for batch in super()._batches(seq, subject, through=through):
            yield batch
        self.looks += 1
        self.looked.set()

    async def look_once_more(self) -> None:
        self.looked.clear()
        await self.looked.wait()

    def hear(self) -> None:
        for wake in self.wakes:
            wake()


def test_an_event_heard_of_before_it_is_stored_is_read_soon() -> None:
    async def scenario() -> list[str]:
        log = HeardEarly()
        await log.append(TaskHistory(TASK), [TaskCancelled(task_id=TASK, seq=0, reason="0")])
        got: list[str] = []

        async def follow() -> None:
            reading = log.read(subject=subjects.task_events(TASK), follow=True, idle_timeout=600)
            async for _, event in reading:
                got.append(event.reason)  # type: ignore[attr-defined]
                if len(got) == 2:
                    break
            await reading.aclose()

        following = asyncio.ensure_future(follow())
        while not log.wakes or log.looks < 1:  # watching, and the first look is over
            await asyncio.sleep(0.01)
        log.hear()  # heard of ...
        await log.look_once_more()  # ... looked for, not found ...
        history = await log.read_task(TASK)
        await log.append(history, [TaskCancelled(task_id=TASK, seq=0, reason="1")])  # stored
        await asyncio.wait_for(following, 60)  # far less than the idle pace's 600 s
        return got

    assert asyncio.run(scenario()) == ["0", "1"]
