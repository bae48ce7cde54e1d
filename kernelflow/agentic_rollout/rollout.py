"""``AgenticRollout``: an agent, its tools and its model, run on verl's batches or on
prompts of one's own (docs/agents.md, "AgenticRollout").

Standalone (no NATS): every run of its agent is recorded in the rollout's in-process
log (``run_log``: ``kernelflow.agentic_rollout.recording``); ``save_log`` writes that log
as a file ``kernelflow export grpo --from FILE`` turns into training data, and
``trajectory(task_id)`` folds one run's events as any task's trajectory is folded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelflow.agentic_rollout.agent import BaseAgent
from kernelflow.agentic_rollout.config import LOGGER, AgenticRolloutConfig, apply_log_level
from kernelflow.agentic_rollout.dataproto import prompts_of, to_data_proto
from kernelflow.agentic_rollout.monitoring import collector_of
from kernelflow.agentic_rollout.recording import RunLog, error_text
from kernelflow.agentic_rollout.registry import get_agent_class, list_agents
from kernelflow.agentic_rollout.session import ModelFunction, ProviderModel
from kernelflow.agentic_rollout.tools import tools_from_config
from kernelflow.llm import default_llm_spec, make_provider
from kernelflow.projections.trajectory import Trajectory
from kernelflow.rollout import SOLVER

log = logging.getLogger(LOGGER)
DEFAULT_SAVE_DIR = "trajectories"


class AgenticRollout:
    def __init__(
        self,
        config: AgenticRolloutConfig,
        llm_generate_func: ModelFunction | None = None,
        tokenizer: Any = None,
        **kwargs: Any,
    ) -> None:
        """``llm_generate_func``: your model (``await fn(messages, **kwargs)`` gives the
        reply's text, or a dict with ``text`` and its ``token_ids``, ``logprobs``...); None:
        the provider ``config.llm`` names (else the configured default). ``tokenizer``:
        verl's, for the tensors of ``generate_sequences``. ``kwargs``: settings of the
        agent (e.g. ``research_depth=2``)."""
        apply_log_level()
        self.config = config
        self.tokenizer = tokenizer
        self.run_log = RunLog()
        self.llm_generate_func = (
            llm_generate_func if llm_generate_func is not None else _provider_model(config.llm)
        )
        configured = tools_from_config(config.tools_config)
        self.agent_kwargs = kwargs
        self.agent = self._create_agent(**kwargs)
        # The runs' numbers, folded from the log (docs/agents.md, "Monitoring").
        self.metrics_collector = collector_of(self.run_log)
        # The agent's own tools, then the configured ones (which win on a name).
        self.tools: dict[str, Any] = {**self.agent.default_tools(), **configured}
        self.agent.set_tools(self.tools)
        self._saves = 0

    def _create_agent(self, **kwargs: Any) -> BaseAgent:
        cls = get_agent_class(self.config.agent_type)
        if cls is None:
            known = ", ".join(sorted(list_agents()))
            raise ValueError(
                f"agent_type {self.config.agent_type!r}: unknown agent; known: {known}"
            )
        agent = cls(
            max_steps=self.config.max_steps,
            max_tokens_per_step=self.config.max_tokens_per_step,
            temperature=self.config.temperature,
            **kwargs,
        )
        agent.run_log = self.run_log
        return agent

    async def generate_sequences(self, prompts: Any) -> Any:
        """One trajectory per row of verl's ``DataProto`` (``concurrent_requests`` at a
        time); a ``DataProto`` of them (``kernelflow.agentic_rollout.dataproto``). With
        ``save_trajectories``, the trajectories and the log of their runs are saved."""
        started = time.monotonic()
        prompt_list = prompts_of(prompts, self.tokenizer)
        trajectories = await self._generate_trajectories_batch(prompt_list)
        output = self._trajectories_to_data_proto(trajectories, prompts)
        # As verl's rollouts report it (its trainer adds it to the step's timings).
        output.meta_info["timing"] = {"agentic_rollout": time.monotonic() - started}
        if self.config.save_trajectories:
            path = self.save_trajectories(trajectories)
            self.save_log(path.with_name(path.name.replace("trajectories-", "events-", 1)))
        return output

    async def _generate_trajectories_batch(
        self, prompt_list: Sequence[dict[str, Any]]
    ) -> list[Trajectory]:
        gate = asyncio.Semaphore(self.config.concurrent_requests)

        async def one(i: int, prompt: dict[str, Any]) -> Trajectory:
            request_id = str(prompt.get("request_id") or f"sample-{i}")
            async with gate:
                try:
                    return await self.agent.run_trajectory(
                        prompt, self.llm_generate_func, request_id
                    )
                except Exception as exc:  # recorded as the run's failure; the batch goes on
                    error = error_text(exc)
                    log.warning("trajectory %s failed: %s", request_id, error)
                    return Trajectory(request_id=request_id, metadata={"error": error})

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompt_list))))

    def _trajectories_to_data_proto(
        self, trajectories: Sequence[Trajectory], original_prompts: Any
    ) -> Any:
        return to_data_proto(
            trajectories,
            original_prompts,
            self.run_log.events,
            self.tokenizer,
            self.config.include_trajectory_in_output,
        )

    def save_trajectories(self, trajectories: Sequence[Trajectory]) -> Path:
        """Write ``trajectories`` (``to_dict``, one JSON line each) to a new file in
        ``trajectory_save_path`` (default ``./trajectories``); its path."""
        self._saves += 1
        stamp = time.strftime("%Y%m%dT%H%M%S")
        name = f"trajectories-{stamp}-{uuid.uuid4().hex[:6]}-{self._saves}.jsonl"
        path = Path(self.config.trajectory_save_path or DEFAULT_SAVE_DIR) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for t in trajectories:
                out.write(json.dumps(t.to_dict(), default=str) + "\n")
        return path

    def save_log(self, path: str | Path) -> Path:
        """Write every run recorded since the last save as a log file (``kernelflow export
        grpo --from FILE`` reads it), and free them from memory (the metrics collector
        reads them first); its path."""
        self.metrics_collector.refresh()
        return self.run_log.save(Path(path))

    def trajectory(self, task_id: str) -> Trajectory:
        """The recorded trajectory of a run (``metadata["task_id"]`` of the agent's own)."""
        return self.run_log.trajectory(task_id)


def _provider_model(spec: str | None) -> ProviderModel | None:
    """The model of a provider spec, else of ``KF_LLM`` (as kernelflow's commands read it),
    else of the configured default, if there is one."""
    spec = spec or os.environ.get("KF_LLM") or default_llm_spec()
    return None if spec is None else ProviderModel(make_provider(spec), SOLVER)
