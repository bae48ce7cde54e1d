"""``kernelflow export grpo``: Flow-GRPO samples (one row per LLM turn, with rewards and
advantages), verl's prompt dataset or verl's SFT dataset, with a ``.meta.json`` saying how
they were made."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import msgspec

from kernelflow.events.model import Event
from kernelflow.host.exits import UsageError
from kernelflow.offline.files import atomic_output
from kernelflow.offline.rows import RowWriter, sample_schema, sft_schema, verl_schema
from kernelflow.offline.sources import Source
from kernelflow.offline.token_drift import NOT_CHECKED, DriftCheck
from kernelflow.projections.flow_grpo import GrpoOptions, RewardFacts, RewardTable, SampleBuilder
from kernelflow.projections.metrics import MetricsProjection, TaskMetrics
from kernelflow.projections.verl_rows import ConversationCollector, Keep, PromptCollector

MODES = ("samples", "verl", "sft")
FORMATS = {
    "samples": "kernelflow-grpo-samples",
    "verl": "verl-prompts",
    "sft": "verl-sft-messages",
}
TOKEN_IDS_NOTE = (
    "token ids (prompt_token_ids, response_token_ids, response_mask) are recorded only when "
    "the policy server returned them (vLLM's return_token_ids); elsewhere they are null and "
    "token_ids_recorded is false"
)


def _rewards_pass(source: Source, options: GrpoOptions) -> tuple[RewardTable, dict[str, Any]]:
    """Pass 1 of the samples and SFT exports: the reward table, and the facts about the
    run that the metadata reports. The per-task metrics it folds are the export's largest
    holding (about 1.4 KB a task); they are released here, before pass 2 adds its own."""
    metrics = MetricsProjection()
    facts = RewardFacts()

    def both(position: int, event: Event) -> None:
        metrics.apply(position, event)
        facts.apply(position, event)

    end = source.feed(both, label="pass 1 of 2, rewards")
    table = RewardTable.from_tasks(metrics.tasks.values(), options, end, facts.tasks)
    tasks = metrics.tasks.values()
    groups = table.groups.values()
    return table, {
        "rollouts": sum(1 for r in table.rollouts.values() if r.ended),
        "groups": len(table.groups),
        "groups_singleton": sum(1 for g in groups if g.verdict == "singleton"),
        "groups_zero_variance": sum(1 for g in groups if g.verdict == "zero_variance"),
        "reward_sources": table.reward_sources(),
        "reward_fns": table.reward_fns(),
        "models": sorted({m for t in tasks for m in t.models}),
        "llm_calls_by_agent": {
            name: a.llm_calls for name, a in sorted(metrics.state.agents.items()) if a.llm_calls
        },
        "workflows": sorted({t.workflow for t in tasks if t.workflow}),
        "trainable_agents": _trained(tasks, facts),
    }


def _trained(tasks: Iterable[TaskMetrics], facts: RewardFacts) -> dict[str, list[str]]:
    """The agents each workflow trains, where it says (``trainable_agents``): whose turns
    the samples hold without ``--agents``."""
    trained: dict[str, list[str]] = {}
    for t in tasks:
        known = facts.tasks.get(t.task_id)
        if known is not None and known.trainable is not None:
            trained[t.workflow] = sorted(known.trainable)
    return dict(sorted(trained.items()))


def export_grpo(
    source: Source,
    out: Path,
    options: GrpoOptions,
    mode: str = "samples",
    keep: Keep = "correct",
    drift: DriftCheck | None = None,
) -> dict[str, Any]:
    """Write the dataset; return its provenance and counts (also written to
    ``<out>.meta.json``). Nothing in either file depends on when it was written.
    ``drift``: the samples' token ids checked against their text (samples mode)."""
    if not (out.name.endswith(".parquet") or out.name.endswith((".jsonl", ".jsonl.gz"))):
        raise UsageError(f"{out}: the output must end in .parquet, .jsonl or .jsonl.gz")
    meta: dict[str, Any] = {
        "format": FORMATS[mode],
        "version": 2,
        "options": {
            **asdict(options),
            "agents": sorted(options.agents) if options.agents is not None else None,
            "reward": options.reward_label,
        },
        "reward_fn_doc": options.reward_fn().doc
        if options.reward
        else (
            "each task's own reward function (its first: binary@1 for kernel tasks, the "
            "first of `rollout --reward` for prompt tasks), as recorded"
        ),
    }
    with atomic_output(out) as tmp:
        if mode == "verl":
            writer = RowWriter(tmp, out.name, verl_schema(), infer=True)
            collector = PromptCollector(options, writer.write)
            source.feed(collector.apply, label="collecting prompts")
            collector.finish()
            writer.close()
            meta["rows"] = writer.rows
        elif mode == "sft":
            writer = RowWriter(tmp, out.name, sft_schema())
            table, run_facts = _rewards_pass(source, options)
            conversations = ConversationCollector(table, keep, writer.write)
            source.feed(
                conversations.apply, end=table.end_position, label="pass 2 of 2, conversations"
            )
            drops = conversations.finish()
            writer.close()
            meta.update(rows=writer.rows, keep=keep, drops=msgspec.to_builtins(drops), **run_facts)
        else:
            writer = RowWriter(tmp, out.name, sample_schema())
            table, run_facts = _rewards_pass(source, options)
            write = writer.write if drift is None else drift.checked_writes(writer.write)
            builder = SampleBuilder(table, write)
            source.feed(builder.apply, end=table.end_position, label="pass 2 of 2, samples")
            sample_drops = builder.finish()
            writer.close()
            meta.update(
                rows=writer.rows,
                drops=msgspec.to_builtins(sample_drops),
                token_ids={
                    "rows_with": builder.with_token_ids,
                    "rows_without": builder.samples - builder.with_token_ids,
                    "note": TOKEN_IDS_NOTE,
                },
                token_drift={"checked": False, "note": NOT_CHECKED}
                if drift is None
                else drift.meta(),
                **run_facts,
            )
        meta["source"] = {k: v for k, v in source.description.items()}
        meta_path = out.with_name(out.name + ".meta.json")
        with atomic_output(meta_path) as meta_tmp:
            meta_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta
