"""``HealthChecker`` (docs/agents.md, "Monitoring"): whether an
``AgenticRollout``'s agent, tools, model and memory are healthy."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Mapping
from typing import Any

from kernelflow.agentic_rollout.monitoring import resident_mb
from kernelflow.agentic_rollout.recording import RunLog
from kernelflow.agentic_rollout.rollout import AgenticRollout

# What the health check's probe run is answered with: the final answer in the text format
# the built-in agents read (react, tool, coding).
PROBE_REPLY = "Thought: this is a health check.\nFinal Answer: ok"
# Seconds the model has to answer the health check's probe.
PROBE_TIMEOUT_S = 30.0
# Resident memory above which the process is reported unhealthy (the AgenticRollout
# document's default).
MEMORY_LIMIT_MB = 1000.0


class HealthChecker:
    """Seed 003 §10.2: ``perform_health_check`` checks the rollout's agent, tools, model
    and memory; ``health_status`` holds the last result."""

    def __init__(self, rollout: AgenticRollout, memory_limit_mb: float = MEMORY_LIMIT_MB) -> None:
        self.rollout = rollout
        self.memory_limit_mb = memory_limit_mb
        self.health_status: dict[str, Any] = {
            "overall": "healthy",
            "components": {},
            "last_check": None,
        }

    async def perform_health_check(self) -> dict[str, Any]:
        checks = [
            ("agent", self._check_agent_health),
            ("tools", self._check_tools_health),
            ("llm", self._check_llm_health),
            ("memory", self._check_memory_health),
        ]
        results: dict[str, Any] = {}
        for component, check in checks:
            try:
                results[component] = await check()
            except Exception as exc:  # a check that fails is the component's state
                results[component] = {
                    "healthy": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "status": "check_failed",
                }
        healthy = all(r["healthy"] for r in results.values())
        self.health_status = {
            "overall": "healthy" if healthy else "unhealthy",
            "components": results,
            "last_check": time.time(),
        }
        return self.health_status

    async def _check_agent_health(self) -> dict[str, Any]:
        """A probe run of a fresh agent of the rollout's kind, answered by a probe model,
        recorded in a log of its own (the rollout's log and metrics are left alone)."""
        agent = self.rollout._create_agent(**self.rollout.agent_kwargs)
        agent.run_log = RunLog()
        agent.set_tools(self.rollout.tools)

        async def probe(messages: Any, **kwargs: Any) -> str:
            return PROBE_REPLY

        trajectory = await agent.run_trajectory({"content": "Health check"}, probe, "health_check")
        answered = trajectory.get_final_response() is not None
        return {
            "healthy": answered,
            "status": "operational" if answered else "no_answer",
            "details": {
                "can_create_trajectory": True,
                "agent_type": type(self.rollout.agent).__name__,
            },
        }

    async def _check_tools_health(self) -> dict[str, Any]:
        """Each tool's own ``health_check`` where it has one."""
        tool_results: dict[str, Any] = {}
        for name, tool in self.rollout.tools.items():
            check = getattr(tool, "health_check", None)
            if check is None:
                tool_results[name] = {"status": "no_health_check", "assumed_healthy": True}
                continue
            try:
                result = await check()
            except Exception as exc:  # the tool's failure is its health
                result = {"healthy": False, "error": f"{type(exc).__name__}: {exc}"}
            tool_results[name] = result
        healthy = all(
            r.get("healthy", r.get("assumed_healthy", True))
            for r in tool_results.values()
            if isinstance(r, Mapping)
        )
        return {
            "healthy": healthy,
            "status": "checked" if tool_results else "no_tools",
            "details": {"tool_count": len(tool_results), "tool_results": tool_results},
        }

    async def _check_llm_health(self) -> dict[str, Any]:
        """One short call of the rollout's model (not recorded), within
        ``PROBE_TIMEOUT_S``."""
        model = self.rollout.llm_generate_func
        if model is None:
            return {"healthy": False, "status": "no_model", "error": "no model configured"}
        started = time.monotonic()
        answer = model([{"role": "user", "content": "Reply with OK."}], max_tokens=8)
        if inspect.isawaitable(answer):
            answer = await asyncio.wait_for(answer, PROBE_TIMEOUT_S)
        text = answer.get("text") if isinstance(answer, Mapping) else answer
        healthy = isinstance(text, str)
        return {
            "healthy": healthy,
            "status": "responding" if healthy else "bad_answer",
            "details": {"latency_s": time.monotonic() - started},
        }

    async def _check_memory_health(self) -> dict[str, Any]:
        used = resident_mb()
        return {
            "healthy": used <= self.memory_limit_mb,
            "status": "ok" if used <= self.memory_limit_mb else "high",
            "details": {"memory_used_mb": used, "limit_mb": self.memory_limit_mb},
        }
