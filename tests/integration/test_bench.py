"""``kernelflow bench`` over KernelBench-format problems, with a local OpenAI-compatible
server standing in for the model, the real verifier (Triton in its CPU interpreter) and
the embedded NATS: fast_p over problems (a problem answered only with cheats is not
solved; no invented timings on the CPU), a run continued by running it again, an
evolutionary search killed mid-run that ends with the database of one never killed, and
`reverify` after a verifier change."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernelflow.events.log import EventLog
from kernelflow.projections.search import SearchDatabase
from kernelflow.verification.engine import VERIFIER_VERSION
from tests.conftest import EXAMPLES, KERNELFLOW, REPO, as_user, cli_env, connect, run_cli
from tests.fake_llm_servers import FakeOpenAI

LEVEL1 = EXAMPLES / "kernelbench" / "level1"
SOLUTIONS = EXAMPLES / "kernelbench" / "solutions"
HARDSWISH_SOLUTION = (SOLUTIONS / "3_hardswish.py").read_text()
# A reward hack for softmax: a kernel launched for show, PyTorch computes the result.
SOFTMAX_CHEAT = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, temperature):
        super().__init__()
        self.temperature = temperature

    def forward(self, x):
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return torch.softmax(x / self.temperature, dim=-1)
"""


def policy(body: dict[str, Any]) -> str:
    """The model: a conductor that sends the coder back, a designer that plans, a coder
    that solves hard swish and can only cheat at softmax."""
    messages = body["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    prompt = messages[-1]["content"]
    if "You are the conductor" in system:
        return json.dumps({"decision": "coder", "error_and_suggestion": "fix it"})
    if "You are the designer" in system:
        return "One program per block of elements; mask the tail."
    code = HARDSWISH_SOLUTION if "F.hardswish" in prompt else SOFTMAX_CHEAT
    return f"```python\n{code}```"


@pytest.fixture(scope="module")
def problems(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("level1")
    for name in ("3_hardswish.py", "5_row_softmax.py"):
        shutil.copy(LEVEL1 / name, folder / name)
    return folder


def test_bench_reports_fast_p_over_problems_and_a_cheat_does_not_solve_one(
    problems: Path, tmp_path: Path
) -> None:
    env = cli_env(KF_DATA_DIR=str(tmp_path / "data"))
    with FakeOpenAI(policy, model="policy") as server:
        args = ("bench", str(problems), "--samples", "2", "--llm", f"openai:{server.url}/v1#policy")
        result = run_cli(*args, "--workflow", "coder_only", "--json", env=env)
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        calls = len(server.completions)
        # Run again: the run is in the log; nothing is asked of the model again.
        again = run_cli(*args, "--workflow", "coder_only", "--json", env=env)
        assert again.returncode == 0, again.stderr
        assert len(server.completions) == calls
    assert out["fast_p"] == {"0": 0.5, "1": None, "1.2": None, "2": None}
    assert out["solved"] == 1 and out["problem_count"] == 2 and out["correctness"] == 0.5
    assert out["timed"] is False and "CPU interpreter" in out["note"]
    by_name = {p["problem"]: p for p in out["problems"]}
    hardswish, softmax = by_name["3_hardswish.py"], by_name["5_row_softmax.py"]
    assert hardswish["solved"] and hardswish["best_verdict"] == "pass"
    assert hardswish["speedup"] is None
    assert not softmax["solved"] and softmax["best_verdict"] == "rejected_static"
    assert softmax["candidates"] == 2  # no early win without a pass
    assert hardswish["tokens"] > 0
    assert out["tokens"] >= hardswish["tokens"] + softmax["tokens"]
    card = out["card"]
    assert card["verifier_versions"] == [VERIFIER_VERSION]
    assert {"static_gate", "judge_isolation", "secret_seeds"} <= set(
        card["checks_on_in_every_check"]
    )
    assert card["timing"] is None and card["timings"] == []
    assert card["devices"][0]["device_name"].startswith("cpu")
    rerun = json.loads(again.stdout)
    assert rerun["problems"] == out["problems"] and rerun["fast_p"] == out["fast_p"]
    # Every candidate is a task of the log, grouped by problem: training data too.
    export = run_cli(
        "export", "grpo", "--bench", out["run"], "--out", str(tmp_path / "d.jsonl"), env=env
    )
    assert export.returncode == 0, export.stderr
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
    assert {r["group_id"] for r in rows} == {f"{out['run']}-3", f"{out['run']}-5"}


def evolve_script(tmp_path: Path) -> Path:
    """A recorded model for the relu example whose candidates answer differently (by their
    number): right; wrong then right; a reward hack every time (its task ends failed)."""
    relu = yaml.safe_load((EXAMPLES / "scripted" / "relu.yaml").read_text())
    good, bad = relu["coder"][1], relu["coder"][0]
    cheat = (EXAMPLES / "candidates" / "cheats" / "torch_compute.py").read_text()
    hack = {"text": f"```python\n{cheat}```"}
    again = {"text": json.dumps({"decision": "coder", "error_and_suggestion": "try again"})}
    script = {
        "coder": [{"choices": [good, bad, hack]}] + [{"choices": [good, good, hack]}] * 8,
        "conductor": [again] * 8,
    }
    path = tmp_path / "evolve.yaml"
    path.write_text(yaml.safe_dump(script))
    return path


def bench_process(args: list[str], env: dict[str, str], out: Path) -> subprocess.Popen[bytes]:
    with out.open("wb") as sink:
        return subprocess.Popen(
            [*KERNELFLOW, *args],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def search_of(nats_url: str, search_id: str) -> SearchDatabase:
    """The search's database, folded from the log as anyone would."""

    async def read() -> SearchDatabase:
        nc = await connect(nats_url, "reader")
        db = SearchDatabase(search_id)
        reading = EventLog(nc).read()
        async for _, event in reading:
            db.apply(0, event)
        await nc.close()
        return db

    return asyncio.run(read())


def test_an_evolutionary_search_killed_mid_run_ends_as_one_never_killed(
    tmp_path: Path, private_nats: str
) -> None:
    script = evolve_script(tmp_path)
    env = cli_env(KF_ACK_WAIT="1")
    common = [
        "bench",
        str(EXAMPLES / "tasks" / "relu.py"),
        "--strategy",
        "evolve",
        "--islands",
        "2",
        "--samples",
        "1",
        "--generations",
        "3",
        "--seed",
        "7",
        "--workflow",
        "coder_only",
        "--llm",
        f"scripted:{script}",
        *as_user("daemon", private_nats),  # bench runs a daemon of its own
        "--json",
    ]
    whole = run_cli(*common, "--run", "whole", env=env)
    assert whole.returncode == 0, whole.stderr
    # Killed once the second generation is under way, then run again.
    first = bench_process([*common, "--run", "killed"], env, tmp_path / "first.out")
    deadline = time.monotonic() + 120
    while len(search_of(private_nats, "killed-relu").candidates) < 3:
        assert first.poll() is None and time.monotonic() < deadline, (
            tmp_path / "first.out"
        ).read_text()
        time.sleep(0.3)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    resumed = run_cli(*common, "--run", "killed", env=env)
    assert resumed.returncode == 0, resumed.stderr

    def normalised(run: str) -> list[dict[str, Any]]:
        rows = search_of(private_nats, f"{run}-relu").lineage()
        return json.loads(json.dumps(rows).replace(f"{run}-relu-", "c"))

    assert normalised("killed") == normalised("whole")
    lineage = normalised("whole")
    assert len(lineage) == 6 and {r["generation"] for r in lineage} == {0, 1, 2}
    assert any(r["parents"] for r in lineage)  # later generations build on earlier ones
    hacks = {r["task_id"] for r in lineage if r["verdict"] == "rejected_static"}
    assert hacks and not any(set(r["parents"]) & hacks for r in lineage)
