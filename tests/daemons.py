"""Helpers for tests that drive `kernelflow daemon` processes against a NATS server, each
acting as the user it stands for (tests/conftest.py): daemons with the daemon role,
submits with the publisher's, reads of the log with the reader's."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.js.errors
import yaml

from kernelflow.actors.connection import ClientAuth
from kernelflow.actors.worker import Message
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import (
    DISPATCH_RESULTS,
    AgentDispatched,
    ConductorDecided,
    Event,
    LLMCalled,
    RewardAssigned,
    SubmitTask,
    TaskSubmitted,
    ToolCalled,
)
from kernelflow.projections.rewards import pending_reward_events
from kernelflow.projections.task_state import fold
from kernelflow.workflows.loader import load_workflow
from tests.conftest import KERNELFLOW, REPO, as_user, cli_env, connect, creds, is_keyed, run_cli

RELU_SCRIPT = "examples/scripted/relu.yaml"


def slow_script(tmp_path: Path, latency_s: float, agent: str = "coder") -> Path:
    """The relu script with ``agent``'s answers ``latency_s`` away (an agent it has no
    answers for answers ``Final Answer: 42``), so that something lands mid-call."""
    script = yaml.safe_load((REPO / RELU_SCRIPT).read_text())
    for entry in script.setdefault(agent, [{"text": "Final Answer: 42"}]):
        entry["latency_s"] = latency_s
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(script))
    return path


def start_daemon(
    url: str, log: Path, *args: str, script: str | Path = RELU_SCRIPT, **env: str
) -> subprocess.Popen[bytes]:
    """A daemon process in its own session (so a test can SIGKILL its whole group), with
    the daemon role's key of a test server (``args`` may name other ``--creds``)."""
    key = ["--creds", str(creds(url, "daemon"))] if is_keyed(url) and "--creds" not in args else []
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                *KERNELFLOW,
                "-v",
                "daemon",
                "--nats-url",
                url,
                *key,
                "--llm",
                f"scripted:{script}",
                *args,
            ],
            cwd=REPO,
            env=cli_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_for_line(log: Path, text: str, timeout_s: float = 60) -> None:
    """Wait until a process writing ``log`` has written ``text``."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def submit(url: str, task_id: str, *args: str, task: str = "examples/tasks/relu.py") -> None:
    """``kernelflow submit`` as a publisher."""
    result = run_cli("submit", task, "--task-id", task_id, *as_user("publisher", url), *args)
    assert result.returncode == 0, result.stderr


def publish(url: str, command: SubmitTask) -> None:
    """Publish ``command`` as a program of one's own would, without the CLI's checks (with
    the publisher's key)."""

    async def send() -> None:
        nc = await connect(url, "publisher")
        try:
            await nc.jetstream().publish(subjects.SUBMIT, encode(command))
        finally:
            await nc.close()

    asyncio.run(send())


def task_events(url: str, task_id: str, auth: ClientAuth | None = None) -> list[Event]:
    """The task's events, read by a client presenting ``auth`` (none: the reader's key of
    a test server)."""

    async def read() -> list[Event]:
        if auth is None:
            nc = await connect(url, "reader")
        else:
            nc = await nats.connect(url, **auth.options())
        try:
            return list((await EventLog(nc).read_task(task_id)).events)
        finally:
            await nc.close()

    return asyncio.run(read())


def stream_messages(url: str, stream: str) -> int:
    """Messages ``stream`` holds now (0 if it does not exist yet), as a reader sees it."""

    async def count() -> int:
        nc = await connect(url, "reader")
        try:
            info = await nc.jetstream().stream_info(stream)
            return int(info.state.messages)
        except nats.js.errors.NotFoundError:
            return 0
        finally:
            await nc.close()

    return asyncio.run(count())


def is_settled(url: str, task_id: str) -> bool:
    return is_settled_events(task_id, task_events(url, task_id))


def is_settled_events(task_id: str, events: list[Event]) -> bool:
    """The task is over and every reward of its finish is recorded (a daemon killed right
    after the finish leaves them to the next daemon)."""
    state = fold(task_id, events)
    return state.terminal is not None and not pending_reward_events(state)


def wait_for(
    url: str, task_id: str, until: Callable[[list[Event]], bool], timeout_s: float
) -> list[Event]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = task_events(url, task_id)
        if until(events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"timed out; log has {[e.kind for e in task_events(url, task_id)]}")


def wait_until_over(url: str, task_id: str, timeout_s: float = 120) -> list[Event]:
    return wait_for(url, task_id, lambda ev: fold(task_id, ev).terminal is not None, timeout_s)


def wait_until_settled(url: str, task_id: str, timeout_s: float = 120) -> list[Event]:
    """The task's events once it is over and the rewards of its finish (recorded after
    it) are in: nothing more will be appended."""
    return wait_for(url, task_id, lambda ev: is_settled_events(task_id, ev), timeout_s)


def assert_each_step_once(events: list[Event]) -> None:
    """Gap-free sequence; every dispatch once, with one result; every LLM call, every tool
    call, every decision and every reward once."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    dispatches = [e for e in events if isinstance(e, AgentDispatched)]
    assert len({d.dispatch_id for d in dispatches}) == len(dispatches)
    results = Counter(e.dispatch_id for e in events if isinstance(e, DISPATCH_RESULTS))  # type: ignore[attr-defined]
    assert all(results[d.dispatch_id] == 1 for d in dispatches), results
    # A multi-step agent makes several calls per dispatch, each caused by the one before.
    calls = Counter((e.dispatch_id, e.cause) for e in events if isinstance(e, LLMCalled))
    assert all(n == 1 for n in calls.values()), calls
    tools = Counter(e.call_id for e in events if isinstance(e, ToolCalled))
    assert all(n == 1 for n in tools.values()), tools
    decisions = Counter(e.cause for e in events if isinstance(e, ConductorDecided))
    assert all(n == 1 for n in decisions.values()), decisions
    rewards = Counter(e.reward_fn for e in events if isinstance(e, RewardAssigned))
    assert all(n == 1 for n in rewards.values()), rewards


def submitted_on_default(task_id: str) -> TaskSubmitted:
    """A task on the default workflow that no agent will ever run (no daemon here)."""
    _, text = load_workflow("default")
    return TaskSubmitted(
        task_id=task_id,
        task_name="relu",
        task_source="class Model: ...",
        workflow_name="default",
        workflow_yaml=text,
        backend="triton",
        group_id="g",
    )


def trigger_message(history: TaskHistory) -> Message:
    """The last event of ``history`` as a conductor's consumer delivers it, first time."""
    trigger = history.events[-1]
    return Message(
        source="event",
        subject=subjects.event_subject(trigger),
        data=encode(trigger),
        headers={},
        stream_seq=history.last_stream_seq,
        deliveries=1,
    )


@dataclass
class UiServer:
    url: str  # its base URL, no trailing slash
    first_line: str  # "kernelflow ui: http://127.0.0.1:PORT/ (NATS …)"
    printed: str = ""  # all it printed, stdout and stderr, once stopped


@contextlib.contextmanager
def serving_ui(
    nats_url: str,
    tmp: Path,
    *args: str,
    verbose: bool = False,
    env: dict[str, str] | None = None,
) -> Iterator[UiServer]:
    """``kernelflow [-v] ui`` on a free port (``args`` and ``env`` added), with the reader
    role's key of a test server (``args`` may name other ``--creds``), stopped with
    SIGTERM as a supervisor would (it must end with 0) after the block."""
    errors = tmp / "ui-stderr.log"
    options = ["-v"] if verbose else []
    key = ["--creds", str(creds(nats_url, "reader"))] if is_keyed(nats_url) else []
    if "--creds" in args:
        key = []
    with errors.open("w") as err:
        server = subprocess.Popen(
            [*KERNELFLOW, *options, "ui", "--port", "0", "--nats-url", nats_url, *key, *args],
            cwd=REPO,
            env=cli_env(**(env or {})),
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("kernelflow ui: http://"), line + errors.read_text()
        ui = UiServer(line.split()[2].rstrip("/"), line)
        yield ui
    finally:
        server.send_signal(signal.SIGTERM)
        out, _ = server.communicate(timeout=20)
        assert server.returncode == 0, errors.read_text()
    ui.printed = line + out + errors.read_text()
