"""``kernelflow export grpo --tokenizer PATH [--drop-drifted]`` as installed, on the crafted
log of tests/unit/test_token_drift.py: the summary and meta count the drifted rows, which
``--drop-drifted`` leaves out; what cannot be checked is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli
from tests.unit.test_token_drift import crafted_log
from tests.verl_tokenizer import tiny_tokenizer


def test_export_checks_token_ids_with_the_tokenizer_given(tmp_path: Path) -> None:
    tokenizer_dir = tmp_path / "tokenizer"
    log = tmp_path / "crafted.jsonl"
    crafted_log(tiny_tokenizer(tokenizer_dir), log)
    out = tmp_path / "samples.jsonl"
    export = ["export", "grpo", "--from", str(log), "--out", str(out)]

    run = run_cli(*export, "--tokenizer", str(tokenizer_dir), "--drop-drifted")
    assert run.returncode == 0, run.stderr
    assert "token drift: 3 of 8 rows with token ids drifted (3 dropped)" in run.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and {r["token_drift"] for r in rows} == {False}
    meta = json.loads(Path(f"{out}.meta.json").read_text())["token_drift"]
    assert (meta["rows_checked"], meta["rows_drifted"], meta["tokenizer"]) == (
        8, 3, str(tokenizer_dir)
    )  # fmt: skip

    plain = run_cli(*export)
    assert plain.returncode == 0 and "token drift: no tokenizer given" in plain.stdout

    for args, said in [
        (["--drop-drifted"], "--drop-drifted: give the tokenizer"),
        (["--tokenizer", str(tmp_path / "none")], "no such tokenizer directory or file"),
        (["--tokenizer", str(log)], "not a tokenizer"),
        (["--tokenizer", str(tokenizer_dir), "--mode", "sft"], "only for --mode samples"),
    ]:
        refused = run_cli(*export, *args)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
