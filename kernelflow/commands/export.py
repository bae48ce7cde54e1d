"""``kernelflow export grpo``: training data from the log (kernelflow.offline.grpo)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kernelflow.commands.options import add_source_options
from kernelflow.offline.grpo import export_grpo
from kernelflow.offline.sources import source_for
from kernelflow.projections.flow_grpo import GrpoOptions
from kernelflow.projections.rewards import REWARD_FUNCTIONS, UnknownReward, get_reward
from kernelflow.settings import Settings
from kernelflow.usage import UsageError


def register(subparsers: Any) -> None:
    export = subparsers.add_parser("export", help="training data from the log")
    export_sub = export.add_subparsers(dest="export_command", required=True)
    grpo = export_sub.add_parser(
        "grpo", help="Flow-GRPO samples (one row per LLM turn) or verl prompts"
    )
    grpo.add_argument("--out", required=True, help="FILE.parquet, FILE.jsonl or FILE.jsonl.gz")
    grpo.add_argument(
        "--mode",
        choices=["samples", "verl"],
        default="samples",
        help="per-turn samples with rewards and advantages, or the verl prompt dataset",
    )
    grpo.add_argument(
        "--agents", help="comma-separated agents whose turns are samples (default all)"
    )
    grpo.add_argument(
        "--reward",
        default="binary@1",
        help=f"reward function name[@version]: {', '.join(sorted(REWARD_FUNCTIONS))}",
    )
    grpo.add_argument(
        "--normalize",
        choices=["trajectory", "turn"],
        default="trajectory",
        help="group statistics over rollouts, or over all turns (AgentFlow)",
    )
    grpo.add_argument("--no-std", action="store_true", help="r - mean only (Dr.GRPO)")
    grpo.add_argument("--epsilon", type=float, default=1e-6, help="added to the std")
    grpo.add_argument(
        "--singleton",
        choices=["keep", "drop"],
        default="keep",
        help="groups of one rollout: keep with advantage 0, or drop",
    )
    grpo.add_argument(
        "--zero-variance",
        choices=["keep", "drop"],
        default="keep",
        help="groups whose rewards are all equal: keep with advantage 0, or drop",
    )
    grpo.add_argument("--max-prompt-chars", type=int, help="longest prompt (characters)")
    grpo.add_argument("--max-response-chars", type=int, help="longest response (characters)")
    grpo.add_argument(
        "--overlong",
        choices=["truncate", "drop"],
        default="truncate",
        help="what to do with a turn over a maximum length",
    )
    grpo.add_argument("--json", action="store_true", help="print the provenance as JSON")
    add_source_options(grpo)
    grpo.set_defaults(func=cmd_export_grpo)


def grpo_options(args: argparse.Namespace) -> GrpoOptions:
    agents = None
    if args.agents:
        agents = frozenset(a.strip() for a in args.agents.split(",") if a.strip())
    try:
        get_reward(args.reward)
    except UnknownReward as exc:
        raise UsageError(str(exc)) from exc
    if args.epsilon < 0:
        raise UsageError(f"--epsilon {args.epsilon}: must not be negative")
    for flag in ("max_prompt_chars", "max_response_chars"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {value}: expected at least 1")
    return GrpoOptions(
        agents=agents,
        reward=args.reward,
        normalize=args.normalize,
        scale_std=not args.no_std,
        epsilon=args.epsilon,
        singleton=args.singleton,
        zero_variance=args.zero_variance,
        max_prompt_chars=args.max_prompt_chars,
        max_response_chars=args.max_response_chars,
        overlong=args.overlong,
    )


def cmd_export_grpo(args: argparse.Namespace, settings: Settings) -> int:
    options = grpo_options(args)
    with source_for(args, settings) as source:
        meta = export_grpo(source, Path(args.out), options, args.mode)
    print(json.dumps(meta, sort_keys=True) if args.json else _grpo_summary(args.out, meta))
    # A misspelt agent is not an error (a log may lack an agent), but it is never silent.
    called: dict[str, int] | None = meta.get("llm_calls_by_agent")  # samples mode only
    if options.agents and called is not None and (absent := sorted(options.agents - called.keys())):
        print(
            f"kernelflow: --agents: no LLM calls by {', '.join(absent)} in this log "
            f"(calls by: {', '.join(called) or 'nobody'})",
            file=sys.stderr,
        )
    return 0


def _grpo_summary(out: str, meta: dict[str, Any]) -> str:
    lines = [f"wrote {meta['rows']} rows to {out} (provenance: {out}.meta.json)"]
    if "drops" in meta:
        drops = {k: v for k, v in meta["drops"].items() if v}
        lines.append(
            f"rollouts {meta['rollouts']} in {meta['groups']} groups "
            f"({meta['groups_singleton']} of one, {meta['groups_zero_variance']} with equal "
            f"rewards); reward {meta['options']['reward']}: {meta['reward_sources']}"
        )
        lines.append("dropped/truncated turns: " + (json.dumps(drops) if drops else "none"))
    return "\n".join(lines)
