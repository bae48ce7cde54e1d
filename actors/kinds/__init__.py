"""Agent kinds (agents as pure step functions; docs/agents.md, "Kinds"): ``llm``,
``react``, ``tool``, ``coding``, ``executor`` and any registered through
``register_kind`` or the ``kernelflow.agents`` entry-point group, durable programs among them
(``kernelflow.actors.kinds.durable``)."""

from kernelflow.actors.kinds import (  # noqa: F401  (register the built-ins)
    coding,
    executor,
    llm,
    react,
    tool,
)
from kernelflow.actors.kinds.base import (
    AgentConfigError,
    AgentKind,
    CallLLM,
    Finish,
    GiveUp,
    KindConfig,
    PlannedTool,
    RunTools,
    Step,
    Turn,
)
from kernelflow.actors.kinds.durable import DivergenceError, DurableKind, Journal
from kernelflow.actors.kinds.registry import (
    ENTRY_POINT_GROUP,
    UnknownAgentKind,
    agent_kind,
    agent_kinds,
    plugin_errors,
    register_kind,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "AgentConfigError",
    "AgentKind",
    "CallLLM",
    "DivergenceError",
    "DurableKind",
    "Finish",
    "GiveUp",
    "Journal",
    "KindConfig",
    "PlannedTool",
    "RunTools",
    "Step",
    "Turn",
    "UnknownAgentKind",
    "agent_kind",
    "agent_kinds",
    "plugin_errors",
    "register_kind",
]
