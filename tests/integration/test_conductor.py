"""Conductors are stateless over the log: a stale one cannot double a step, and two
daemons on one NATS share a batch of tasks without processing any step twice.

The conductor's logic (handed its messages directly) runs on the in-memory log
(``tests/memory.py``); daemons, their consumers and redeliveries on a real nats-server."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.conductor import Conductor, advance_on_loop
from kernelflow.actors.daemon import Daemon, DaemonConfig
from kernelflow.actors.memory_bridge import MemoryServer
from kernelflow.actors.worker import Delivery, Message
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    AgentDispatched,
    CancelTask,
    ConductorDecided,
    Event,
    LLMCalled,
    OutputParsed,
    SubmitTask,
    TaskCancelled,
    TaskSubmitted,
)
from kernelflow.llm.scripted import ScriptedProvider
from kernelflow.projections.task_state import fold
from kernelflow.workflows.loader import load_workflow
from tests.conftest import REPO, role_auth
from tests.daemons import (
    RELU_SCRIPT,
    assert_each_step_once,
    slow_script,
    start_daemon,
    submit,
    submitted_on_default,
    task_events,
    trigger_message,
    wait_for,
    wait_until_over,
)
from tests.memory import answers_to, running_bridge


@pytest.fixture
def memory_server() -> MemoryServer:
    # Its own log: the task is left waiting on a designer no daemon here will run.
    return MemoryServer()


@pytest.fixture
def bridge(memory_server: MemoryServer) -> Iterator[Bridge]:
    with running_bridge(memory_server) as b:
        yield b


@pytest.fixture
def nats_bridge(private_nats: str) -> Iterator[Bridge]:
    b = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    yield b
    b.stop()


def test_a_stale_conductor_cannot_double_a_step(bridge: Bridge) -> None:
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    submitted = submitted_on_default(task_id)
    seen_at_submit = bridge.call(bridge.log.append(TaskHistory(task_id), [submitted]))
    # Two conductors (never started as actors: their logic is called directly) both
    # handle the same trigger; the second decides on what is by then a stale history.
    first, second = Conductor(bridge, llm=None), Conductor(bridge, llm=None)
    first.advance(seen_at_submit)
    second.advance(seen_at_submit)
    events = bridge.call(bridge.log.read_task(task_id)).events
    assert [type(e) for e in events] == [TaskSubmitted, ConductorDecided, AgentDispatched]
    assert isinstance(events[-1], AgentDispatched) and events[-1].agent == "designer"


def test_two_daemons_share_a_batch(private_nats: str, tmp_path: Path) -> None:
    logs = [tmp_path / "daemon-a.log", tmp_path / "daemon-b.log"]
    daemons = [start_daemon(private_nats, log) for log in logs]
    tasks = [f"batch-{i}" for i in range(6)]
    try:
        time.sleep(2)  # both daemons consuming before the batch arrives
        for task_id in tasks:
            submit(private_nats, task_id, "--workflow", "coder_only")
        for task_id in tasks:
            wait_until_over(private_nats, task_id, timeout_s=180)
    finally:
        for daemon in daemons:
            daemon.terminate()
            daemon.wait(timeout=30)
    for task_id in tasks:
        events = task_events(private_nats, task_id)
        assert fold(task_id, events).finished.status == "success"  # type: ignore[union-attr]
        assert_each_step_once(events)
    verified_by = [log.read_text().count("verifying a triton candidate") for log in logs]
    assert sum(verified_by) == 2 * len(tasks)  # nothing verified twice...
    assert all(n > 0 for n in verified_by)  # ...and both daemons took a share


def test_a_redelivered_submit_takes_up_a_task_recorded_but_not_advanced(bridge: Bridge) -> None:
    """A conductor died between recording a task and its first decisions: the submit
    command, redelivered, advances the task as it stands (one TaskSubmitted, one first
    decision) and answers as for a new task; another command for that id is a duplicate
    and changes nothing."""
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    source = (REPO / "examples/tasks/relu.py").read_text()
    command = SubmitTask(task_id=task_id, task_source=source, task_name="relu")
    recorded = msgspec.structs.replace(submitted_on_default(task_id), cause="cmd:7")
    bridge.call(bridge.log.append(TaskHistory(task_id), [recorded]))
    inbox = "_INBOX.test"
    replies = answers_to(bridge.server, inbox)
    conductor = Conductor(bridge, llm=None)
    for stream_seq in (7, 8):  # the redelivered command, then another one for that id
        message = Message(
            source="command",
            subject=subjects.SUBMIT,
            data=encode(command),
            headers={subjects.REPLY_HEADER: inbox},
            stream_seq=stream_seq,
            deliveries=2,
        )
        assert conductor.handle(message) == "ack"
    assert [replies.get(timeout=10) for _ in range(2)] == [
        {"ok": True, "task_id": task_id},
        {"ok": True, "task_id": task_id, "duplicate": True},
    ]
    events = bridge.call(bridge.log.read_task(task_id)).events
    assert [type(e) for e in events] == [TaskSubmitted, ConductorDecided, AgentDispatched]
    assert events[0].cause == "cmd:7" and events[1].cause == events[0].event_id


def test_a_cancel_read_just_before_its_submit_was_recorded_still_applies(bridge: Bridge) -> None:
    """The cancel's conductor reads the task (none yet) just before another conductor
    records its submit and settles that command: no earlier command is pending by the
    time it looks, and it must still not conclude that there is no task."""
    task_id = f"t-{uuid.uuid4().hex[:12]}"

    class RacedConductor(Conductor):
        def read(self, task: str) -> TaskHistory:
            history = super().read(task)
            if not history.events:
                # The other conductor's work, landing right after this read.
                bridge.call(bridge.log.append(TaskHistory(task), [submitted_on_default(task)]))
            return history

    cancel = CancelTask(task_id=task_id, reason="not needed")
    message = Message(
        source="command",
        subject=subjects.CANCEL,
        data=encode(cancel),
        headers={},
        stream_seq=2,
        deliveries=1,
    )
    assert RacedConductor(bridge, llm=None).handle(message) == "ack"
    events = bridge.call(bridge.log.read_task(task_id)).events
    assert [type(e) for e in events] == [TaskSubmitted, TaskCancelled]


def _designer_done(bridge: Bridge, task_id: str, workflow: str) -> TaskHistory:
    """A task advanced to its designer's dispatch, and the designer's output recorded
    by this process (so its bridge remembers the history through it)."""
    submitted = msgspec.structs.replace(submitted_on_default(task_id), workflow_name=workflow)
    _, text = load_workflow(workflow)
    submitted = msgspec.structs.replace(submitted, workflow_yaml=text)
    history = bridge.call(bridge.log.append(TaskHistory(task_id), [submitted]))
    Conductor(bridge, llm=None).advance(history)
    history = bridge.call(bridge.log.read_task(task_id))
    dispatch = fold(task_id, history.events).current
    assert dispatch is not None and dispatch.agent == "designer"
    output = OutputParsed(
        task_id=task_id,
        cause=dispatch.event.event_id,
        agent="designer",
        dispatch_id=dispatch.dispatch_id,
        fields={"design": "one program per block of 1024 elements"},
    )
    return bridge.call(bridge.log.append(history, [output]))


def _on_loop(bridge: Bridge, history: TaskHistory) -> list[str]:
    """Offer the last event of ``history`` to ``advance_on_loop`` as a trigger delivered
    from the stream: how it was settled once the loop was done, or that it went to an
    actor."""
    outcome: list[str] = []
    delivery = Delivery(trigger_message(history), outcome.append, lambda: None)

    async def offer() -> None:
        spawned: list[asyncio.Task[None]] = []
        assert advance_on_loop(
            bridge,
            delivery,
            lambda work: spawned.append(asyncio.create_task(work)),
            lambda: outcome.append("to an actor"),
        )
        await asyncio.gather(*spawned)

    bridge.call(offer())
    return outcome


def test_a_decision_made_on_the_loop_from_a_stale_history_is_not_doubled(
    bridge: Bridge, memory_server: MemoryServer
) -> None:
    """The loop decides from the history this process remembers; another daemon moved
    the task on meanwhile: the append is refused, the loop reads the log, finds nothing
    left to decide, and acks the trigger."""
    task_id = f"t-{uuid.uuid4().hex[:12]}"
    remembered = _designer_done(bridge, task_id, "default")
    elsewhere = memory_server.bridge().start()
    try:
        Conductor(elsewhere, llm=None).advance(elsewhere.call(elsewhere.log.read_task(task_id)))
    finally:
        elsewhere.stop()
    assert _on_loop(bridge, remembered) == ["ack"]
    events = bridge.call(bridge.log.read_task(task_id)).events
    assert [type(e) for e in events][3:] == [OutputParsed, ConductorDecided, AgentDispatched]


def test_the_loop_decides_what_needs_no_llm_and_leaves_the_rest_to_an_actor(
    bridge: Bridge, memory_server: MemoryServer
) -> None:
    """After the designer, the default workflow has one way on (the coder): decided on
    the loop, from the log where another process recorded the trigger. Connect-all offers
    several, which only the conductor's LLM may choose between: the trigger goes to a
    conductor actor, untouched."""
    elsewhere = memory_server.bridge().start()
    try:
        routed = _designer_done(elsewhere, f"t-{uuid.uuid4().hex[:12]}", "default")
    finally:
        elsewhere.stop()
    assert bridge.log.remembered(routed.task_id) is None
    assert _on_loop(bridge, routed) == ["ack"]
    events = bridge.call(bridge.log.read_task(routed.task_id)).events
    assert isinstance(events[-1], AgentDispatched) and events[-1].agent == "coder"

    asked = _designer_done(bridge, f"t-{uuid.uuid4().hex[:12]}", "conductor_connect_all")
    assert _on_loop(bridge, asked) == ["to an actor"]
    assert bridge.call(bridge.log.read_task(asked.task_id)).events == asked.events


def test_routing_goes_on_while_the_only_conductor_waits_on_its_llm(
    private_nats: str, tmp_path: Path
) -> None:
    """One task's conductor LLM call (20 s here) holds the daemon's only conductor for
    triggers; another task still goes from designer to coder to verifier meanwhile: what
    needs no LLM is decided on the loop, and is fetched whether or not an actor is idle."""
    script = slow_script(tmp_path, 20.0, agent="conductor")
    roles = ("--roles", "conductor,designer,coder", "--pool", "conductor=1")
    daemon = start_daemon(private_nats, tmp_path / "daemon.log", *roles, script=script)
    try:
        submit(private_nats, "asks", "--workflow", "conductor_connect_all")
        wait_for(private_nats, "asks", lambda ev: bool(ev) and isinstance(ev[-1], OutputParsed), 60)
        submit(private_nats, "routed")

        def at_verifier(events: list[Event]) -> bool:
            last = events[-1] if events else None
            return isinstance(last, AgentDispatched) and last.agent == "verifier"

        wait_for(private_nats, "routed", at_verifier, 15)
        asked = task_events(private_nats, "asks")
        assert not any(isinstance(e, LLMCalled) and e.agent == "conductor" for e in asked)
    finally:
        daemon.kill()  # not waiting 20 s for the conductor's answer
        daemon.wait(timeout=30)


def test_a_stopping_daemon_gives_back_the_triggers_that_waited_for_a_conductor(
    nats_bridge: Bridge, private_nats: str, tmp_path: Path
) -> None:
    """A trigger that needs the conductor's LLM while the daemon's only conductor is busy
    waits in that daemon; when the daemon stops, it goes back to the stream, and another
    daemon decides it at once, not after the 30 s a message unacked waits."""
    bridge = nats_bridge

    def connect_all(task_id: str) -> None:
        command = SubmitTask(
            task_id=task_id,
            task_source=(REPO / "examples/tasks/relu.py").read_text(),
            task_name="relu",
            workflow_name="conductor_connect_all",
        )
        bridge.call(bridge.commands.publish(command, subjects.SUBMIT))

    def designer_done(events: list[Event]) -> bool:
        return bool(events) and isinstance(events[-1], OutputParsed)

    busy = Daemon(
        bridge,
        DaemonConfig(
            roles=("conductor", "designer"),
            pool_sizes={"conductor": 1},
            llm=ScriptedProvider(slow_script(tmp_path, 20.0, agent="conductor")),
        ),
    ).start()
    try:
        connect_all("holds-the-conductor")
        wait_for(private_nats, "holds-the-conductor", designer_done, 30)
        connect_all("waits")
        wait_for(private_nats, "waits", designer_done, 30)
        time.sleep(0.5)  # its trigger delivered, and waiting in the busy daemon
    finally:
        busy.stop(wait_s=0.5)
    other_bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    other = Daemon(
        other_bridge,
        DaemonConfig(roles=("conductor",), llm=ScriptedProvider(REPO / RELU_SCRIPT)),
    ).start()
    try:

        def decided(events: list[Event]) -> bool:
            return any(
                isinstance(e, ConductorDecided) and e.after_agent == "designer" for e in events
            )

        events = wait_for(private_nats, "waits", decided, 10)
    finally:
        other.stop()
        other_bridge.stop()
    # Decided by the second daemon's conductor LLM, as its script answers.
    [decision] = [
        e for e in events if isinstance(e, ConductorDecided) and e.after_agent == "designer"
    ]
    assert (decision.mode, decision.chosen) == ("llm", "coder")
