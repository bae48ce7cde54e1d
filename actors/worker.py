"""What every actor shares: how work arrives, how the log is read and written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import pykka

from actors.bridge import Bridge
from events.codec import decode_event
from events.log import TaskHistory
from events.model import Event
from projections.task_state import TaskState, fold
from workflows.loader import parse_workflow
from workflows.model import Workflow

# How the pump settles a message once an actor is done with it: ack (done, whatever the
# outcome), nak (could not finish: deliver again later).
Settlement = Literal["ack", "nak"]
# Which stream a job came from: publishers' commands or the event log.
Source = Literal["command", "event"]


@dataclass(frozen=True)
class Job:
    """One message taken from a durable consumer, as data an actor thread may hold."""

    source: Source
    subject: str
    data: bytes
    headers: dict[str, str]
    stream_seq: int
    deliveries: int


@dataclass(frozen=True)
class Delivery:
    job: Job
    settle: Callable[[Settlement], None]


class Worker(pykka.ThreadingActor):
    """Base actor: handles one job at a time and always settles it, even on a bug."""

    role = "worker"
    # A job that outlives stop() must not keep the process alive: it is redelivered.
    use_daemon_thread = True

    def __init__(self, bridge: Bridge) -> None:
        super().__init__()
        self.bridge = bridge
        self.log = logging.getLogger(f"kernelflow.{self.role}")

    def on_receive(self, message: object) -> None:
        if not isinstance(message, Delivery):
            self.log.error("unexpected message %r", message)
            return
        settlement: Settlement = "nak"
        try:
            settlement = self.handle(message.job)
        except Exception:
            self.log.exception(
                "%s failed on %s; it will be redelivered", self.role, message.job.subject
            )
        finally:
            message.settle(settlement)

    def handle(self, job: Job) -> Settlement:
        raise NotImplementedError

    # ------------------------------------------------------------------ log access

    def read(self, task_id: str) -> TaskHistory:
        return self.bridge.call(self.bridge.log.read_task(task_id))

    def history_at(self, job: Job) -> TaskHistory:
        """The task's history up to at least the event this job carries."""
        event = decode_event(job.data)
        return self.bridge.call(self.bridge.log.history_through(event, job.stream_seq))

    def append(self, history: TaskHistory, *events: Event) -> TaskHistory:
        return self.bridge.call(self.bridge.log.append(history, events))


def state_of(history: TaskHistory) -> TaskState:
    return fold(history.task_id, history.events)


def workflow_of(state: TaskState) -> Workflow:
    assert state.submitted is not None
    return _parse_cached(state.submitted.workflow_yaml, state.submitted.workflow_name)


@lru_cache(maxsize=64)
def _parse_cached(text: str, name: str) -> Workflow:
    # The document was validated at submission; parsing it again cannot fail.
    return parse_workflow(text, name)
