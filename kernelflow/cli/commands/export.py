"""``kernelflow export grpo``: training data from the log (kernelflow.offline.grpo)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kernelflow.cli.commands.options import add_source_options, add_verifier_version_option
from kernelflow.host.exits import UsageError
from kernelflow.host.settings import Settings
from kernelflow.offline.grpo import MODES, export_grpo
from kernelflow.offline.sources import source_for
from kernelflow.offline.token_drift import DriftCheck, TokenizerError, load_tokenizer
from kernelflow.projections.flow_grpo import GrpoOptions
from kernelflow.projections.rewards import REWARD_FUNCTIONS, UnknownReward, get_reward


def register(subparsers: Any) -> None:
    export = subparsers.add_parser("export", help="training data from the log")
    export_sub = export.add_subparsers(dest="export_command", required=True)
    grpo = export_sub.add_parser(
        "grpo", help="Flow-GRPO samples (one row per LLM turn), verl prompts or verl SFT data"
    )
    grpo.add_argument("--out", required=True, help="FILE.parquet, FILE.jsonl or FILE.jsonl.gz")
    grpo.add_argument(
        "--mode",
        choices=MODES,
        default="samples",
        help="per-turn samples with rewards and advantages; verl's prompt dataset (one row "
        "per distinct task); or verl's multi-turn SFT dataset (a messages column)",
    )
    grpo.add_argument(
        "--agents",
        help="comma-separated agents whose turns are samples or conversations (default all "
        "but the judge; samples: the agents a task's workflow trains, trainable_agents, "
        "where it names them); in verl mode, whose first prompt a kernel task's row gets "
        "(default the agent that writes the kernel)",
    )
    grpo.add_argument(
        "--reward",
        help="reward function name[@version] (default: each task's own, as recorded: "
        f"binary@1 for kernel tasks, the first rollout reward for prompt tasks): "
        f"{', '.join(sorted(REWARD_FUNCTIONS))}",
    )
    grpo.add_argument(
        "--keep",
        choices=["correct", "finished", "all"],
        help="sft mode: the rollouts whose conversations are kept: reward > 0 (default), "
        "status success, or every one that ended",
    )
    grpo.add_argument(
        "--normalize",
        choices=["trajectory", "turn"],
        default="trajectory",
        help="group statistics over rollouts, or over all turns (AgentFlow; verl over rows)",
    )
    grpo.add_argument("--no-std", action="store_true", help="r - mean only (Dr.GRPO)")
    grpo.add_argument("--epsilon", type=float, default=1e-6, help="added to the std")
    grpo.add_argument(
        "--singleton",
        choices=["keep", "drop", "raw"],
        default="keep",
        help="groups of one rollout: keep with advantage 0 (default), drop, or give the "
        "advantage verl's GRPO gives a lone value (mean 0, std 1: about the reward)",
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
        "--max-prompt-tokens",
        type=int,
        help="longest prompt in tokens (the recorded ids, else the provider's count); "
        "longer turns are dropped",
    )
    grpo.add_argument(
        "--max-response-tokens",
        type=int,
        help="longest response in tokens (as --max-prompt-tokens); longer turns are dropped",
    )
    grpo.add_argument(
        "--overlong",
        choices=["truncate", "drop"],
        default="truncate",
        help="what to do with a turn over a maximum length in characters",
    )
    grpo.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="the policy's tokenizer (a local Hugging Face directory or tokenizer.json): "
        "check that each sample's token ids decode to its text and re-encode to the same "
        "ids; drifted rows get token_drift true (samples mode)",
    )
    grpo.add_argument(
        "--drop-drifted", action="store_true", help="leave out the rows whose ids drifted"
    )
    add_verifier_version_option(grpo)
    grpo.add_argument("--json", action="store_true", help="print the provenance as JSON")
    add_source_options(grpo)
    grpo.set_defaults(func=cmd_export_grpo)


def grpo_options(args: argparse.Namespace) -> GrpoOptions:
    agents = None
    if args.agents:
        agents = frozenset(a.strip() for a in args.agents.split(",") if a.strip())
    if args.reward is not None:
        try:
            get_reward(args.reward)
        except UnknownReward as exc:
            raise UsageError(str(exc)) from exc
    if args.epsilon < 0:
        raise UsageError(f"--epsilon {args.epsilon}: must not be negative")
    limits = ("max_prompt_chars", "max_response_chars", "max_prompt_tokens", "max_response_tokens")
    for flag in limits:
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {value}: expected at least 1")
    if args.keep is not None and args.mode != "sft":
        raise UsageError(f"--keep: only for --mode sft (this is --mode {args.mode})")
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
        max_prompt_tokens=args.max_prompt_tokens,
        max_response_tokens=args.max_response_tokens,
        overlong=args.overlong,
        verifier_version=args.verifier_version,
    )


def cmd_export_grpo(args: argparse.Namespace, settings: Settings) -> int:
    options = grpo_options(args)
    drift = drift_check(args)
    with source_for(args, settings) as source:
        meta = export_grpo(
            source, Path(args.out), options, args.mode, args.keep or "correct", drift=drift
        )
    print(json.dumps(meta, sort_keys=True) if args.json else _grpo_summary(args.out, meta))
    # A misspelt agent is not an error (a log may lack an agent), but it is never silent.
    called: dict[str, int] | None = meta.get("llm_calls_by_agent")  # samples and sft modes
    if options.agents and called is not None and (absent := sorted(options.agents - called.keys())):
        print(
            f"kernelflow: --agents: no LLM calls by {', '.join(absent)} in this log "
            f"(calls by: {', '.join(called) or 'nobody'})",
            file=sys.stderr,
        )
    return 0


def drift_check(args: argparse.Namespace) -> DriftCheck | None:
    """The token drift check ``--tokenizer`` asks for (docs/datasets.md, "Token drift")."""
    if args.drop_drifted and not args.tokenizer:
        raise UsageError("--drop-drifted: give the tokenizer to check with (--tokenizer PATH)")
    if not args.tokenizer:
        return None
    if args.mode != "samples":
        raise UsageError(f"--tokenizer: only for --mode samples (this is --mode {args.mode})")
    try:
        tokenizer = load_tokenizer(Path(args.tokenizer))
    except TokenizerError as exc:
        raise UsageError(str(exc)) from exc
    return DriftCheck(tokenizer, args.tokenizer, drop=args.drop_drifted)


def _grpo_summary(out: str, meta: dict[str, Any]) -> str:
    lines = [f"wrote {meta['rows']} rows to {out} (provenance: {out}.meta.json)"]
    if "drops" in meta:
        drops = {k: v for k, v in meta["drops"].items() if v}
        lines.append(
            f"rollouts {meta['rollouts']} in {meta['groups']} groups "
            f"({meta['groups_singleton']} of one, {meta['groups_zero_variance']} with equal "
            f"rewards); reward {_counts(meta['reward_fns'])}: {_counts(meta['reward_sources'])}"
        )
        what = "turns" if "token_ids" in meta else "conversations"
        lines.append(f"dropped/truncated {what}: " + (json.dumps(drops) if drops else "none"))
    if "token_ids" in meta and meta["token_ids"]["rows_without"]:
        lines.append(
            f"{meta['token_ids']['rows_without']} of {meta['rows']} rows have no token ids "
            "(the server returned none: their token_ids_recorded is false)"
        )
    if (drift := meta.get("token_drift")) is not None:
        lines.append(
            f"token drift: {drift['rows_drifted']} of {drift['rows_checked']} rows with token "
            f"ids drifted ({drift['rows_dropped']} dropped)"
            if drift["checked"]
            else f"token drift: {drift['note']}"
        )
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"
