"""``kernelflow rollout``: run a prompt dataset N times through an agent kind, score it,
and leave everything in the log (so ``kernelflow export grpo`` turns it into training
data) and, with ``--out``, the trajectories in a JSONL file."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

from kernelflow.actors.kinds import AgentConfigError, UnknownAgentKind, agent_kind, agent_kinds
from kernelflow.actors.kinds.check import check_agents
from kernelflow.cli.commands.options import (
    LLM_HELP,
    add_connection_options,
    add_policy_option,
    positive_seconds,
)
from kernelflow.events.codec import MalformedMessage
from kernelflow.host.exits import EXIT_FAILED, EXIT_OK, UsageError
from kernelflow.host.settings import Settings
from kernelflow.host.stopping import interruptible
from kernelflow.llm import ProviderSpecError
from kernelflow.projections.rewards import (
    PROMPT_REWARDS,
    REWARD_FUNCTIONS,
    UnknownReward,
    check_reward_names,
)
from kernelflow.projections.trajectory import StepType, Trajectory
from kernelflow.prompt_datasets import DatasetError, load_dataset
from kernelflow.rollout import (
    Rollout,
    RolloutConfig,
    new_run_id,
    print_progress,
    rollout_summary,
)
from kernelflow.workflows.loader import WorkflowError, parse_workflow


def _names(raw: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (raw or "").split(",") if n.strip())


def config_from(args: argparse.Namespace, settings: Settings) -> RolloutConfig:
    try:
        agent_config = json.loads(args.agent_config) if args.agent_config else {}
    except json.JSONDecodeError as exc:
        raise UsageError(f"--agent-config: not JSON: {exc}") from exc
    if not isinstance(agent_config, dict):
        raise UsageError("--agent-config: must be a JSON object")
    if args.n < 1 or args.concurrency < 1 or args.max_steps < 1:
        raise UsageError("--n, --concurrency and --max-steps must be at least 1")
    config = RolloutConfig(
        agent_type=args.agent,
        tools=_names(args.tools),
        max_steps=args.max_steps,
        max_tokens_per_step=args.max_tokens,
        temperature=args.temperature,
        tool_format=args.tool_format,
        agent_config=agent_config,
        max_concurrency=args.concurrency,
        rewards=_names(args.reward) or PROMPT_REWARDS,
        save_trajectories=Path(args.out) if args.out else None,
        llm=args.llm,
        deadline_s=args.deadline,
        policy=args.policy,
        workflow=args.workflow,
    )
    # Refuse a bad agent, tool, workflow or reward here, before anything starts.
    try:
        agent_kind(config.agent_type)
        name, text = config.task_workflow(dirs=settings.workflow_dirs)
        workflow = parse_workflow(text, name, source=args.workflow or name)
        check_agents(workflow)
        if not args.reward and workflow.rewards:  # the workflow's own, when none is named
            config = dataclasses.replace(config, rewards=workflow.rewards)
        check_reward_names(config.rewards)
    except (UnknownAgentKind, AgentConfigError, UnknownReward, WorkflowError) as exc:
        raise UsageError(str(exc)) from exc
    return config


def cmd_rollout(args: argparse.Namespace, settings: Settings) -> int:
    config = config_from(args, settings)
    try:
        prompts = load_dataset(Path(args.dataset), args.prompt_key, args.answer_key)
    except DatasetError as exc:
        raise UsageError(str(exc)) from exc
    if args.limit:
        prompts = prompts[: args.limit]
    if args.resume is not None and not RUN_ID.fullmatch(args.resume):
        raise UsageError(f"--resume {args.resume!r}: not a rollout id (letters, digits, - and _)")
    run_id = args.resume or new_run_id()
    if not args.json:
        how = (
            f"the {config.workflow} workflow" if config.workflow else f"a {config.agent_type} agent"
        )
        print(
            f"rollout {run_id}{' (resumed)' if args.resume else ''}: {len(prompts)} prompts "
            f"x {args.n} through {how} "
            f"(tools: {', '.join(config.tools) or 'none'}; rewards: {', '.join(config.rewards)})",
            flush=True,
        )
    try:
        with interruptible():
            trajectories = Rollout(config, settings).run(
                prompts,
                args.n,
                on_progress=None if args.json else print_progress,
                run_id=run_id,
                resume=args.resume is not None,
            )
    except KeyboardInterrupt:
        print(
            f"rollout {run_id} interrupted: to finish it, run the same command with "
            f"--resume {run_id}",
            file=sys.stderr,
            flush=True,
        )
        raise
    except ProviderSpecError as exc:
        raise UsageError(str(exc)) from exc
    except MalformedMessage as exc:
        raise UsageError(f"cannot submit these rollouts: {exc}") from exc
    result: dict[str, Any] = {"run_id": run_id, **rollout_summary(trajectories)}
    result["unsuccessful"] = unsuccessful(trajectories)
    if config.save_trajectories is not None:
        result["trajectories_path"] = str(config.save_trajectories)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"statuses: {', '.join(f'{k} {v}' for k, v in sorted(result['statuses'].items()))}")
        for row in result["unsuccessful"][:SHOWN]:
            print(f"  {row['task_id']} {row['status']}: {row['reason']}")
        if len(result["unsuccessful"]) > SHOWN:
            print(f"  … and {len(result['unsuccessful']) - SHOWN} more (--json lists them all)")
        for name, mean in result["mean_reward"].items():
            print(f"mean {name}: {mean:.3f}")
        if "trajectories_path" in result:
            print(f"trajectories: {result['trajectories_path']}")
        print(
            "datasets: kernelflow export grpo --out rollouts.parquet (per-turn samples; "
            "--mode verl: verl's prompts, --mode sft: verl's SFT conversations)"
        )
    unfinished = sum(v for k, v in result["statuses"].items() if k in ("rejected", "unfinished"))
    return EXIT_FAILED if unfinished else EXIT_OK


RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Rollouts that did not succeed, listed with their reason under the statuses at most.
SHOWN = 10


def unsuccessful(trajectories: list[Trajectory]) -> list[dict[str, str]]:
    """Every rollout that did not end ``success``: its task id, status and why."""
    rows = []
    for t in trajectories:
        status = str(t.metadata.get("status", "unfinished"))
        if status == "success":
            continue
        ends = [s for s in t.steps if s.step_type == StepType.FINAL_ANSWER]
        reason = str(ends[-1].metadata.get("reason", "")) if ends else "it did not end"
        rows.append({"task_id": t.request_id, "status": status, "reason": reason})
    return rows


def register(subparsers: Any) -> None:
    """Add ``rollout`` to the ``kernelflow`` parser."""
    p = subparsers.add_parser(
        "rollout",
        help="run a prompt dataset N times through an agent and score it",
        description="Each rollout is a task in the log: export it with `kernelflow export "
        "grpo`. Exit 0 when every rollout finished, 1 when some were rejected, 2 on bad input.",
    )
    p.add_argument(
        "--dataset",
        required=True,
        help=".jsonl or .parquet with a prompt per row (text, or chat messages with verl's "
        "data_source, ability, reward_model, extra_info: kept with the rollouts)",
    )
    p.add_argument("--prompt-key", default="prompt", help="the prompt's field (default prompt)")
    p.add_argument(
        "--answer-key",
        help="the reference answer's field (default: answer, reference, ground_truth or "
        "reward_model.ground_truth)",
    )
    p.add_argument("--agent", default="react", help=f"agent kind: {', '.join(agent_kinds())}")
    p.add_argument(
        "--workflow",
        help="run each prompt through this workflow instead of one agent (agentflow: "
        "AgentFlow's planner, executor, memory verifier and solution generator; a named "
        "workflow or a YAML file); --tools then gives its tool-calling agents their tools",
    )
    p.add_argument("--tools", help="comma-separated tool names (see `kernelflow agents`)")
    add_policy_option(p)
    p.add_argument("--n", type=int, default=1, help="rollouts per prompt (one group)")
    p.add_argument("--max-steps", type=int, default=10, help="LLM calls per rollout")
    p.add_argument("--max-tokens", type=int, help="tokens per LLM call")
    p.add_argument("--temperature", type=float)
    p.add_argument("--tool-format", choices=["text", "native"], default="text")
    p.add_argument("--agent-config", help="more agent_config settings as a JSON object")
    p.add_argument(
        "--reward",
        help=f"comma-separated reward functions (default {','.join(PROMPT_REWARDS)}; "
        f"known: {', '.join(sorted(REWARD_FUNCTIONS))})",
    )
    p.add_argument("--concurrency", type=int, default=8, help="rollouts in flight at once")
    p.add_argument("--deadline", type=positive_seconds, help="seconds one rollout may take")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--out", help="write the trajectories to this JSONL file")
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="continue rollout RUN (printed when it started) with the same dataset and "
        "options: finished rollouts are kept, cancelled ones run again",
    )
    p.add_argument("--llm", help=LLM_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON summary")
    add_connection_options(p)
    p.set_defaults(func=cmd_rollout)
