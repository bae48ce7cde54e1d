"""Tools for AgenticRollout's agents (docs/agents.md, "AgenticRollout"): the interface
(``BaseTool``: a ``description``, its arguments as JSON Schema in ``parameters_schema``,
``async execute(**kwargs)``), kernelflow's calculator as one (``CalculatorTool``), and the
tools a verl-style ``tools_config`` names (``tools_from_config``).

Any object with an async ``execute(**kwargs)`` is a tool to an agent; ``BaseTool`` is the
base to start from. A tool that fails raises (``ToolExecutionError`` or anything else):
the agent's ``execute_tool_call`` turns that into an error step for the model to read.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from typing import Any

from kernelflow.tools.base import ToolError
from kernelflow.tools.calculator import Calculator, evaluate


class ToolExecutionError(Exception):
    """A tool could not do what it was asked; the message is what the model reads."""


class ToolConfigError(ValueError):
    """A ``tools_config`` entry that cannot be made into a tool."""


class BaseTool:
    """The tool interface (docs/agents.md, "The API"): ``BaseTool()`` is made as the
    document writes it;
    a tool overrides ``execute`` (the base's says it has no work to do)."""

    description: str = "Tool description"
    parameters_schema: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, **config: Any) -> None:
        self.config = config

    async def execute(self, **kwargs: Any) -> Any:
        """Do the work with these arguments; what the tool returns (raise
        ``ToolExecutionError`` for a failure the model should read)."""
        raise ToolExecutionError(f"{type(self).__name__} does not implement execute")


class CalculatorTool(BaseTool):
    """kernelflow's ``calculator`` (evaluated over a safe syntax tree, never ``eval``) as
    a tool: an ``expression``, or an ``operation`` (``add`` or ``multiply`` of
    ``operands``, ``factorial`` of ``n``). ``precision``: digits a float result is rounded
    to (none: kept whole)."""

    description = (
        Calculator.description + " Or give an operation: add or multiply operands, factorial of n."
    )
    parameters_schema = {
        "type": "object",
        "properties": {
            "expression": {"type": "string", "description": "e.g. '2 + 2' or 'sqrt(2) * pi'"},
            "operation": {"type": "string", "enum": ["add", "multiply", "factorial"]},
            "operands": {"type": "array", "items": {"type": "number"}},
            "n": {"type": "integer", "minimum": 0},
        },
        "additionalProperties": False,
    }

    def __init__(self, precision: int | None = None) -> None:
        super().__init__(precision=precision)
        self.precision = precision

    async def execute(
        self, expression: str | None = None, operation: str | None = None, **kwargs: Any
    ) -> int | float | bool:
        text = expression if expression is not None else _expression_of(operation, kwargs)
        try:
            value = evaluate(text)
        except ToolError as exc:
            raise ToolExecutionError(str(exc)) from None
        if self.precision is not None and isinstance(value, float):
            return round(value, self.precision)
        return value


def _expression_of(operation: str | None, args: Mapping[str, Any]) -> str:
    """The calculator expression of an ``operation`` call."""
    if operation == "factorial":
        return f"factorial({int(args.get('n', 1))})"
    operands = [float(x) for x in args.get("operands", ())]
    if operation in ("add", "multiply") and operands:
        return (" + " if operation == "add" else " * ").join(repr(x) for x in operands)
    raise ToolExecutionError(
        "give an expression, or an operation (add or multiply with operands, factorial with n)"
    )


def tools_from_config(tools_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The tools of a verl-style ``tools_config``: ``{"tools": [{"class_name":
    "package.module.Class", "config": {...}, "tool_schema": {"type": "function",
    "function": {"name", "description", "parameters"}}}]}``. Each class is made with its
    ``config`` as keyword arguments; the schema's name is the tool's name, and its
    description and parameters replace the tool's own. Raises ``ToolConfigError``."""
    if not tools_config:
        return {}
    entries = tools_config.get("tools", [])
    if not isinstance(entries, list):
        raise ToolConfigError("tools_config.tools: must be a list of tools")
    tools: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        where = f"tools_config.tools[{i}]"
        if not isinstance(entry, Mapping) or "class_name" not in entry:
            raise ToolConfigError(f"{where}: needs a class_name")
        cls = _imported(str(entry["class_name"]), where)
        try:
            tool = cls(**(entry.get("config") or {}))
        except TypeError as exc:
            raise ToolConfigError(f"{where}.config: {exc}") from None
        schema = entry.get("tool_schema") or {}
        function = schema.get("function", schema) if isinstance(schema, Mapping) else {}
        name = function.get("name") or _snake(cls.__name__)
        if function.get("description"):
            tool.description = function["description"]
        if function.get("parameters"):
            tool.parameters_schema = function["parameters"]
        if name in tools:
            raise ToolConfigError(f"{where}: a tool named {name!r} is already configured")
        tools[name] = tool
    return tools


class DaemonTool(BaseTool):
    """One of the tools a workflow gives an agent that a daemon runs, as the agent's code
    sees it: the daemon makes each call (with the tool's limits) and records it."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__()
        self.name = str(spec["name"])
        self.description = str(spec.get("description", ""))
        self.parameters_schema = dict(spec.get("parameters", {}))

    async def execute(self, **kwargs: Any) -> Any:
        raise ToolExecutionError(
            f"{self.name} is run by the daemon: call it from run_trajectory, through the agent"
        )


def _imported(class_name: str, where: str) -> type[Any]:
    module, _, attribute = class_name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ToolConfigError(f"{where}.class_name: cannot import {class_name!r}: {exc}") from None
    if not isinstance(found, type):
        raise ToolConfigError(f"{where}.class_name: {class_name!r} is not a class")
    return found


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Tool")).lower() or "tool"
