"""The agents by name (docs/agents.md, "AgenticRollout"): ``register_agent``,
``get_agent_class``, ``list_agents``.

A registered agent is also an agent kind of kernelflow's (``agent_kind: NAME`` in a
workflow, ``kernelflow rollout --agent NAME``): the kind its class makes
(``BaseAgent.as_agent_kind``). A package can register one without being imported, through
the ``kernelflow.agents`` entry-point group, whose object may be the agent's class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from kernelflow.actors.kinds import agent_kind, agent_kinds, register_kind
from kernelflow.agentic_rollout.agent import BaseAgent

A = TypeVar("A", bound=type[BaseAgent])

_AGENT_REGISTRY: dict[str, type[BaseAgent]] = {}


def register_agent(name: str) -> Callable[[A], A]:
    """Class decorator: make a ``BaseAgent`` subclass the agent ``name``, here and in
    daemons. A name another agent or kind has is refused (ValueError)."""

    def register(cls: A) -> A:
        known = _AGENT_REGISTRY.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"agent {name!r} is already registered by {known.__qualname__}")
        register_kind(name)(cls.as_agent_kind(name))
        cls.registered_as = name
        _AGENT_REGISTRY[name] = cls
        return cls

    return register


def list_agents() -> dict[str, type[BaseAgent]]:
    """Every agent by name: those registered here and those the ``kernelflow.agents``
    entry points name."""
    found = dict(_AGENT_REGISTRY)
    for name in agent_kinds():  # loads the entry points
        agent_type = getattr(agent_kind(name), "agent_type", None)
        if isinstance(agent_type, type) and issubclass(agent_type, BaseAgent):
            found.setdefault(name, agent_type)
    return found


def get_agent_class(name: str) -> type[BaseAgent] | None:
    return list_agents().get(name)
