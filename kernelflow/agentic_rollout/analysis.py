"""``TrajectoryAnalyzer``: how efficient a trajectory is, and what a set of them has in
common (docs/agents.md, "AgenticRollout"). Pure functions of trajectories."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from kernelflow.projections.trajectory import StepType, Trajectory, TrajectoryStep

# Most common tool sequences and failure points reported.
TOP = 5


class TrajectoryAnalyzer:
    @staticmethod
    def analyze_efficiency(trajectory: Trajectory) -> dict[str, float]:
        """Shares of tool calls and thoughts among the steps, steps per tool call, and the
        efficiency score (the share of tool calls)."""
        total_steps = len(trajectory.steps)
        tool_steps = len(trajectory.get_tool_calls())
        thought_steps = len([s for s in trajectory.steps if s.step_type == StepType.THOUGHT])
        return {
            "tool_ratio": tool_steps / total_steps if total_steps > 0 else 0,
            "thought_ratio": thought_steps / total_steps if total_steps > 0 else 0,
            "steps_per_tool": total_steps / tool_steps if tool_steps > 0 else float("inf"),
            "efficiency_score": tool_steps / max(total_steps, 1),
        }

    @staticmethod
    def identify_patterns(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
        """Average steps and the share completed; the sequences of tools the trajectories
        called most often (``{"tools": [...], "count": n}``); and where they failed most
        often (``{"step_type", "tool_name", "count", "example"}``: failed tool calls and
        other steps marked incorrect or with an error)."""
        n = len(trajectories)
        sequences = Counter(tuple(s.tool_name for s in t.get_tool_calls()) for t in trajectories)
        failures: Counter[tuple[str, str | None]] = Counter()
        examples: dict[tuple[str, str | None], str] = {}
        for t in trajectories:
            for step in t.steps:
                if _failed(step):
                    key = (step.step_type.value, step.tool_name)
                    failures[key] += 1
                    examples.setdefault(key, step.content[:200])
        return {
            "average_steps": sum(len(t.steps) for t in trajectories) / n if n else 0.0,
            "success_rate": sum(1 for t in trajectories if t.is_completed) / n if n else 0.0,
            "common_tool_sequences": [
                {"tools": list(tools), "count": count}
                for tools, count in sequences.most_common(TOP)
                if tools
            ],
            "failure_points": [
                {
                    "step_type": kind,
                    "tool_name": tool,
                    "count": count,
                    "example": examples[(kind, tool)],
                }
                for (kind, tool), count in failures.most_common(TOP)
            ],
        }


def _failed(step: TrajectoryStep) -> bool:
    return (
        step.is_correct is False
        or step.metadata.get("execution_successful") is False
        or bool(step.metadata.get("error"))
    )
