"""Every command a user waits on (``run``, ``rollout``, ``bench``, ``submit --wait``,
``ui``, ``serve-rewards``) stops within its deadline (README.md, "CLI"): the first Ctrl-C
or SIGTERM cancels what it started and ends it within ``STOP_DEADLINE_S`` whatever NATS
does, here with its NATS server stopped mid-run and every core kept busy; a second ends it
at once.

The bounds asserted are the deadline plus a wide allowance for a loaded machine: what
they catch is a command that does not end (one was found alive 17 minutes on)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernelflow.host.stopping import STOP_DEADLINE_S
from tests.conftest import EXAMPLES, as_user, cli_env, keyed_nats_server, run_cli
from tests.daemons import slow_script
from tests.integration.test_abandoned import start

RELU = str(EXAMPLES / "tasks" / "relu.py")
INT, TERM = signal.SIGINT, signal.SIGTERM
# What a loaded machine may add to a stop's deadline (start-up of the interpreter's exit,
# a scheduler that runs the process late).
SLACK_S = 20.0


@dataclass
class Command:
    """A command of a user's, as started in a terminal: ``args`` (``{script}``: a scripted
    LLM whose answers take a minute; ``{dataset}``: three prompts) and the role whose key
    it holds; ``ready``: what its stdout says once it is under way."""

    args: list[str]
    role: str
    ready: str


COMMANDS = {
    "run": Command(["run", RELU, "--llm", "scripted:{designer}"], "daemon", "step 1: designer"),
    "rollout": Command(
        ["rollout", "--dataset", "{dataset}", "--llm", "scripted:{solver}", "--concurrency", "2"],
        "daemon",
        "",
    ),
    "bench": Command(
        ["bench", RELU, "--samples", "2", "--workflow", "coder_only", "--llm", "scripted:{coder}"],
        "daemon",
        "",
    ),
    "submit --wait": Command(["submit", RELU, "--wait"], "publisher", "t-"),
    "ui": Command(["ui", "--port", "0"], "reader", "kernelflow ui: http://"),
    "serve-rewards": Command(
        ["serve-rewards", "--port", "0"], "publisher", "kernelflow serve-rewards: http://"
    ),
}
# What each says as it stops with its NATS gone (then exits 130; the servers exit 0): which
# of the tasks it started it could not cancel.
SAID = {
    "run": "kernelflow: could not cancel",
    "rollout": "kernelflow: could not cancel",
    "bench": "kernelflow: could not cancel",
    "submit --wait": "",
    "ui": "",
    "serve-rewards": "",
}


def arguments(command: Command, tmp_path: Path) -> list[str]:
    dataset = tmp_path / "three.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"{i} + 1?"}) + "\n" for i in range(3)))
    scripts = {}
    for agent in ("designer", "solver", "coder"):
        (tmp_path / agent).mkdir()
        scripts[agent] = str(slow_script(tmp_path / agent, 60, agent))
    return [a.format(dataset=dataset, **scripts) for a in command.args]


@contextlib.contextmanager
def busy_cores() -> Iterator[None]:
    """Every core kept busy by a process that spins, as on a machine running the tests."""
    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def under_way(proc: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, proc.communicate()[1].decode()
        assert time.monotonic() < deadline, "never got under way"
        time.sleep(0.2)


def tasks_with_a_step(url: str) -> bool:
    result = run_cli("status", "--json", *as_user("publisher", url))
    assert result.returncode == 0, result.stderr
    return any(task["steps"] >= 1 for task in json.loads(result.stdout))


def stopped_mid_run(name: str, tmp_path: Path, *signals: int) -> tuple[int, str, float]:
    """``name`` started against a server that requires keys, the server stopped once the
    command is under way, then ``signals`` sent to its process group (as a terminal's
    Ctrl-C is) one after the other, every core busy from the server's stop on: its exit
    code, stderr, and how long it took from the first signal."""
    command = COMMANDS[name]
    out = tmp_path / "out.txt"
    with keyed_nats_server(tmp_path / "nats") as server:
        args = [*arguments(command, tmp_path), *as_user(command.role, server.url)]
        proc = start(args, cli_env(), out)
        try:
            if command.ready:
                under_way(proc, lambda: command.ready in out.read_text())
            else:  # a task of its own is at its first step
                under_way(proc, lambda: tasks_with_a_step(server.url))
            server.stop()
            with busy_cores():
                time.sleep(1)  # the loss noticed, or not: either way the stop is bounded
                asked = time.monotonic()
                with held(proc):  # all of them pending at once, however loaded the machine
                    for sig in signals:
                        os.killpg(proc.pid, sig)
                _, stderr = proc.communicate(timeout=STOP_DEADLINE_S + 60)
                took = time.monotonic() - asked
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return proc.returncode, stderr.decode(), took


@contextlib.contextmanager
def held(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """The command's process group stopped (SIGSTOP) for the block: signals sent in it
    arrive together at the SIGCONT. Sent to a running process, a second could arrive
    only after the first had ended the command (this test once preempted between the
    two), and find the interpreter already gone to its default handlers."""
    os.killpg(proc.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the command did not stop"
        time.sleep(0.01)
    try:
        yield
    finally:
        os.killpg(proc.pid, signal.SIGCONT)


# Ctrl-C, and SIGTERM (a supervisor's, `timeout`'s): each, for some.
FIRST = {
    "run": INT,
    "rollout": TERM,
    "bench": INT,
    "submit --wait": TERM,
    "ui": INT,
    "serve-rewards": TERM,
}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_first_signal_stops_a_command_within_its_deadline(name: str, tmp_path: Path) -> None:
    code, stderr, took = stopped_mid_run(name, tmp_path, FIRST[name])
    assert code == (0 if name in ("ui", "serve-rewards") else 130), stderr
    assert took < STOP_DEADLINE_S + SLACK_S, stderr
    assert "Traceback" not in stderr
    assert SAID[name] in stderr


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_second_signal_stops_it_at_once(name: str, tmp_path: Path) -> None:
    # Sent together, the second is heard as the stop the first began starts: it cannot
    # have ended by then. (Two of one kind could be heard as one.)
    code, stderr, took = stopped_mid_run(name, tmp_path, INT, TERM)
    assert code == 130, stderr
    assert stderr.endswith("kernelflow: asked again to stop: stopping at once\n"), stderr
    assert took < SLACK_S, stderr
