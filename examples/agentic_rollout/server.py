"""The AgenticRollout service the design document deploys (seed 003 §6.4: its Dockerfile
runs ``python examples/agentic_rollout/server.py`` and exposes port 8000; docs/agents.md,
"Examples"). A ReAct agent with kernelflow's calculator, over HTTP:

- ``POST /trajectories`` ``{"content": "What is 6*7?", "request_id": "q-0",
  "ground_truth": "42"}`` (only ``content`` is required) runs one trajectory and answers
  ``{"task_id", "final_response", "final_reward", "trajectory"}``;
- ``GET /metrics``: the runs' numbers (``PerformanceMetrics``, folded from the log);
- ``GET /health``: ``HealthChecker``'s report, 200 when healthy, else 503.

Errors are one line of JSON, ``{"error": "..."}``: 400 for a request that cannot be used,
502 when the run failed (the model could not be reached, say).

Settings are §6.3's environment: the model is kernelflow's configured one (``KF_LLM``:
``openai:URL#MODEL``, ``anthropic:MODEL``, ``scripted:FILE``...; docs/llm.md), with its keys
(``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``); ``AGENTIC_MAX_CONCURRENT_REQUESTS`` bounds the
runs in flight, ``AGENTIC_DEFAULT_TIMEOUT`` a tool call, ``AGENTIC_LOG_LEVEL`` the logging;
with ``AGENTIC_SAVE_TRAJECTORIES=true`` each trajectory is saved in ``./trajectories``.
The log of every run is written to ``./logs/events-<time>.jsonl`` when the server stops
(``kernelflow export grpo --from`` reads it): the Compose file's two volumes.

Run: ``KF_LLM=scripted:examples/scripted/arithmetic_react.yaml python
examples/agentic_rollout/server.py --port 8000``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
import time
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kernelflow.agentic_rollout import (
    AgenticRollout,
    AgenticRolloutConfig,
    CalculatorTool,
    HealthChecker,
)

LOG_DIR = Path("logs")


def make_app(rollout: AgenticRollout) -> Starlette:
    gate = asyncio.Semaphore(rollout.config.concurrent_requests)
    health = HealthChecker(rollout)

    async def trajectories(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return error(400, f"the body is not JSON: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return error(400, 'give {"content": "...", "request_id"?, "ground_truth"?}')
        request_id = str(body.get("request_id") or f"request-{time.time_ns()}")
        prompt = {"content": body["content"]}
        if body.get("ground_truth") is not None:
            prompt["ground_truth"] = str(body["ground_truth"])
        async with gate:
            try:
                trajectory = await rollout.agent.run_trajectory(
                    prompt, rollout.llm_generate_func, request_id
                )
            except Exception as exc:  # recorded in the log as the run's failure
                return error(502, f"the run failed: {type(exc).__name__}: {exc}")
        if rollout.config.save_trajectories:
            rollout.save_trajectories([trajectory])
        return JSONResponse(
            {
                "task_id": trajectory.metadata.get("task_id"),
                "final_response": trajectory.get_final_response(),
                "final_reward": trajectory.final_reward,
                "trajectory": trajectory.to_dict(),
            }
        )

    async def metrics(request: Request) -> JSONResponse:
        numbers = rollout.metrics_collector.performance_metrics()
        return JSONResponse(
            {"runs": len(rollout.agent.metrics), "metrics": dataclasses.asdict(numbers)}
        )

    async def healthz(request: Request) -> JSONResponse:
        status = await health.perform_health_check()
        return JSONResponse(status, status_code=200 if status["overall"] == "healthy" else 503)

    return Starlette(
        routes=[
            Route("/trajectories", trajectories, methods=["POST"]),
            Route("/metrics", metrics),
            Route("/health", healthz),
        ]
    )


def save_log(rollout: AgenticRollout) -> None:
    """Write the runs' log to ``LOG_DIR``, if any run was recorded."""
    if rollout.agent.metrics:
        LOG_DIR.mkdir(exist_ok=True)
        path = rollout.save_log(LOG_DIR / f"events-{time.strftime('%Y%m%dT%H%M%S')}.jsonl")
        print(f"the runs' log: {path}", file=sys.stderr)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="0.0.0.0")  # in a container, reached from outside
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        config = AgenticRolloutConfig(agent_type="react", max_steps=args.max_steps)
        rollout = AgenticRollout(config)
    except ValueError as exc:  # a setting of the environment that cannot be used
        print(f"server: {exc}", file=sys.stderr)
        return 2
    if rollout.llm_generate_func is None:
        print(
            "server: no model configured: set KF_LLM (e.g. openai:http://localhost:8000/v1#m, "
            "scripted:FILE) or ANTHROPIC_API_KEY",
            file=sys.stderr,
        )
        return 2
    rollout.tools = {"calculator": CalculatorTool()}
    rollout.agent.set_tools(rollout.tools)
    server = uvicorn.Server(
        uvicorn.Config(make_app(rollout), host=args.host, port=args.port, log_level="warning")
    )
    # uvicorn stops on SIGINT or SIGTERM, then raises the signal again: both end here.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        save_log(rollout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
