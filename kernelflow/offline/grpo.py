"""``kernelflow export grpo``: Flow-GRPO samples (one row per LLM turn, with rewards and
advantages) or verl prompts, with a ``.meta.json`` saying how they were made."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from kernelflow.offline.files import atomic_output
from kernelflow.offline.rows import RowWriter, sample_schema, verl_schema
from kernelflow.offline.sources import Source
from kernelflow.projections.flow_grpo import (
    GrpoOptions,
    PromptCollector,
    RewardTable,
    SampleBuilder,
)
from kernelflow.projections.metrics import MetricsProjection
from kernelflow.usage import UsageError


def _rewards_pass(source: Source, options: GrpoOptions) -> tuple[RewardTable, dict[str, Any]]:
    """Pass 1 of the samples export: the reward table, and the facts about the run that
    the metadata reports. The per-task metrics it folds are the export's largest holding
    (about 1.4 KB a task); they are released here, before pass 2 adds its own."""
    metrics = MetricsProjection()
    end = source.feed(metrics.apply, label="pass 1 of 2, rewards")
    table = RewardTable.from_tasks(metrics.tasks.values(), options, end)
    tasks = metrics.tasks.values()
    return table, {
        "models": sorted({m for t in tasks for m in t.models}),
        "llm_calls_by_agent": {
            name: a.llm_calls for name, a in sorted(metrics.state.agents.items()) if a.llm_calls
        },
        "workflows": sorted({t.workflow for t in tasks if t.workflow}),
    }


def export_grpo(
    source: Source, out: Path, options: GrpoOptions, mode: str = "samples"
) -> dict[str, Any]:
    """Write the dataset; return its provenance and counts (also written to
    ``<out>.meta.json``). Nothing in either file depends on when it was written."""
    if not (out.name.endswith(".parquet") or out.name.endswith((".jsonl", ".jsonl.gz"))):
        raise UsageError(f"{out}: the output must end in .parquet, .jsonl or .jsonl.gz")
    meta: dict[str, Any] = {
        "format": f"kernelflow-{'grpo-samples' if mode == 'samples' else 'verl-prompts'}",
        "version": 1,
        "options": {
            **asdict(options),
            "agents": sorted(options.agents) if options.agents is not None else None,
            "reward": options.reward_fn.key,
        },
        "reward_fn_doc": options.reward_fn.doc,
    }
    with atomic_output(out) as tmp:
        if mode == "verl":
            writer = RowWriter(tmp, out.name, verl_schema())
            collector = PromptCollector(options, writer.write)
            source.feed(collector.apply, label="collecting prompts")
            collector.finish()
            writer.close()
            meta["rows"] = writer.rows
        else:
            writer = RowWriter(tmp, out.name, sample_schema())
            table, run_facts = _rewards_pass(source, options)
            builder = SampleBuilder(table, writer.write)
            source.feed(builder.apply, end=table.end_position, label="pass 2 of 2, samples")
            drops = builder.finish()
            writer.close()
            groups = table.groups.values()
            meta.update(
                rows=writer.rows,
                rollouts=sum(1 for r in table.rollouts.values() if r.ended),
                groups=len(table.groups),
                groups_singleton=sum(1 for g in groups if g.verdict == "singleton"),
                groups_zero_variance=sum(1 for g in groups if g.verdict == "zero_variance"),
                reward_sources=table.reward_sources(),
                drops=msgspec.to_builtins(drops),
                **run_facts,
            )
        meta["source"] = {k: v for k, v in source.description.items()}
        meta_path = out.with_name(out.name + ".meta.json")
        with atomic_output(meta_path) as meta_tmp:
            meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta
