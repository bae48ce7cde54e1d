"""What recording costs a standalone AgenticRollout agent (docs/agents.md, "AgenticRollout").

    python bench/agentic_rollout_overhead.py [--trajectories 200] [--latency 0.02] [--rounds 2]

A 5-step agent (four replies that each call kernelflow's calculator, then the final
answer), whose ``llm_generate_func`` answers after ``--latency`` seconds, runs
``--trajectories`` trajectories, ``concurrent_requests`` at a time (the config's default,
4), twice per round:

- recorded: ``agent.run_trajectory`` as a user calls it, every LLM and tool call recorded
  in the rollout's in-process log with the task's own events (its submission, the
  conductor's decisions, its end and its rewards);
- direct: the same agent code (the ``run_trajectory`` the class defines, before the journal
  is put around it) calling the same function directly, nothing recorded.

The two take turns going first. It prints each run's wall time and the ratio of the
totals, recorded / direct (target: at most 1.10).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from kernelflow.agentic_rollout import (
    AgenticRollout,
    AgenticRolloutConfig,
    BaseAgent,
    CalculatorTool,
    StepType,
    Trajectory,
    TrajectoryStep,
)

TOOL_STEPS = 4  # then the final answer: 5 LLM calls per trajectory


class FiveSteps(BaseAgent):
    """Asks its model five times: four actions, each run, then the answer."""

    async def run_trajectory(
        self, prompt: dict[str, Any], llm_generate_func: Any, request_id: str, **kwargs: Any
    ) -> Trajectory:
        trajectory = Trajectory(request_id=request_id)
        trajectory.add_step(TrajectoryStep(StepType.OBSERVATION, prompt["content"]))
        while self.should_continue(trajectory):
            reply = await llm_generate_func(
                self.format_messages_for_llm(trajectory),
                max_tokens=self.max_tokens_per_step,
                temperature=self.temperature,
            )
            if reply.startswith("Final Answer:"):
                trajectory.add_step(TrajectoryStep(StepType.FINAL_ANSWER, reply[13:].strip()))
                break
            name, args = self._parse_tool_call(reply.removeprefix("Action:").strip())
            trajectory.add_step(
                TrajectoryStep(StepType.ACTION, reply, tool_name=name, tool_args=args)
            )
            assert name is not None and args is not None
            trajectory.add_step(await self.execute_tool_call(name, args, trajectory))
        self.finalize_trajectory(trajectory)
        return trajectory


def model(latency_s: float) -> Any:
    async def generate(messages: list[dict[str, str]], **kwargs: Any) -> str:
        await asyncio.sleep(latency_s)
        done = sum(m["content"].count("Observation:") for m in messages if m["role"] == "user")
        if done >= TOOL_STEPS:
            return "Final Answer: 42"
        return f"Action: calculator(expression='6 * 7 + {done}')"

    return generate


async def run_all(rollout: AgenticRollout, trajectories: int, recorded: bool) -> float:
    agent, generate = rollout.agent, rollout.llm_generate_func
    direct = type(agent).run_trajectory.__wrapped__  # type: ignore[attr-defined]
    gate = asyncio.Semaphore(rollout.config.concurrent_requests)

    async def one(i: int) -> Trajectory:
        prompt, request_id = {"content": f"question {i}"}, f"q{i}"
        async with gate:
            if recorded:
                trajectory: Trajectory = await agent.run_trajectory(prompt, generate, request_id)
            else:
                trajectory = await direct(agent, prompt, generate, request_id)
        assert trajectory.get_final_response() == "42", trajectory.to_dict()
        return trajectory

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(trajectories)))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trajectories", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds per LLM call")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    rollout = AgenticRollout(
        AgenticRolloutConfig(max_steps=10), llm_generate_func=model(args.latency)
    )
    rollout.agent = FiveSteps(max_steps=10)
    rollout.agent.run_log = rollout.run_log
    rollout.agent.set_tools({"calculator": CalculatorTool()})
    ideal = args.trajectories / rollout.config.concurrent_requests * 5 * args.latency
    print(
        f"{args.trajectories} trajectories x 5 LLM calls of {args.latency * 1000:g} ms, "
        f"{rollout.config.concurrent_requests} at a time (ideal {ideal:.2f}s)"
    )
    totals = {True: 0.0, False: 0.0}
    for r in range(args.rounds):
        for recorded in (True, False) if r % 2 == 0 else (False, True):
            wall = asyncio.run(run_all(rollout, args.trajectories, recorded))
            totals[recorded] += wall
            print(f"round {r + 1}: {'recorded' if recorded else 'direct  '} {wall:.3f}s")
    events = rollout.run_log.log.streams.last_seq
    per_run = events / (args.rounds * args.trajectories)
    print(f"recorded {events} events ({per_run:.0f} per trajectory)")
    ratio = totals[True] / totals[False]
    direct, recorded = totals[False], totals[True]
    print(f"direct {direct:.3f}s, recorded {recorded:.3f}s: ratio {ratio:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
