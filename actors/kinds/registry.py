"""The agent-kind registry: built-in kinds, ``@register_agent`` and entry-point plugins.

A third-party package adds a kind by declaring an entry point in the group
``kernelflow.agents`` whose object is an ``AgentKind`` subclass; the name a workflow uses
(``agent_kind``) is the class's ``name``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib.metadata import entry_points

from kernelflow.actors.kinds.base import AgentKind

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
    """Load the entry-point kinds once; a broken plugin is reported, never fatal."""
    errors = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:
            errors.append(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}")
            continue
        if not (isinstance(cls, type) and issubclass(cls, AgentKind)):
            errors.append(f"plugin {ep.name!r} ({ep.value}) is not an AgentKind subclass")
            continue
        if ep.name not in _KINDS:
            register_agent(ep.name)(cls)
    return tuple(errors)


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
        problems = "; ".join(_plugin_errors())
        raise UnknownAgentKind(
            f"unknown agent kind {name!r}; known: {', '.join(sorted(_KINDS))}"
            + (f" (plugin problems: {problems})" if problems else "")
        ) from None
