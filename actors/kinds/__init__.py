"""Agent kinds (agents as pure step functions; docs/agents.md, "Kinds"): ``llm``,
``react``, ``tool``, ``coding`` and any registered through ``register_agent`` or the
``kernelflow.agents`` entry-point group."""

from kernelflow.actors.kinds import coding, llm, react, tool  # noqa: F401  (register the built-ins)
from kernelflow.actors.kinds.base import (
    AgentConfigError,
    AgentKind,
    CallLLM,
    Finish,
    GiveUp,
    KindConfig,
    RunTools,
    Step,
    Turn,
)
from kernelflow.actors.kinds.registry import (
    ENTRY_POINT_GROUP,
    UnknownAgentKind,
    agent_kind,
    agent_kinds,
    plugin_errors,
    register_agent,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentConfigError",
    "AgentKind",
    "CallLLM",
    "Finish",
    "GiveUp",
    "KindConfig",
    "RunTools",
    "Step",
    "Turn",
    "UnknownAgentKind",
    "agent_kind",
    "agent_kinds",
    "plugin_errors",
    "register_agent",
]
