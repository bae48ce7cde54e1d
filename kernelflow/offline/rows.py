"""Dataset rows on disk: ``.jsonl`` (optionally gzip-compressed) or ``.parquet`` with a
fixed schema per dataset kind. pyarrow is imported only when parquet is written, not at
the start of every command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from kernelflow.offline.files import open_write
from kernelflow.projections.flow_grpo import GrpoSample, VerlPrompt


def _message_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


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
        ]
    )


def verl_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", _message_type()),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("task_id", pa.string()),
                        ("task_name", pa.string()),
                        ("group_id", pa.string()),
                        ("workflow", pa.string()),
                        ("backend", pa.string()),
                        ("reward_fn", pa.string()),
                    ]
                ),
            ),
        ]
    )


class RowWriter:
    """Rows to ``.jsonl`` (one msgspec-encoded object per line) or ``.parquet`` (row groups
    of ``batch`` rows, fixed schema); deterministic for the same rows."""

    def __init__(self, path: Path, final_name: str, schema: Any, batch: int = 2048) -> None:
        self.parquet = final_name.endswith(".parquet")
        self.rows = 0
        self._buffer: list[dict[str, Any]] = []
        self._batch = batch
        self._schema = schema
        if self.parquet:
            import pyarrow.parquet as pq

            self._pq = pq.ParquetWriter(str(path), schema, compression="zstd")
        else:
            self._file = open_write(path, final_name)

    def write(self, row: GrpoSample | VerlPrompt) -> None:
        self.rows += 1
        if not self.parquet:
            self._file.write(msgspec.json.encode(row) + b"\n")
            return
        self._buffer.append(msgspec.to_builtins(row))
        if len(self._buffer) >= self._batch:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._buffer:
            self._pq.write_table(pa.Table.from_pylist(self._buffer, schema=self._schema))
            self._buffer = []

    def close(self) -> None:
        if self.parquet:
            self._flush()
            self._pq.close()
        else:
            self._file.close()
