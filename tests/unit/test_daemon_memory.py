"""A daemon's pools on the memory bridge: its conductors take commands from the command
queue's durable consumer and the events that call for a decision from the log's, through
``kernelflow.events.consumers``' memory adapter, as they do on NATS."""

from __future__ import annotations

import time
from pathlib import Path

from kernelflow.actors.daemon import CONDUCTOR_ROLE, Daemon, DaemonConfig, PoolLoad
from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.events import subjects
from kernelflow.events.model import AgentDispatched, Event, SubmitTask, TaskSubmitted
from tests.memory import running_bridge

RELU = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "relu.py"


def test_a_daemon_s_conductors_work_on_the_memory_bridge() -> None:
    server = MemoryServer()
    with running_bridge(server) as bridge:

        def events() -> tuple[Event, ...]:
            return bridge.call(bridge.log.read_task("mem-1")).events

        daemon = Daemon(bridge, DaemonConfig(roles=(CONDUCTOR_ROLE,))).start()
        try:
            command = SubmitTask(task_id="mem-1", task_source=RELU.read_text())
            answer = bridge.call(bridge.commands.request(command, subjects.SUBMIT, 30.0))
            assert answer == {"ok": True, "task_id": "mem-1"}
            # Only waited for: the dispatch comes at once, and the command is acked (it
            # leaves the queue) once its conductor is done with it.
            deadline = time.monotonic() + 60
            while not (
                any(isinstance(e, AgentDispatched) for e in events())
                and bridge.call(bridge.commands.waiting(subjects.SUBMIT)) == 0
            ):
                assert time.monotonic() < deadline, events()
                time.sleep(0.05)
            assert isinstance(events()[0], TaskSubmitted)
            loads = {load.consumer: load for load in bridge.call(_loads(daemon))}
            assert set(loads) == {
                subjects.CONDUCTOR_COMMANDS_CONSUMER,
                subjects.CONDUCTOR_CONSUMER,
            }
        finally:
            daemon.stop(wait_s=10)


async def _loads(daemon: Daemon) -> list[PoolLoad]:
    return daemon.pool_loads()
