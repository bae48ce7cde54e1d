"""The subject scheme. Every event of a task lives under ``kf.ev.<task_id>.``.

``kf.ev.<task_id>.<kind>``                 most events
``kf.ev.<task_id>.agent_dispatched.<agent>`` work for one agent role (agents filter on it)
``kf.cmd.submit`` / ``kf.cmd.cancel``         commands from publishers (work-queue stream)
"""

from __future__ import annotations

from kernelflow.events.model import DECISION_TRIGGERS, AgentDispatched, Event

EVENTS_STREAM = "KF_EVENTS"
COMMANDS_STREAM = "KF_CMD"

EVENTS_ROOT = "kf.ev"
ALL_EVENTS = f"{EVENTS_ROOT}.>"
COMMANDS_ROOT = "kf.cmd"
ALL_COMMANDS = f"{COMMANDS_ROOT}.>"
SUBMIT = f"{COMMANDS_ROOT}.submit"
CANCEL = f"{COMMANDS_ROOT}.cancel"
# Replies to commands (accepted task id or an error) go to the subject a publisher names in
# this header; refusals of unparseable commands are also published on ERRORS.
REPLY_HEADER = "KF-Reply"
ERRORS = "kf.errors"


def task_events(task_id: str) -> str:
    return f"{EVENTS_ROOT}.{task_id}.>"


def event_subject(event: Event) -> str:
    subject = f"{EVENTS_ROOT}.{event.task_id}.{event.kind}"
    if isinstance(event, AgentDispatched):
        subject += f".{event.agent}"
    return subject


def dispatches_for(agent: str) -> str:
    return f"{EVENTS_ROOT}.*.agent_dispatched.{agent}"


def decision_triggers() -> list[str]:
    return [f"{EVENTS_ROOT}.*.{t.__struct_config__.tag}" for t in DECISION_TRIGGERS]
