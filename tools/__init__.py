"""Tools agents call: the interface (:mod:`.base`), the registry with its plugin entry
points (:mod:`.registry`), the workspace projection the file tools act on
(:mod:`.workspace`), and the built-in tools: ``calculator``, ``python``, the coding tools
(``view_file``, ``create_file``, ``edit_file``, ``search_code``, ``search_files``,
``execute_bash``, ``run_tests``), the kernel tools (``compile_kernel``,
``check_kernel``, ``time_kernel``) and the analysis tools (``roofline``,
``profile_kernel``, ``dsl_notes``). Importing the package registers the built-in tools."""

from kernelflow.tools import analysis, calculator, coding, kernel, sandboxed
from kernelflow.tools.base import (
    TEXT,
    Tool,
    ToolContext,
    ToolError,
    ToolLimits,
    ToolOutcome,
    argument_errors,
    arguments,
    run_tool,
    truncate,
)
from kernelflow.tools.registry import (
    ENTRY_POINT_GROUP,
    UnknownTool,
    make_tool,
    register_tool,
    tool_names,
)
from kernelflow.tools.sandboxed import CommandResult, run_sandboxed
from kernelflow.tools.workspace import check_path, materialise, workspace_files

__all__ = [
    "ENTRY_POINT_GROUP",
    "TEXT",
    "CommandResult",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolLimits",
    "ToolOutcome",
    "UnknownTool",
    "analysis",
    "argument_errors",
    "arguments",
    "calculator",
    "check_path",
    "coding",
    "kernel",
    "make_tool",
    "materialise",
    "register_tool",
    "run_sandboxed",
    "run_tool",
    "sandboxed",
    "tool_names",
    "truncate",
    "workspace_files",
]
