"""``kernelflow health``'s checks of the server, on a memory server
(``kernelflow.events.inspection``'s memory adapter): the streams as they stand, and the
work a daemons' consumer holds for a role no answering daemon hosts."""

from __future__ import annotations

from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.events import subjects
from kernelflow.events.consumers import ConsumerSpec
from kernelflow.events.model import AgentDispatched, SubmitTask
from kernelflow.events.port import TaskHistory
from kernelflow.host.health import OK, WARN, Report, check_consumers, check_streams
from tests.memory import running_bridge


def rows(report: Report) -> dict[tuple[str, str], tuple[str, str]]:
    return {(c.component, c.name): (c.status, c.detail) for c in report.checks}


def test_health_reads_the_streams_and_the_work_waiting_for_a_role() -> None:
    server = MemoryServer()
    inspection = server.inspection()
    with running_bridge(server) as bridge:
        dispatch = AgentDispatched(task_id="t", agent="coder", step=1, dispatch_id="t:d1")
        bridge.call(bridge.log.append(TaskHistory("t"), [dispatch]))
        bridge.call(bridge.commands.publish(SubmitTask(task_source="x"), subjects.SUBMIT))
        coder = subjects.agent_consumer("coder")
        spec = ConsumerSpec(subjects.EVENTS_STREAM, coder, (subjects.dispatches_for("coder"),))
        bridge.call(bridge.consumers.create(spec))

        report = Report()
        assert bridge.call(check_streams(inspection, report, replicas=1)) == 1
        status, detail = rows(report)[("stream", subjects.EVENTS_STREAM)]
        assert status == WARN and detail.startswith("1 messages")
        assert "1 consumers, memory storage" in detail and "not durable" in detail
        assert rows(report)[("stream", subjects.COMMANDS_STREAM)][1].startswith("1 messages")

        bridge.call(check_consumers(inspection.consumers, report, hosted={"designer"}))
        waiting = "1 waiting, 0 in progress"
        assert rows(report)[("consumer", coder)] == (
            WARN,
            f"{waiting}; no answering daemon hosts coder",
        )
        hosted = Report()
        bridge.call(check_consumers(inspection.consumers, hosted, hosted={"coder"}))
        assert rows(hosted)[("consumer", coder)] == (OK, waiting)
        assert hosted.sections["consumers"][0]["role"] == "coder"
