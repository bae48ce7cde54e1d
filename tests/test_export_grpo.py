"""Golden test on a log produced by real runs: a daemon, a grouped ``submit --samples 3``
of the ReLU example (scripted LLM), then the dataset, the report and replay."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kernelflow.cli import main as kernelflow_main
from kernelflow.nats_server import EmbeddedNats
from tests.conftest import run_cli
from tests.daemons import start_daemon

GROUP = "relu-grp"
COLUMNS = [
    "uid",
    "group_id",
    "rollout_id",
    "turn_index",
    "agent",
    "dispatch_id",
    "event_seq",
    "prompt",
    "response",
    "prompt_token_ids",
    "response_token_ids",
    "response_logprobs",
    "reward",
    "advantage",
    "reward_fn",
    "reward_source",
    "status",
    "model",
    "provider",
    "workflow",
    "task_name",
    "data_source",
    "truncated",
]


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("grpo-run")
    with EmbeddedNats(tmp / "nats") as server:
        daemon = start_daemon(server.url, tmp / "daemon.log", "--pool", "verifier=3")
        try:
            result = run_cli(
                "submit",
                "examples/tasks/relu.py",
                "--samples",
                "3",
                "--group",
                GROUP,
                "--task-id",
                "relu",
                "--wait",
                "--timeout",
                "120",
                "--nats-url",
                server.url,
            )
            assert result.returncode == 0, result.stdout + result.stderr
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        yield server.url


def cli(*args: str) -> int:
    return kernelflow_main(list(args))


def test_grpo_dataset_of_a_grouped_run(
    run_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out in (a, b):
        assert cli("export", "grpo", "--out", str(out), "--nats-url", run_log) == 0
    assert a.read_bytes() == b.read_bytes()
    assert (tmp_path / "a.parquet.meta.json").read_text() == (
        tmp_path / "b.parquet.meta.json"
    ).read_text()
    table = pq.read_table(a)
    assert table.column_names == COLUMNS
    rows = table.to_pylist()
    rollouts = {r["rollout_id"] for r in rows}
    assert rollouts == {"relu-1", "relu-2", "relu-3"}
    assert {r["uid"] for r in rows} == {r["group_id"] for r in rows} == {GROUP}
    for rid in rollouts:
        turns = [r for r in rows if r["rollout_id"] == rid]
        # designer, coder, the conductor's LLM decision after the failed check, coder
        assert [r["agent"] for r in turns] == ["designer", "coder", "conductor", "coder"]
        assert [r["turn_index"] for r in turns] == [0, 1, 2, 3]
        assert {r["reward"] for r in turns} == {1.0}
        assert all(r["prompt"] and r["prompt"][-1]["role"] == "user" for r in turns)
        assert all(r["response"] for r in turns)
    # Three successes: equal rewards, no learning signal, advantage 0.
    assert {r["advantage"] for r in rows} == {0.0}
    meta = json.loads((tmp_path / "a.parquet.meta.json").read_text())
    assert meta["groups"] == 1 and meta["groups_zero_variance"] == 1 and meta["rows"] == 12
    assert meta["llm_calls_by_agent"] == {"coder": 6, "conductor": 3, "designer": 3}

    jl1, jl2 = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    for out in (jl1, jl2):
        assert (
            cli("export", "grpo", "--out", str(out), "--agents", "coder", "--nats-url", run_log)
            == 0
        )
    assert jl1.read_bytes() == jl2.read_bytes()
    lines = [json.loads(x) for x in jl1.read_text().splitlines()]
    assert len(lines) == 6 and {x["agent"] for x in lines} == {"coder"}
    assert list(lines[0]) == COLUMNS
    assert "--agents" not in capsys.readouterr().err

    # A misspelt agent still exports what the others did, and says so.
    typo = tmp_path / "typo.jsonl"
    assert (
        cli("export", "grpo", "--out", str(typo), "--agents", "coder,codre", "--nats-url", run_log)
        == 0
    )
    assert len(typo.read_text().splitlines()) == 6
    assert capsys.readouterr().err == (
        "kernelflow: --agents: no LLM calls by codre in this log "
        "(calls by: coder, conductor, designer)\n"
    )

    dropped = tmp_path / "d.parquet"
    assert (
        cli(
            "export",
            "grpo",
            "--out",
            str(dropped),
            "--zero-variance",
            "drop",
            "--nats-url",
            run_log,
        )
        == 0
    )
    assert pq.read_table(dropped).num_rows == 0
    assert (
        json.loads((tmp_path / "d.parquet.meta.json").read_text())["drops"]["zero_variance"] == 12
    )


def test_verl_prompts_report_and_replay(
    run_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verl = tmp_path / "verl.parquet"
    assert cli("export", "grpo", "--mode", "verl", "--out", str(verl), "--nats-url", run_log) == 0
    table = pq.read_table(verl)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    (row,) = table.to_pylist()  # three rollouts of one task: one prompt
    assert row["data_source"] == "kernelflow/triton"
    assert row["reward_model"]["style"] == "rule"
    assert "class Model" in row["reward_model"]["ground_truth"]
    assert row["extra_info"]["group_id"] == GROUP and row["prompt"][0]["content"]

    capsys.readouterr()
    assert cli("report", "--nats-url", run_log) == 0
    text = capsys.readouterr().out
    assert "relu-1" in text and "100.0%" in text and "mismatch pass" in text

    exported = tmp_path / "log.jsonl"
    assert cli("log", "export", "--out", str(exported), "--nats-url", run_log) == 0
    capsys.readouterr()
    views = []
    for source in (["--nats-url", run_log], ["--from", str(exported)]):
        assert cli("replay", "--task", "relu-2", "--json", *source) == 0
        views.append(json.loads(capsys.readouterr().out))
    assert views[0] == views[1] and views[0]["is_completed"]
    assert (
        cli(
            "replay",
            "--task",
            "relu-2",
            "--view",
            "metrics",
            "--json",
            "--from",
            str(exported),
        )
        == 0
    )
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["status"] == "success" and metrics["verdicts"] == ["mismatch", "pass"]
    assert cli("replay", "--task", "relu-2", "--view", "counters", "--from", str(exported)) == 0
    assert "max_step 20" in capsys.readouterr().out
