"""The status read model on the memory bridge: its cursor is a durable consumer of the
memory server (``kernelflow.events.memory_consumers``), its snapshots go to the memory
buckets, and status queries are answered over the memory requests: no nats-server."""

from __future__ import annotations

from collections.abc import Sequence

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.actors.readmodel import ReadModel
from kernelflow.actors.readmodel_client import query_status
from kernelflow.events import subjects
from kernelflow.events.model import Event
from kernelflow.events.port import TaskHistory
from kernelflow.projections.render import summary
from kernelflow.projections.task_state import fold
from tests.memory import running_bridge
from tests.unit.test_projections_props import TaskSpec, make_task

FIRST = [
    TaskSpec("rm-a", "g", ("mismatch", "pass"), speedup=2.0, record_rewards=True),
    TaskSpec("rm-b", "g", ("compile_error",), end="unfinished"),
]
SECOND = [TaskSpec("rm-c", "h", (), end="cancelled")]


def record(bridge: Bridge, histories: Sequence[Sequence[Event]]) -> None:
    for events in histories:
        bridge.call(bridge.log.append(TaskHistory(events[0].task_id), events))


def statuses(bridge: Bridge) -> dict[str, str]:
    rows = bridge.call(query_status(bridge.requests, bridge.log), timeout=30).rows
    return {row["task_id"]: row["status"] for row in rows}


def test_a_read_model_on_the_memory_bridge_answers_and_resumes_from_its_snapshot() -> None:
    server = MemoryServer()
    first, second = [make_task(s) for s in FIRST], [make_task(s) for s in SECOND]
    expected = {h[0].task_id: summary(fold(h[0].task_id, h))["status"] for h in first + second}
    with running_bridge(server) as bridge:
        record(bridge, first)
        model = ReadModel(bridge, "one", snapshot_every_s=3600).start()
        assert statuses(bridge) == {t: expected[t] for t in ("rm-a", "rm-b")}
        saved = model.position
        model.stop()  # saves its snapshot, deletes its cursor
        assert bridge.call(bridge.consumers.states(subjects.EVENTS_STREAM)) == []
        record(bridge, second)
        again = ReadModel(bridge, "one", snapshot_every_s=3600).start()
        try:
            assert again.restored_from == saved > 0
            assert statuses(bridge) == expected
        finally:
            again.stop()
