"""``status`` asking a read model that is still catching up (``query_status``,
actors/readmodel_client.py): it waits as long as the model moves and gives up, saying so,
when it does not. Against a scripted read model on the in-memory request bus and log, so
the number of waits is the script's, not the machine's load (the real read model on a
nats-server: tests/integration/test_readmodel.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

from kernelflow.actors.readmodel_client import NoAnswer, query_status
from kernelflow.events import subjects
from kernelflow.events.memory import MemoryEventLog, MemoryStreams
from kernelflow.events.memory_requests import MemoryRequests, RequestBus
from kernelflow.events.port import TaskHistory
from kernelflow.events.requests import Request
from tests.unit.test_projections_props import TaskSpec, make_task

ROW = {"task_id": "t0", "status": "success"}


def ask_scripted(answers: list[dict[str, object]]) -> tuple[list[int], object]:
    """Run ``query_status`` against a read model that gives ``answers`` in turn; the
    positions it heard of while waiting, and what it returned or raised."""

    async def run() -> tuple[list[int], object]:
        log = MemoryEventLog(MemoryStreams())
        await log.append(TaskHistory("t0"), make_task(TaskSpec("t0", "g", ("pass",))))
        requests = MemoryRequests(RequestBus())
        script: Iterator[dict[str, object]] = iter(answers)

        async def answer(request: Request) -> None:
            asked = json.loads(request.data)
            assert asked["after"] == await log.end_seq()
            await request.respond(json.dumps(next(script)).encode())

        await requests.serve(subjects.STATUS_QUERY, answer)
        seen: list[int] = []
        try:
            found: object = await query_status(
                requests, log, 0.05, lambda _, at, end: seen.append(at)
            )
        except NoAnswer as exc:
            found = exc
        return seen, found

    return asyncio.run(run())


def behind(at: int) -> dict[str, object]:
    return {"ok": True, "behind": True, "instance": "d1", "position": at}


def test_a_read_model_catching_up_is_waited_for_as_long_as_it_moves() -> None:
    done = {"ok": True, "instance": "d1", "position": 7, "rows": [ROW], "total": 1}
    seen, found = ask_scripted([behind(2), behind(4), behind(6), done])
    assert seen == [2, 4, 6]
    assert getattr(found, "rows", None) == [ROW]


def test_a_read_model_that_does_not_move_is_given_up_on_saying_so() -> None:
    seen, found = ask_scripted([behind(2), behind(5), behind(5)])
    assert seen == [2, 5]
    assert isinstance(found, NoAnswer)
    end = 13  # the log's end when asked: the task's 13 events
    assert (
        str(found)
        == f"the read model of d1 is catching up but did not move in 0.05s (at 5 of {end})"
    )
