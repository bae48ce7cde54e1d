"""What every actor shares: how work arrives, how the log is read and written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pykka

from kernelflow.actors.bridge import Bridge
from kernelflow.common.redact import scrub, scrubbed_traceback
from kernelflow.events.codec import decode_event
from kernelflow.events.log import AppendConflict, TaskHistory
from kernelflow.events.model import AgentDispatched, AgentFailed, Event, QuarantinedEvent
from kernelflow.events.quarantine import placed
from kernelflow.events.subjects import task_of as task_of  # used by the daemon and the CLI
from kernelflow.projections.task_state import Dispatch, TaskState, fold

# How the pump settles a message once an actor is done with it: ack (done, whatever the
# outcome), nak (could not finish: deliver again later), soon (not yet: it waits on work
# about to be done, deliver it again in a moment).
Settlement = Literal["ack", "nak", "soon"]
# Which stream a message came from: publishers' commands or the event log.
Source = Literal["command", "event"]
# How work that failed on its last delivery is recorded: the start of the error an agent's
# dispatch fails with (a decision ends its task with "conductor " and it). Metrics count
# give-ups by it.
GAVE_UP = "gave up after "


@dataclass(frozen=True)
class Message:
    """One message taken from a durable consumer, as data an actor thread may hold."""

    source: Source
    subject: str
    data: bytes
    headers: dict[str, str]
    stream_seq: int
    deliveries: int
    # JetStream will not deliver this message again (its consumer's max_deliver): work
    # that fails now is given up, and recorded as such so that its task goes on.
    last_delivery: bool = False


@dataclass(frozen=True)
class Delivery:
    """A message and how to answer for it. ``settle`` acks or naks the message (and frees the
    actor); ``release`` frees the actor while the message stays held, for a worker that
    hands the message to another actor which settles it later. Both may be called from any
    thread; the first of them frees the actor."""

    message: Message
    settle: Callable[[Settlement], None]
    release: Callable[[], None]


class Worker(pykka.ThreadingActor):
    """Base actor: handles one message at a time and always settles it, even on a bug."""

    role = "worker"
    # A message that outlives stop() must not keep the process alive: it is redelivered.
    use_daemon_thread = True

    def __init__(self, bridge: Bridge) -> None:
        super().__init__()
        self.bridge = bridge
        self.log = logging.getLogger(f"kernelflow.{self.role}")

    def on_receive(self, received: object) -> None:
        if not isinstance(received, Delivery):
            self.log.error("unexpected message %r", received)
            return
        self.receive(received)

    def receive(self, delivery: Delivery) -> None:
        """Handle one delivery and settle it, whatever happens."""
        message = delivery.message
        settlement: Settlement = "nak"
        try:
            settlement = "ack" if quarantined(self.bridge, message) else self.handle(message)
        except Exception as exc:
            settlement = self.after_failure(message, exc)
        finally:
            delivery.settle(settlement)

    def handle(self, message: Message) -> Settlement:
        raise NotImplementedError

    def after_failure(self, message: Message, exc: Exception) -> Settlement:
        """Handling ``message`` raised ``exc``: logged, and left to be redelivered; on its last
        delivery, given up and recorded as such (see ``give_up``)."""
        failed = (self.role, message.subject, scrubbed_traceback())
        if not message.last_delivery:
            self.log.error("%s failed on %s; it will be redelivered\n%s", *failed)
            return "nak"
        self.log.error("%s failed on %s for the last time\n%s", *failed)
        # Recorded for good: whatever the exception says of a credential is left out.
        error = scrub(f"{GAVE_UP}{message.deliveries} attempts: {type(exc).__name__}: {exc}")
        try:
            self.give_up(message, error)
        except Exception:
            why = scrubbed_traceback()
            self.log.error("could not record giving up on %s\n%s", message.subject, why)
            return "nak"
        return "ack"

    def give_up(self, message: Message, error: str) -> None:
        """Record in the log that ``message`` cannot be done, so that whatever waits on it goes
        on; without it, its task would wait forever. Roles with nothing to record log it."""
        self.log.error("gave up on %s: %s", message.subject, error)

    # ------------------------------------------------------------------ log access

    def read(self, task_id: str) -> TaskHistory:
        return self.bridge.call(self.bridge.log.read_task(task_id))

    def history_at(self, message: Message) -> TaskHistory:
        """The task's history up to at least the event this message carries: the one this
        process remembers when it holds that event (no trip to the bridge loop), else the
        log's."""
        event = decode_event(message.data)
        if (known := self.bridge.log.remembered_through(event)) is not None:
            return known
        return self.bridge.call(self.bridge.log.history_through(event, message.stream_seq))

    def append(self, history: TaskHistory, *events: Event) -> TaskHistory:
        return self.bridge.call(self.bridge.log.append(history, events))


class DispatchWorker(Worker):
    """An agent that works on dispatches (an LLM agent, the verifier)."""

    def give_up(self, message: Message, error: str) -> None:
        """The dispatch ends in the agent's failure, and the conductor routes on."""
        dispatched = decode_event(message.data)
        assert isinstance(dispatched, AgentDispatched)
        history = self.read(dispatched.task_id)
        while (d := current_dispatch(state_of(history), dispatched)) is not None:
            failed = AgentFailed(
                task_id=history.task_id,
                cause=d.event.event_id,
                agent=d.agent,
                dispatch_id=d.dispatch_id,
                error=error,
            )
            try:
                self.append(history, failed)
                return
            except AppendConflict:
                history = self.read(history.task_id)


def current_dispatch(state: TaskState, dispatched: AgentDispatched) -> Dispatch | None:
    """The dispatch if it is still the task's open one; None for stale or finished work,
    and for a dispatch in a log that was never a submitted task (nothing to work from)."""
    d = state.dispatch(dispatched.dispatch_id)
    if state.submitted is None or state.terminal is not None or d is None:
        return None
    return d if d.result is None and d is state.current else None


def quarantined(bridge: Bridge, message: Message) -> bool:
    """Whether ``message`` carries a message that is not an event of the task its subject
    names (``kernelflow.events.quarantine``). Work on it is done at once: no redelivery
    can make it one; the log reports it."""
    if message.source != "event":
        return False
    event = placed(message.subject, message.data, message.stream_seq)
    if type(event) is not QuarantinedEvent:
        return False
    bridge.log.report_quarantined(event)
    return True


def state_of(history: TaskHistory) -> TaskState:
    return fold(history.task_id, history.events)
