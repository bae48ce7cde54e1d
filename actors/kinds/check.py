"""Checks of a workflow's agents against the kind and tool registries (the workflow
loader checks structure only: it cannot know which kinds and tools a daemon has)."""

from __future__ import annotations

from kernelflow.actors.kinds.base import AgentConfigError
from kernelflow.actors.kinds.registry import UnknownAgentKind, agent_kind
from kernelflow.tools import UnknownTool, make_tool
from kernelflow.workflows.loader import WorkflowError
from kernelflow.workflows.model import VERIFIER, Workflow


def check_agents(workflow: Workflow) -> None:
    """Raise WorkflowError naming the agent and key when a kind, its settings or a tool
    is unknown or invalid."""
    for name, spec in workflow.agents.items():
        if name == VERIFIER:
            continue
        where = f"{workflow.name}: agent_info.{name}"
        try:
            kind = agent_kind(spec.kind)
            kind(spec)
        except UnknownAgentKind as exc:
            raise WorkflowError(f"{where}.agent_kind: {exc}") from exc
        except AgentConfigError as exc:
            raise WorkflowError(f"{workflow.name}: {exc}") from exc
        for i, tool in enumerate(spec.tools):
            try:
                make_tool(tool)
            except UnknownTool as exc:
                raise WorkflowError(f"{where}.tools[{i}]: {exc}") from exc
        if spec.tools and not kind.uses_tools:
            raise WorkflowError(
                f"{where}.tools: agent kind {spec.kind!r} makes no tool calls; "
                "use react, tool or coding"
            )
