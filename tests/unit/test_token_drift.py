"""Token drift in ``export grpo`` (docs/datasets.md, "Token drift"): on a crafted log whose
turns carry token ids (the golden rollout's task three times over, as a group), the rows
whose ids do not decode to their text, or whose text does not re-encode to their ids,
are flagged and counted; ``--drop-drifted`` leaves them out; without a tokenizer the
export says nothing was checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from kernelflow.events.model import Event, LLMCalled
from kernelflow.offline.files import file_events
from kernelflow.offline.grpo import export_grpo
from kernelflow.offline.sources import EventFilter, FileSource
from kernelflow.offline.token_drift import DriftCheck
from kernelflow.projections.flow_grpo import GrpoOptions
from tests.golden_logs import GOLDEN
from tests.unit.test_golden_logs import write_log
from tests.verl_tokenizer import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def crafted_log(tokenizer: Any, path: Path) -> None:
    golden = [e for _, e in file_events(GOLDEN / "rollout.jsonl")]
    original = golden[0].task_id
    events: list[Event] = []
    for task in ("right", "edited", "split", "prompt"):
        calls = 0
        for e in golden:
            fields: dict[str, Any] = {"task_id": f"{original}-{task}"}
            if isinstance(e, LLMCalled):
                fields |= ids_for_call(tokenizer, task, e, calls)
                calls += 1
            events.append(msgspec.structs.replace(e, **fields))
    write_log(path, events)


def ids_for_call(tokenizer: Any, task: str, call: LLMCalled, n: int) -> dict[str, Any]:
    """``right``: the tokenizer's ids of the turn (and the end token the server adds);
    ``edited``: the first turn's ids are those of another text (the text was changed
    after the ids were taken); ``split``: its ids encode each character on its own, which
    decodes to the text but is not how the tokenizer encodes it; ``prompt``: the second
    turn's prompt ids lack the template's last token."""
    text = call.response_text
    if task == "edited" and n == 0:
        ids = tokenizer.encode(text.replace("compute", "calculate"), add_special_tokens=False)
    elif task == "split" and n == 0:
        ids = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
    else:
        ids = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
    messages = [{"role": m.role, "content": m.content} for m in call.messages]
    prompt = tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    if task == "prompt" and n == 1:  # its generation prompt left out
        prompt = prompt[:-1]
    return {"token_ids": ids, "prompt_token_ids": list(prompt)}


def exported(log: Path, out: Path, drift: DriftCheck | None) -> tuple[list[Any], dict[str, Any]]:
    meta = export_grpo(FileSource(log, EventFilter()), out, GrpoOptions(), drift=drift)
    return [json.loads(line) for line in out.read_text().splitlines()], meta


def test_drifted_turns_are_flagged_counted_and_dropped_on_request(
    tokenizer: Any, tmp_path: Path
) -> None:
    log = tmp_path / "crafted.jsonl"
    crafted_log(tokenizer, log)

    rows, meta = exported(log, tmp_path / "plain.jsonl", None)
    assert len(rows) == 8 and {r["token_drift"] for r in rows} == {None}
    assert meta["token_drift"]["checked"] is False
    assert "not checked" in meta["token_drift"]["note"]

    rows, meta = exported(log, tmp_path / "checked.jsonl", DriftCheck(tokenizer, "tiny"))
    flagged = {
        (r["rollout_id"].rsplit("-", 1)[1], r["turn_index"]) for r in rows if r["token_drift"]
    }
    assert flagged == {("edited", 0), ("split", 0), ("prompt", 1)}
    assert all(r["token_drift"] is False for r in rows if r["rollout_id"].endswith("-right"))
    assert meta["token_drift"] == {
        "checked": True,
        "tokenizer": "tiny",
        "rows_checked": 8,
        "rows_drifted": 3,
        "rows_dropped": 0,
        "by_reason": {
            "prompt ids decode to other text": 1,
            "prompt text encodes to other ids": 1,
            "response ids decode to other text": 1,
            "response text encodes to other ids": 2,
        },
    }

    check = DriftCheck(tokenizer, "tiny", drop=True)
    rows, meta = exported(log, tmp_path / "dropped.jsonl", check)
    assert len(rows) == 5 and not any(r["token_drift"] for r in rows)
    assert (meta["rows"], meta["token_drift"]["rows_dropped"]) == (5, 3)
