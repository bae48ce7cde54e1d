"""The agent-kind registry: built-in kinds, ``@register_agent`` and entry-point plugins.

A third-party package adds a kind by declaring an entry point in the group
``kernelflow.agents`` whose object is an ``AgentKind`` subclass; the name a workflow uses
(``agent_kind``) is the class's ``name``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from kernelflow.actors.kinds.base import AgentKind
from kernelflow.common.plugins import load_plugins, unknown_name

ENTRY_POINT_GROUP = "kernelflow.agents"

_KINDS: dict[str, type[AgentKind]] = {}


class UnknownAgentKind(ValueError):
    pass


def register_agent(name: str) -> Callable[[type[AgentKind]], type[AgentKind]]:
    """Class decorator: make ``cls`` available to workflows as ``agent_kind: name``."""

    def register(cls: type[AgentKind]) -> type[AgentKind]:
        if name in _KINDS and _KINDS[name] is not cls:
            raise ValueError(f"agent kind {name!r} is already registered by {_KINDS[name]}")
        cls.name = name
        _KINDS[name] = cls
        return cls

    return register


@cache
def _plugin_errors() -> tuple[str, ...]:
    """Load the entry-point kinds once."""

    def problem(name: str, cls: object) -> str | None:
        if isinstance(cls, type) and issubclass(cls, AgentKind):
            return None
        return "is not an AgentKind subclass"

    def register(name: str, cls: object) -> None:
        if name not in _KINDS:
            register_agent(name)(cls)  # type: ignore[arg-type]

    return load_plugins(ENTRY_POINT_GROUP, problem, register)


def agent_kinds() -> list[str]:
    _plugin_errors()
    return sorted(_KINDS)


def plugin_errors() -> list[str]:
    return list(_plugin_errors())


def agent_kind(name: str) -> type[AgentKind]:
    _plugin_errors()
    try:
        return _KINDS[name]
    except KeyError:
        raise UnknownAgentKind(unknown_name("agent kind", name, _KINDS, _plugin_errors())) from None
