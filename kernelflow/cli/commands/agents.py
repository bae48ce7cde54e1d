"""``kernelflow agents``: the agent kinds, tools and kernel backends this installation has
(built-in and plugins), with each kind's settings and each tool's parameters and limits."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from kernelflow.actors.kinds import agent_kind, agent_kinds, plugin_errors
from kernelflow.host.settings import Settings
from kernelflow.tools import make_tool, tool_names
from kernelflow.verification.backends import backend, backend_names
from kernelflow.verification.backends import plugin_errors as backend_plugin_errors


def catalogue() -> dict[str, Any]:
    kinds = {}
    for name in agent_kinds():
        cls = agent_kind(name)
        settings = {f.name: f.default for f in msgspec.structs.fields(cls.config_type)}
        doc = cls.__doc__ or sys.modules[cls.__module__].__doc__ or ""
        kinds[name] = {
            "doc": doc.strip().splitlines()[0] if doc.strip() else "",
            "uses_tools": cls.uses_tools,
            "agent_config": settings,
        }
    tools = {}
    for name in tool_names():
        tool = make_tool(name)
        tools[name] = {**tool.spec(), "limits": msgspec.to_builtins(tool.limits)}
    backends = {
        name: {
            "title": backend(name).title,
            "needs_gpu": backend(name).needs_gpu,
            "extra_imports": list(backend(name).extra_imports),
        }
        for name in backend_names()
    }
    return {
        "agent_kinds": kinds,
        "tools": tools,
        "backends": backends,
        "plugin_errors": plugin_errors() + backend_plugin_errors(),
    }


def cmd_agents(args: argparse.Namespace, settings: Settings) -> int:
    info = catalogue()
    if args.json:
        print(json.dumps(info, default=str))
        return 0
    print("agent kinds (workflow key agent_kind; settings under agent_config):")
    for name, kind in info["agent_kinds"].items():
        config = ", ".join(f"{k}={v!r}" for k, v in kind["agent_config"].items()) or "-"
        print(f"  {name:<8} {config}")
    print("\ntools (workflow key tools; limits may be overridden per agent):")
    for name, tool in info["tools"].items():
        params = tool["parameters"].get("properties", {})
        required = set(tool["parameters"].get("required", []))
        args_text = ", ".join(p if p in required else f"{p}?" for p in params)
        print(f"  {name}({args_text}): {tool['description']}")
        limits = tool["limits"]
        print(f"      limits: {', '.join(f'{k}={v}' for k, v in limits.items() if v is not None)}")
    print("\nkernel backends (task key backend; --backend):")
    for name, found in info["backends"].items():
        where = "GPU only" if found["needs_gpu"] else "CPU and GPU"
        print(f"  {name:<8} {found['title']} ({where})")
    for problem in info["plugin_errors"]:
        print(f"warning: {problem}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "agents", help="list agent kinds, tools and kernel backends (built-in and plugins)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_agents)
