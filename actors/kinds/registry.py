"""The agent-kind registry: built-in kinds, ``@register_kind`` and entry-point plugins.

A third-party package adds a kind by declaring an entry point in the group
``kernelflow.agents`` whose object is an ``AgentKind`` subclass, or an agent written as a
program that makes its own kind (an object with ``as_agent_kind(name)``, as
``kernelflow.agentic_rollout.BaseAgent`` subclasses have); the name a workflow uses
(``agent_kind``) is the entry point's.
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


def register_kind(name: str) -> Callable[[type[AgentKind]], type[AgentKind]]:
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

    def problem(name: str, obj: object) -> str | None:
        kind = _kind_of(name, obj)
        if isinstance(kind, type) and issubclass(kind, AgentKind):
            return None
        return "is not an AgentKind subclass (nor makes one with as_agent_kind)"

    def register(name: str, obj: object) -> None:
        if name not in _KINDS:
            register_kind(name)(_kind_of(name, obj))  # type: ignore[arg-type]

    return load_plugins(ENTRY_POINT_GROUP, problem, register)


def _kind_of(name: str, obj: object) -> object:
    """The kind an entry point's object stands for: itself, or the kind it makes."""
    if isinstance(obj, type) and issubclass(obj, AgentKind):
        return obj
    make = getattr(obj, "as_agent_kind", None)
    return make(name) if callable(make) else obj


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
