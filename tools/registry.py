"""Tools by name: the built-in ones (``@register_tool``) and third-party ones.

A package adds tools through the entry-point group ``kernelflow.tools``; each entry point
names a :class:`Tool` subclass and the tool is known by the class's ``name``::

    [project.entry-points."kernelflow.tools"]
    web_search = "my_package.tools:WebSearch"

Plugins are loaded lazily, once per process, the first time a tool is looked up, by the
loader every registry uses (``kernelflow.common.plugins``). A plugin that fails to load is
logged and left out of :func:`tool_names`; asking for it by name raises
:class:`UnknownTool` with the reason, so one broken package never breaks the rest.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import TypeVar, cast

from kernelflow.common.plugins import load_plugins
from kernelflow.common.suggest import did_you_mean
from kernelflow.tools.base import Tool, ToolLimits

__all__ = ["ENTRY_POINT_GROUP", "UnknownTool", "make_tool", "register_tool", "tool_names"]

ENTRY_POINT_GROUP = "kernelflow.tools"
# What providers accept as a function name (OpenAI: ^[a-zA-Z0-9_-]{1,64}$).
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

log = logging.getLogger(__name__)

T = TypeVar("T", bound=type[Tool])

_BUILTIN: dict[str, type[Tool]] = {}


class UnknownTool(ValueError):
    """No tool of that name here (or its plugin failed to load: the message says why)."""


def _checked_name(cls: type[Tool]) -> str:
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(
            f"tool class {cls.__qualname__} needs a class attribute `name` matching "
            f"{_NAME.pattern} (got {name!r})"
        )
    return name


def register_tool(cls: T) -> T:
    """Class decorator: make ``cls`` a built-in tool under its ``name``."""
    name = _checked_name(cls)
    known = _BUILTIN.get(name)
    if known is not None and known is not cls:
        raise ValueError(f"tool {name!r} is already registered by {known.__qualname__}")
    _BUILTIN[name] = cls
    return cls


@functools.cache
def _plugins() -> tuple[dict[str, type[Tool]], dict[str, str]]:
    """The tools of the ``kernelflow.tools`` entry points, and why each broken one failed
    (by entry point name)."""
    tools: dict[str, type[Tool]] = {}
    broken: dict[str, str] = {}

    def problem(entry: str, obj: object) -> str | None:
        if not (isinstance(obj, type) and issubclass(obj, Tool)):
            raise TypeError(f"{obj!r} is not a subclass of kernelflow.tools.Tool")
        name = _checked_name(obj)
        if name in _BUILTIN or name in tools:
            return f"is ignored: a tool named {name!r} already exists"
        return None

    def register(entry: str, obj: object) -> None:
        cls = cast(type[Tool], obj)
        tools[_checked_name(cls)] = cls

    def report(entry: str, why: str) -> None:
        broken[entry] = why
        log.warning("%s", why)

    load_plugins(ENTRY_POINT_GROUP, problem, register, label="tool plugin", on_problem=report)
    return tools, broken


def tool_names() -> list[str]:
    """Every tool that can be made here, sorted: built-in and loaded plugins."""
    return sorted({*_BUILTIN, *_plugins()[0]})


def make_tool(name: str, limits: ToolLimits | None = None) -> Tool:
    """A new instance of the tool ``name`` (with its default limits unless given)."""
    cls = _BUILTIN.get(name) or _plugins()[0].get(name)
    if cls is not None:
        return cls(limits)
    problem = _plugins()[1].get(name)
    if problem is not None:
        raise UnknownTool(problem)
    known = tool_names()
    raise UnknownTool(
        f"unknown tool {name!r}{did_you_mean(name, known)} (known tools: {', '.join(known)})"
    )
