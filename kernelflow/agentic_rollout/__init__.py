"""The AgenticRollout library on kernelflow (docs/agents.md, "AgenticRollout"): agents
written as code (``BaseAgent.run_trajectory``), their tools and trajectories, run
standalone with every call recorded in an in-process log, on verl's batches
(``AgenticRollout.generate_sequences``), or in daemons as durable agent kinds."""

from kernelflow.actors.kinds.durable import DivergenceError
from kernelflow.agentic_rollout.agent import BaseAgent
from kernelflow.agentic_rollout.analysis import TrajectoryAnalyzer
from kernelflow.agentic_rollout.coding import (
    CodebaseState,
    CodingAgent,
    SWEPhase,
    Workspace,
    WorkspaceTool,
)
from kernelflow.agentic_rollout.config import AgenticRolloutConfig
from kernelflow.agentic_rollout.health import HealthChecker
from kernelflow.agentic_rollout.kinds import ReactAgent, ReactAgentConfig, ToolAgent
from kernelflow.agentic_rollout.limits import RetryPolicy, ToolLimits, ToolResultCache
from kernelflow.agentic_rollout.monitoring import MetricsCollector, PerformanceMetrics
from kernelflow.agentic_rollout.registry import get_agent_class, list_agents, register_agent
from kernelflow.agentic_rollout.rollout import AgenticRollout
from kernelflow.agentic_rollout.tools import (
    BaseTool,
    CalculatorTool,
    ToolConfigError,
    ToolExecutionError,
    tools_from_config,
)
from kernelflow.projections.trajectory import StepType, Trajectory, TrajectoryStep

__all__ = [
    "AgenticRollout",
    "AgenticRolloutConfig",
    "BaseAgent",
    "BaseTool",
    "CalculatorTool",
    "CodebaseState",
    "CodingAgent",
    "DivergenceError",
    "HealthChecker",
    "MetricsCollector",
    "PerformanceMetrics",
    "ReactAgent",
    "ReactAgentConfig",
    "RetryPolicy",
    "SWEPhase",
    "StepType",
    "ToolAgent",
    "ToolConfigError",
    "ToolExecutionError",
    "ToolLimits",
    "ToolResultCache",
    "Trajectory",
    "TrajectoryAnalyzer",
    "TrajectoryStep",
    "Workspace",
    "WorkspaceTool",
    "get_agent_class",
    "list_agents",
    "register_agent",
    "tools_from_config",
]
