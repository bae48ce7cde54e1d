"""Golden test on a log produced by real runs: a daemon, a grouped ``submit --samples 3``
of the ReLU example (scripted LLM), then the datasets (samples, verl prompts, SFT), the
report and replay."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kernelflow.cli.main import main as kernelflow_main
from tests.conftest import as_user, keyed_nats, run_cli
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
    "response_mask",
    "token_ids_recorded",
    "token_drift",
    "prompt_tokens",
    "response_tokens",
    "ability",
    "reward_model",
    "extra_info",
]


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("grpo-run")
    with keyed_nats(tmp / "nats") as url:
        daemon = start_daemon(url, tmp / "daemon.log", "--pool", "verifier=3")
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
                *as_user("publisher", url),
            )
            assert result.returncode == 0, result.stdout + result.stderr
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        yield url


def cli(*args: str) -> int:
    return kernelflow_main(list(args))


def test_grpo_dataset_of_a_grouped_run(
    run_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    for out in (a, b):
        assert cli("export", "grpo", "--out", str(out), *as_user("reader", run_log)) == 0
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
    # The task's own reward, as recorded; verl's fields of the task; no token ids (the
    # scripted model returns none) and the export says so.
    assert {(r["reward_fn"], r["reward_source"]) for r in rows} == {("binary@1", "recorded")}
    assert {(r["data_source"], r["ability"]) for r in rows} == {
        ("kernelflow/triton", "kernel_generation")
    }
    assert all("class Model" in r["reward_model"]["ground_truth"] for r in rows)
    assert {r["extra_info"]["kernelflow"]["kind"] for r in rows} == {"kernel"}
    assert not any(r["token_ids_recorded"] or r["response_mask"] for r in rows)
    assert all(r["prompt_tokens"] > 0 and r["response_tokens"] > 0 for r in rows)
    meta = json.loads((tmp_path / "a.parquet.meta.json").read_text())
    assert meta["groups"] == 1 and meta["groups_zero_variance"] == 1 and meta["rows"] == 12
    assert meta["llm_calls_by_agent"] == {"coder": 6, "conductor": 3, "designer": 3}
    assert meta["options"]["reward"] == "recorded" and meta["reward_fns"] == {"binary@1": 3}
    assert meta["token_ids"]["rows_without"] == 12 and "only when" in meta["token_ids"]["note"]
    assert meta["token_drift"]["checked"] is False and not any(r["token_drift"] for r in rows)

    jl1, jl2 = tmp_path / "1.jsonl", tmp_path / "2.jsonl"
    for out in (jl1, jl2):
        assert (
            cli(
                "export",
                "grpo",
                "--out",
                str(out),
                "--agents",
                "coder",
                *as_user("reader", run_log),
            )
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
        cli(
            "export",
            "grpo",
            "--out",
            str(typo),
            "--agents",
            "coder,codre",
            *as_user("reader", run_log),
        )
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
            *as_user("reader", run_log),
        )
        == 0
    )
    assert pq.read_table(dropped).num_rows == 0
    assert (
        json.loads((tmp_path / "d.parquet.meta.json").read_text())["drops"]["zero_variance"] == 12
    )


def test_verl_prompts_sft_report_and_replay(
    run_log: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    verl = tmp_path / "verl.parquet"
    assert (
        cli("export", "grpo", "--mode", "verl", "--out", str(verl), *as_user("reader", run_log))
        == 0
    )
    table = pq.read_table(verl)
    assert table.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    (row,) = table.to_pylist()  # three rollouts of one task: one prompt
    assert row["data_source"] == "kernelflow/triton"
    assert row["reward_model"]["style"] == "rule"
    assert "class Model" in row["reward_model"]["ground_truth"]
    assert row["extra_info"]["index"] == 0
    assert row["extra_info"]["kernelflow"]["group_id"] == GROUP
    # The coder's prompt (it writes the kernel, with the designer's sketch), not the
    # designer's.
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "## Design to implement" in row["prompt"][1]["content"]

    sft = tmp_path / "sft.parquet"
    assert (
        cli("export", "grpo", "--mode", "sft", "--out", str(sft), *as_user("reader", run_log)) == 0
    )
    conversations = pq.read_table(sft).to_pylist()
    # Every dispatch of the three successful rollouts: designer, coder, conductor, coder.
    assert len(conversations) == 12 and {c["correct"] for c in conversations} == {True}
    assert all(c["messages"][-1]["role"] == "assistant" for c in conversations)
    assert all(c["messages"][0]["role"] == "system" for c in conversations)
    capsys.readouterr()
    assert (
        cli("export", "grpo", "--keep", "all", "--out", str(sft), *as_user("reader", run_log)) == 2
    )
    assert "--keep: only for --mode sft" in capsys.readouterr().err

    assert cli("report", *as_user("reader", run_log)) == 0
    text = capsys.readouterr().out
    assert "relu-1" in text and "mismatch pass" in text
    lines = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert lines["scope"][:5] == ["scope", "tasks", "ended", "finished", "correct"]
    assert lines["all"][:5] == ["all", "3", "3", "100.0%", "100.0%"]
    assert lines["relu-1"][3:5] == ["success", "yes"]

    exported = tmp_path / "log.jsonl"
    assert cli("log", "export", "--out", str(exported), *as_user("reader", run_log)) == 0
    capsys.readouterr()
    views = []
    for source in ([*as_user("reader", run_log)], ["--from", str(exported)]):
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
