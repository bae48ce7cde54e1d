"""Prompt datasets: the rows of a ``.jsonl`` or ``.parquet`` file as prompts
(``PromptItem``) for rollouts (``kernelflow rollout``, ``kernelflow.rollout.Rollout``,
verl's agent loop, which reads one row at a time with ``prompt_item``).

A prompt is text or a list of chat messages (verl's format). A verl-format row (a chat
``prompt``, ``data_source``, ``ability``, ``reward_model``, ``extra_info``) is kept as it
was read (``PromptItem.row``, ``kernelflow.projections.verl_format``), to be recorded with
its rollouts, so ``export grpo --mode verl`` gives it back. Its system message becomes the
solver's system prompt (``PromptItem.system``); the other messages are the prompt text,
joined. A row that cannot be used raises ``DatasetError``, saying where it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelflow.projections.verl_format import DATASET_ROW, DatasetRow, encode_dataset_row


class DatasetError(ValueError):
    """A dataset file that cannot be used (bad user input)."""


@dataclass(frozen=True)
class PromptItem:
    prompt: str
    reference: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    id: str | None = None
    system: str | None = None  # the solver's system prompt (a dataset's system message)
    row: DatasetRow | None = None  # the verl-format row it came from, recorded as read

    @property
    def metadata(self) -> dict[str, str]:
        return {DATASET_ROW: encode_dataset_row(self.row)} if self.row is not None else {}


def load_dataset(
    path: Path, prompt_key: str = "prompt", answer_key: str | None = None
) -> list[PromptItem]:
    """Prompts from a ``.jsonl`` or ``.parquet`` file. A prompt is a string or a list of
    chat messages (verl's format: a system message becomes the solver's system prompt,
    the others its prompt text); the reference answer is ``answer_key``, else the first of
    ``answer``, ``reference``, ``ground_truth``, ``reward_model.ground_truth``. A row with
    chat messages or verl's other fields is kept, as read, to be recorded."""
    items = [
        prompt_item(row, f"{path}: row {i + 1}", prompt_key, answer_key)
        for i, row in enumerate(_read_rows(path))
    ]
    if not items:
        raise DatasetError(f"{path}: the dataset is empty")
    return items


def prompt_item(
    row: Any, where: str, prompt_key: str = "prompt", answer_key: str | None = None
) -> PromptItem:
    """One dataset row (``load_dataset``'s rules) as a prompt; DatasetError says what is
    wrong with it, naming ``where`` it is."""
    if not isinstance(row, dict) or prompt_key not in row:
        raise DatasetError(f"{where}: no {prompt_key!r} field")
    reference = _reference(row, answer_key, where)
    files = row.get("files") or {}
    if not isinstance(files, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in files.items()
    ):
        raise DatasetError(f"{where}: 'files' must map paths to text")
    row_id = row.get("id", row.get("uid"))
    messages = _messages(row[prompt_key], where)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    return PromptItem(
        prompt=_prompt_text(messages, where),
        reference=reference,
        files=files,
        id=None if row_id is None else str(row_id),
        system=system or None,
        row=_verl_row(row, row[prompt_key], messages, where),
    )


def _read_rows(path: Path) -> list[Any]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except (OSError, ValueError) as exc:
            raise DatasetError(f"{path}: cannot read parquet: {exc}") from exc
    if path.suffix not in (".jsonl", ".json"):
        raise DatasetError(f"{path}: expected a .jsonl or .parquet file")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read: {exc}") from exc
    rows = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}: line {n}: not JSON: {exc}") from exc
    return rows


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    """The prompt as chat messages (text: one user message)."""
    if isinstance(value, str) and value.strip():
        return [{"role": "user", "content": value}]
    if (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in value
        )
    ):
        return value
    raise DatasetError(
        f"{where}: the prompt must be text or a list of chat messages with text "
        "'role' and 'content'"
    )


def _prompt_text(messages: list[dict[str, Any]], where: str) -> str:
    contents = [m["content"] for m in messages if m["role"] != "system"]
    if any(c.strip() for c in contents):
        return "\n\n".join(contents)
    raise DatasetError(f"{where}: the prompt has no message but the system's")


def _verl_row(
    row: dict[str, Any], raw_prompt: Any, messages: list[dict[str, Any]], where: str
) -> DatasetRow | None:
    """The row to record: one in verl's format (chat messages, or verl's other fields)."""
    verl_keys = ("data_source", "ability", "reward_model", "extra_info")
    if isinstance(raw_prompt, str) and all(row.get(k) is None for k in verl_keys):
        return None
    for key in ("reward_model", "extra_info"):
        if row.get(key) is not None and not isinstance(row[key], dict):
            raise DatasetError(f"{where}: {key!r} must be an object")
    for key in ("data_source", "ability"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise DatasetError(f"{where}: {key!r} must be text")
    return DatasetRow(
        prompt=[dict(m) for m in messages],
        data_source=row.get("data_source"),
        ability=row.get("ability"),
        reward_model=row.get("reward_model"),
        extra_info=row.get("extra_info"),
    )


def _reference(row: dict[str, Any], key: str | None, where: str) -> str | None:
    if key is not None:
        if key not in row:
            raise DatasetError(f"{where}: no {key!r} field")
        return None if row[key] is None else _text(row[key])
    for name in ("answer", "reference", "ground_truth"):
        if row.get(name) is not None:
            return _text(row[name])
    model = row.get("reward_model")
    if isinstance(model, dict) and model.get("ground_truth") is not None:
        return _text(model["ground_truth"])
    return None


def _text(value: Any) -> str:
    """A reference answer as text (JSON for a list or an object)."""
    return json.dumps(value) if isinstance(value, list | dict) else str(value)
