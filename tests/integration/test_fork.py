"""``kernelflow fork`` as installed (docs/workflows.md, "Forking a task"): a finished task
forked at several points with another model finishes each fork with exactly the LLM calls
and verifications the steps after the fork need; what came before is the original's,
copied as recorded, and made again by nobody."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import yaml

from kernelflow.actors.bridge import Bridge
from kernelflow.events.model import (
    DISPATCH_RESULTS,
    AgentDispatched,
    Event,
    LLMCalled,
    TaskSubmitted,
    VerificationCompleted,
)
from kernelflow.fork import plan_fork
from kernelflow.host.runtime import connected, follow_task, start_daemon, stopped_after
from kernelflow.host.settings import Settings
from kernelflow.offline.files import file_events
from kernelflow.task import fork_roles
from tests.conftest import EXAMPLES, cli_env, run_cli

RELU = EXAMPLES / "tasks" / "relu.py"
SCRIPT = EXAMPLES / "scripted" / "relu.yaml"


def other_model(tmp_path: Path) -> Path:
    """Another scripted model: its coder writes right kernels (with a block size of its
    own, so its code tells whose it is) from its first call on."""
    script = yaml.safe_load(SCRIPT.read_text())
    fixed = script["coder"][1]["text"]
    script["coder"] = [
        {"text": fixed.replace("BLOCK_SIZE = 1024", f"BLOCK_SIZE = {size}")} for size in (256, 512)
    ]
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(script))
    return path


def events_of(task_id: str, env: dict[str, str], tmp_path: Path) -> list[Event]:
    out = tmp_path / f"{task_id}.jsonl"
    export = run_cli("log", "export", task_id, "--out", str(out), env=env)
    assert export.returncode == 0, export.stderr
    return [e for _, e in file_events(out)]


def as_copy(event: Event, original: str, fork: str) -> bytes:
    """``event`` of the fork as the original's event it copies should read."""
    fields = {"task_id": original, "cause": event.cause.replace(f"{fork}:", f"{original}:")}
    if isinstance(dispatch_id := getattr(event, "dispatch_id", None), str):
        fields["dispatch_id"] = dispatch_id.replace(f"{fork}:", f"{original}:")
    return msgspec.json.encode(msgspec.structs.replace(event, **fields))


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, str], list[Event]]:
    """One relu task run to its end: designer, coder (wrong), verifier (mismatch), the
    conductor's LLM choosing the coder again, coder (fixed), verifier (pass)."""
    env = cli_env(KF_DATA_DIR=str(tmp_path_factory.mktemp("data")))
    run = run_cli("run", str(RELU), "--llm", f"scripted:{SCRIPT}", "--json", env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    task_id = json.loads(run.stdout)["task_id"]
    return env, events_of(task_id, env, tmp_path_factory.mktemp("export"))


def step_end(events: list[Event], step: int) -> int:
    dispatch = next(e for e in events if isinstance(e, AgentDispatched) and e.step == step)
    return next(
        e.seq
        for e in events
        if isinstance(e, DISPATCH_RESULTS) and e.dispatch_id == dispatch.dispatch_id  # type: ignore[union-attr]
    )


# Where to fork, where the fork is then cut, and what the steps after it need of the
# other model: (its LLM calls by agent, verifications, the block size of the kernel).
CASES = {
    # After the designer: the coder's first call (right at once), one verification.
    "after-step-1": (["--after-step", "1"], 1, {"coder": 1}, 1, 256),
    # After the wrong kernel was written: its check, the conductor's choice, the coder's
    # second call, and its check.
    "at-step-2-end": (["--at", "step-end:2"], 2, {"conductor": 1, "coder": 1}, 2, 512),
    # Inside step 4 (the coder's second LLM call): cut back to the end of step 3.
    "inside-step-4": (["--at", "llm-of-step:4"], 3, {"conductor": 1, "coder": 1}, 1, 512),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_fork_reuses_the_history_and_makes_only_the_calls_the_steps_after_it_need(
    case: str, finished: tuple[dict[str, str], list[Event]], tmp_path: Path
) -> None:
    env, original = finished
    task_id = original[0].task_id
    args, cut_step, calls, checks, block = CASES[case]
    where = args[1]
    if where.startswith("step-end:"):
        args = [args[0], str(step_end(original, int(where.split(":")[1])))]
    elif where.startswith("llm-of-step:"):
        step = int(where.split(":")[1])
        d = next(e for e in original if isinstance(e, AgentDispatched) and e.step == step)
        llm = next(
            e for e in original if isinstance(e, LLMCalled) and e.dispatch_id == d.dispatch_id
        )
        args = [args[0], str(llm.seq)]
    model = other_model(tmp_path)
    fork = run_cli(
        "fork", task_id, *args, "--llm", f"scripted:{model}", "--json",
        "--out", str(tmp_path / "runs"), env=env,
    )  # fmt: skip
    assert fork.returncode == 0, fork.stderr[-3000:]
    result = json.loads(fork.stdout)
    at = step_end(original, cut_step)
    assert (result["forked_from"], result["at"], result["status"]) == (task_id, at, "success")

    events = events_of(result["task_id"], env, tmp_path)
    first = events[0]
    assert isinstance(first, TaskSubmitted) and first.forked_from is not None
    assert (first.forked_from.task_id, first.forked_from.at) == (task_id, at)
    assert first.forked_from.changed == {"llm": f"scripted:{model}"}
    # Versions: the original's pinned when it started; the fork goes on with its own.
    started = original[0]
    assert isinstance(started, TaskSubmitted)
    pinned = {"workflow_sha256", "verifier", "policy", "torch", "triton", "compiler", "llm"}
    assert set(started.versions) == pinned and started.versions["llm"] == f"scripted:{SCRIPT}"
    assert (
        started.versions["workflow_sha256"]
        == hashlib.sha256(started.workflow_yaml.encode()).hexdigest()
    )
    assert first.versions == {**started.versions, "llm": f"scripted:{model}"}
    assert result["versions_differ"] == [f"llm: scripted:{SCRIPT} → scripted:{model}"]
    # Events 2 to ``at`` are the original's, as recorded.
    copies = [as_copy(e, task_id, result["task_id"]) for e in events[1:at]]
    assert copies == [msgspec.json.encode(e) for e in original[1:at]]
    # What came after: the other model's calls only, as many as the remaining steps need.
    after = events[at:]
    made = [e for e in after if isinstance(e, LLMCalled)]
    assert {a: sum(e.agent == a for e in made) for a in calls} == calls
    assert len(made) == sum(calls.values())
    assert all(e.model.endswith("other.yaml") for e in made)
    verified = [e for e in after if isinstance(e, VerificationCompleted)]
    assert [v.report.verdict for v in verified][-1] == "pass" and len(verified) == checks
    assert f"BLOCK_SIZE = {block}" in (verified[-1].code or "")
    # The original is left as it was.
    assert len(events_of(task_id, env, tmp_path)) == len(original)


def test_fork_refuses_what_it_cannot_do_in_one_line(
    finished: tuple[dict[str, str], list[Event]],
) -> None:
    env, original = finished
    task_id = original[0].task_id
    for args, said in [
        (["no-such-task", "--at", "5"], "no task no-such-task in the log"),
        ([task_id, "--after-step", "9"], f"task {task_id} has no step 9 that ended"),
        ([task_id, "--at", "2"], "no step ended at or before event 2"),
        ([task_id, "--at", "999"], "no event 999"),
        ([task_id, "--after-step", "1", "--task-id", task_id], "exists already"),
        ([task_id, "--after-step", "1", "--workflow", "verifier_only"], "verifier_only"),
    ]:
        run = run_cli("fork", *args, "--detach", env=env)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        assert said in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_events_recorded_as_history_only_are_no_work_for_any_daemon(
    finished: tuple[dict[str, str], list[Event]],
) -> None:
    """Every copy but the last is recorded as history only: a daemon's consumers take
    none of them for work (here all are, the last too: nothing moves the task on)."""
    env, original = finished
    settings = Settings(data_dir=Path(env["KF_DATA_DIR"]), llm=f"scripted:{SCRIPT}")
    new_id = "history-only"
    with connected(settings) as bridge:
        forked = bridge.call(
            plan_fork(bridge.log, original[0].task_id, new_id, after_step=2)
        ).events
        daemon = start_daemon(bridge, settings, fork_roles(forked), {}, only={new_id})
        with stopped_after(daemon):
            last = 0
            for event in forked:
                last = bridge.call(_sent(bridge, event, last))
            time.sleep(3)  # a daemon that took the last copy for work dispatches the verifier
            recorded = bridge.call(bridge.log.read_task(new_id)).events
    assert len(recorded) == len(forked)


async def _sent(bridge: Bridge, event: Event, after: int) -> int:
    return await (await bridge.log.send_recorded(event, after, history_only=True))


def test_a_detached_fork_is_left_to_the_daemons_and_they_finish_it(
    finished: tuple[dict[str, str], list[Event]], tmp_path: Path
) -> None:
    """``--detach`` records the fork and starts nothing; a daemon started after it takes
    the fork from its last copy on, with the daemon's model."""
    env, original = finished
    detached = run_cli(
        "fork", original[0].task_id, "--after-step", "3", "--detach", "--json", env=env
    )
    assert detached.returncode == 0, detached.stderr
    result = json.loads(detached.stdout)
    assert result["status"] == "running" and result["at"] == step_end(original, 3)
    model = other_model(tmp_path)
    settings = Settings(data_dir=Path(env["KF_DATA_DIR"]), llm=f"scripted:{model}")
    with connected(settings) as bridge:
        waiting = bridge.call(bridge.log.read_task(result["task_id"])).events
        assert len(waiting) == result["at"]  # nothing ran it yet
        roles = fork_roles(waiting)
        with stopped_after(start_daemon(bridge, settings, roles, {}, only={result["task_id"]})):
            state = follow_task(bridge, result["task_id"], lambda _: None, 120)
    assert state.finished is not None and state.finished.status == "success"
    assert "BLOCK_SIZE = 512" in (state.finished.final_code or "")


def test_forks_show_as_a_tree_in_status_and_say_their_origin_in_replay(
    finished: tuple[dict[str, str], list[Event]],
) -> None:
    """A fork of the task and a fork of that fork (both left to daemons: none runs here)
    stand under their originals in ``status``; ``replay`` of a fork says where it came
    from, and its JSON trajectory too."""
    env, original = finished
    task_id = original[0].task_id
    child = run_cli(
        "fork", task_id, "--after-step", "3", "--task-id", "tree-child", "--detach", env=env
    )
    assert child.returncode == 0, child.stderr
    grandchild = run_cli(
        "fork",
        "tree-child",
        "--after-step",
        "1",
        "--task-id",
        "tree-grandchild",
        "--detach",
        env=env,
    )
    assert grandchild.returncode == 0, grandchild.stderr

    status = run_cli("status", env=env)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(task_id))
    below = next(i for i, line in enumerate(lines) if line.startswith("  └ tree-child "))
    # Under the original, among its forks (the other tests' too), each one level deeper.
    assert below > at and all(line.startswith("  ") for line in lines[at + 1 : below])
    assert f"[fork of {task_id} at event {step_end(original, 3)}]" in lines[below]
    assert lines[below + 1].startswith("    └ tree-grandchild ")
    assert "[fork of tree-child at event" in lines[below + 1]
    rows = {r["task_id"]: r for r in json.loads(run_cli("status", "--json", env=env).stdout)}
    assert rows["tree-grandchild"]["forked_from"] == {
        "task_id": "tree-child",
        "at": step_end(original, 1),
    }
    assert rows[task_id]["forked_from"] is None

    replay = run_cli("replay", "tree-child", env=env)
    assert replay.returncode == 0, replay.stderr
    assert replay.stdout.startswith(f"forked from {task_id} at event {step_end(original, 3)}: ")
    trajectory = json.loads(run_cli("replay", "tree-child", "--json", env=env).stdout)
    assert trajectory["metadata"]["forked_from"] == {
        "task_id": task_id,
        "at": step_end(original, 3),
    }


def test_task_fork_runs_a_fork_from_python(
    finished: tuple[dict[str, str], list[Event]], tmp_path: Path
) -> None:
    """``Task.fork`` (kernelflow/task.py): the same fork from Python, run as ``Task.run``
    runs a task, its outcome that of the fork."""
    env, original = finished
    model = other_model(tmp_path)
    program = (
        "import json, sys\n"
        "from kernelflow import Task\n"
        "fork = Task.fork(sys.argv[1], after_step=3, llm=sys.argv[2])\n"
        "op_name, success, state = fork.run_sync()\n"
        "print(json.dumps([op_name, success, state.task_id, list(state.verifications),\n"
        "                  state.trajectory.metadata['forked_from'], state.kernel_code]))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", program, original[0].task_id, f"scripted:{model}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    op_name, success, fork_id, verdicts, origin, code = json.loads(run.stdout.splitlines()[-1])
    assert (op_name, success) == ("relu", True) and fork_id != original[0].task_id
    # The whole history's verdicts: the original's first check, copied, then the fork's.
    assert verdicts == ["mismatch", "pass"] and "BLOCK_SIZE = 512" in code
    assert origin == {"task_id": original[0].task_id, "at": step_end(original, 3)}
