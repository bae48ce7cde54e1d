"""Dataset rows on disk: ``.jsonl`` (optionally gzip-compressed) or ``.parquet``. The
per-turn samples and SFT conversations have a fixed schema and are written in row groups
as they stream; verl prompt rows carry each source dataset's own ``extra_info`` and
``reward_model``, so their schema is inferred from all of them at the end (one row per
distinct task: few). pyarrow is imported only when parquet is written, not at the start
of every command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from kernelflow.host.exits import UsageError
from kernelflow.offline.files import open_write


def _message_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def _kernelflow_info_type() -> Any:
    import pyarrow as pa

    return pa.struct(
        [
            ("kind", pa.string()),
            ("backend", pa.string()),
            ("reward_fn", pa.string()),
            ("rewards", pa.list_(pa.string())),
            ("task_id", pa.string()),
            ("task_name", pa.string()),
            ("group_id", pa.string()),
            ("workflow", pa.string()),
        ]
    )


def sample_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("uid", pa.string()),
            ("group_id", pa.string()),
            ("rollout_id", pa.string()),
            ("turn_index", pa.int32()),
            ("agent", pa.string()),
            ("dispatch_id", pa.string()),
            ("event_seq", pa.int64()),
            ("prompt", _message_type()),
            ("response", pa.string()),
            ("prompt_token_ids", pa.list_(pa.int64())),
            ("response_token_ids", pa.list_(pa.int64())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("reward_fn", pa.string()),
            ("reward_source", pa.string()),
            ("status", pa.string()),
            ("model", pa.string()),
            ("provider", pa.string()),
            ("workflow", pa.string()),
            ("task_name", pa.string()),
            ("data_source", pa.string()),
            ("truncated", pa.bool_()),
            ("response_mask", pa.list_(pa.int8())),
            ("token_ids_recorded", pa.bool_()),
            ("token_drift", pa.bool_()),
            ("prompt_tokens", pa.int64()),
            ("response_tokens", pa.int64()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct([("kernelflow", _kernelflow_info_type())])),
        ]
    )


def verl_schema() -> Any:
    """The verl prompt columns when there are no rows to infer them from."""
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", _message_type()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct([("index", pa.int64()), ("kernelflow", _kernelflow_info_type())]),
            ),
        ]
    )


def sft_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("messages", _message_type()),
            ("uid", pa.string()),
            ("group_id", pa.string()),
            ("rollout_id", pa.string()),
            ("agent", pa.string()),
            ("dispatch_id", pa.string()),
            ("llm_calls", pa.int32()),
            ("reward", pa.float64()),
            ("reward_fn", pa.string()),
            ("correct", pa.bool_()),
            ("status", pa.string()),
            ("data_source", pa.string()),
            ("task_name", pa.string()),
            ("workflow", pa.string()),
            ("model", pa.string()),
        ]
    )


class RowWriter:
    """Rows to ``.jsonl`` (one msgspec-encoded object per line) or ``.parquet``: row groups
    of ``batch`` rows in ``schema``, or with ``infer``, one table whose schema is inferred
    from every row at ``close`` (``schema`` then only serves a file of no rows).
    Deterministic for the same rows."""

    def __init__(
        self, path: Path, final_name: str, schema: Any, *, infer: bool = False, batch: int = 2048
    ) -> None:
        self.parquet = final_name.endswith(".parquet")
        self.rows = 0
        self._path = path
        self._buffer: list[dict[str, Any]] = []
        self._batch = batch
        self._schema = schema
        self._infer = infer
        if not self.parquet:
            self._file = open_write(path, final_name)
        elif not infer:
            import pyarrow.parquet as pq

            self._pq = pq.ParquetWriter(str(path), schema, compression="zstd")

    def write(self, row: msgspec.Struct) -> None:
        self.rows += 1
        if not self.parquet:
            self._file.write(msgspec.json.encode(row) + b"\n")
            return
        self._buffer.append(msgspec.to_builtins(row))
        if not self._infer and len(self._buffer) >= self._batch:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._buffer:
            self._pq.write_table(pa.Table.from_pylist(self._buffer, schema=self._schema))
            self._buffer = []

    def close(self) -> None:
        if not self.parquet:
            self._file.close()
        elif self._infer:
            self._write_inferred()
        else:
            self._flush()
            self._pq.close()

    def _write_inferred(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = None if self._buffer else self._schema
        try:
            table = pa.Table.from_pylist(self._buffer, schema=schema)
            pq.write_table(table, str(self._path), compression="zstd")
        except (pa.ArrowException, ValueError) as exc:
            raise UsageError(
                f"these rows do not fit one parquet schema ({exc}); write .jsonl instead"
            ) from exc
        self._buffer = []
