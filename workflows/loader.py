"""Load and validate workflow YAML (seed 001's format).

Errors name the source, the key path and the problem, e.g.
``my.yaml: agent_info.coder.possible_next_agent[1]: unknown agent 'verifer'``.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kernelflow.workflows.model import (
    DEFAULT_AGENT_KIND,
    FINISH,
    VERIFIER,
    AgentSpec,
    OutputField,
    SequenceLimit,
    Workflow,
)

_AGENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_agent_name(name: object) -> bool:
    """Whether ``name`` can name an agent: it becomes a NATS subject token and part of a
    consumer's name (letters, digits, '_' and '-'), and is not the workflow's end."""
    return isinstance(name, str) and bool(_AGENT_NAME.match(name)) and name != FINISH


_FIELD_TYPES = {"str", "int", "float", "bool", "list", "dict"}
_TOOL_LIMIT_KEYS = {"timeout_s", "max_output_chars", "calls_per_minute", "memory_mb"}
_TOP_KEYS = {"agent_info", "start_agent", "mandatory_llm_analysis", "limitation_info"}

# libyaml's loader where PyYAML was built with it: the same safe subset, ~8x faster (every
# submitted task parses its workflow).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class WorkflowError(ValueError):
    pass


def available_workflows() -> list[str]:
    return sorted(_predefined())


@cache
def _predefined() -> dict[str, str]:
    """The predefined workflows' texts by name: package data, read once (every submitted
    task names one)."""
    root = resources.files("kernelflow.workflows")
    return {
        p.name[: -len(".yaml")]: p.read_text("utf-8")
        for p in root.iterdir()
        if p.name.endswith(".yaml")
    }


def resolve_workflow(name_or_path: str) -> tuple[str, str]:
    """Return ``(name, yaml_text)`` for a predefined workflow name or a YAML file path."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        try:
            return path.stem, path.read_text(encoding="utf-8")
        except OSError as exc:
            raise WorkflowError(f"{name_or_path}: cannot read workflow file: {exc}") from exc
    if name_or_path in _predefined():
        return name_or_path, _predefined()[name_or_path]
    raise WorkflowError(
        f"unknown workflow {name_or_path!r}; available: {', '.join(available_workflows())} "
        "(or give the path of a .yaml file)"
    )


def parse_workflow(text: str, name: str, source: str | None = None) -> Workflow:
    source = source or name
    try:
        doc = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise WorkflowError(f"{source}: not valid YAML: {exc}") from exc
    return _Validator(source).workflow(doc, name)


def load_workflow(name_or_path: str) -> tuple[Workflow, str]:
    name, text = resolve_workflow(name_or_path)
    return parse_workflow(text, name, source=name_or_path), text


class _Validator:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, path: str, problem: str) -> WorkflowError:
        return WorkflowError(f"{self.source}: {path}: {problem}")

    def mapping(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(path, f"must be a mapping, got {type(value).__name__}")
        return value

    def name_list(self, value: Any, path: str) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(path, "must be a list of agent names")
        return value

    def positive_int(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(path, f"must be a positive integer, got {value!r}")
        return value

    def known_keys(self, doc: dict[str, Any], path: str, allowed: set[str]) -> None:
        # A misspelt key would otherwise be ignored silently and its limit never applied.
        for key in doc:
            if key not in allowed:
                where = f"{path}.{key}" if path else str(key)
                raise self.fail(where, f"unknown key; expected one of {', '.join(sorted(allowed))}")

    def workflow(self, doc: Any, name: str) -> Workflow:
        doc = self.mapping(doc, "(document)")
        self.known_keys(doc, "", _TOP_KEYS)
        for key in ("agent_info", "start_agent", "limitation_info"):
            if key not in doc:
                raise self.fail(key, "missing required key")
        agents_doc = self.mapping(doc["agent_info"], "agent_info")
        if not agents_doc:
            raise self.fail("agent_info", "defines no agents")
        for agent in agents_doc:
            if not is_agent_name(agent):
                raise self.fail(
                    f"agent_info.{agent}",
                    f"agent names use letters, digits, '_' and '-' and may not be {FINISH!r}",
                )
        agents = {a: self.agent(a, spec, set(agents_doc)) for a, spec in agents_doc.items()}

        start = doc["start_agent"]
        if start not in agents:
            raise self.fail("start_agent", f"{start!r} is not defined in agent_info")
        mandatory = self.name_list(
            doc.get("mandatory_llm_analysis") or [], "mandatory_llm_analysis"
        )
        for i, agent in enumerate(mandatory):
            if agent not in agents:
                raise self.fail(f"mandatory_llm_analysis[{i}]", f"unknown agent {agent!r}")

        limits = self.mapping(doc["limitation_info"], "limitation_info")
        self.known_keys(limits, "limitation_info", {"required", "optional"})
        required = self.mapping(limits.get("required"), "limitation_info.required")
        if "max_step" not in required:
            raise self.fail("limitation_info.required.max_step", "missing required key")
        max_step = self.positive_int(required["max_step"], "limitation_info.required.max_step")
        optional = self.mapping(limits.get("optional") or {}, "limitation_info.optional")
        repeat = self.mapping(
            optional.get("repeat_limits") or {}, "limitation_info.optional.repeat_limits"
        )
        base = "limitation_info.optional.repeat_limits"
        single = self.mapping(repeat.get("single_agent") or {}, f"{base}.single_agent")
        single_limits = {}
        for agent, limit in single.items():
            if agent not in agents:
                raise self.fail(f"{base}.single_agent.{agent}", f"unknown agent {agent!r}")
            single_limits[agent] = self.positive_int(limit, f"{base}.single_agent.{agent}")
        sequences = []
        for seq_name, seq in self.mapping(
            repeat.get("sequences") or {}, f"{base}.sequences"
        ).items():
            path = f"{base}.sequences.{seq_name}"
            seq = self.mapping(seq, path)
            pattern = self.name_list(seq.get("pattern"), f"{path}.pattern")
            if not pattern:
                raise self.fail(f"{path}.pattern", "must name at least one agent")
            for i, agent in enumerate(pattern):
                if agent not in agents:
                    raise self.fail(f"{path}.pattern[{i}]", f"unknown agent {agent!r}")
            if "max_repeats" not in seq:
                raise self.fail(f"{path}.max_repeats", "missing required key")
            max_repeats = self.positive_int(seq["max_repeats"], f"{path}.max_repeats")
            sequences.append(SequenceLimit(str(seq_name), tuple(pattern), max_repeats))

        return Workflow(
            name=name,
            agents=agents,
            start_agent=start,
            max_step=max_step,
            mandatory_llm_analysis=frozenset(mandatory),
            single_agent_limits=single_limits,
            sequences=tuple(sequences),
        )

    def agent(self, agent: str, spec: Any, known: set[str]) -> AgentSpec:
        path = f"agent_info.{agent}"
        spec = self.mapping(spec if spec is not None else {}, path)
        allowed = {"possible_next_agent", "output_format"}
        if agent != VERIFIER:
            allowed |= {"agent_kind", "tools", "agent_config", "prompt"}
        self.known_keys(spec, path, allowed)
        nexts = self.name_list(spec.get("possible_next_agent") or [], f"{path}.possible_next_agent")
        for i, nxt in enumerate(nexts):
            if nxt != FINISH and nxt not in known:
                raise self.fail(f"{path}.possible_next_agent[{i}]", f"unknown agent {nxt!r}")
        output_format = spec.get("output_format")
        if output_format is None:
            if agent != VERIFIER:
                # Every agent but the verifier is an LLM agent whose answer must be parsed.
                raise self.fail(f"{path}.output_format", "missing (only 'verifier' has none)")
            return AgentSpec(agent, tuple(nexts))
        kind = spec.get("agent_kind", DEFAULT_AGENT_KIND)
        if not isinstance(kind, str) or not _AGENT_NAME.match(kind):
            raise self.fail(f"{path}.agent_kind", f"must be an agent kind's name, got {kind!r}")
        tools, tool_limits = self.tools(spec.get("tools") or [], f"{path}.tools")
        config = self.mapping(spec.get("agent_config") or {}, f"{path}.agent_config")
        prompt = self.mapping(spec.get("prompt") or {}, f"{path}.prompt")
        self.known_keys(prompt, f"{path}.prompt", {"system", "user"})
        for key, text in prompt.items():
            if not isinstance(text, str) or not text.strip():
                raise self.fail(f"{path}.prompt.{key}", "must be a non-empty template text")
        fmt_path = f"{path}.output_format"
        output_format = self.mapping(output_format, fmt_path)
        parser_name = output_format.get("parser_name")
        if parser_name is not None and not isinstance(parser_name, str):
            raise self.fail(f"{fmt_path}.parser_name", "must be a string")
        definition = self.mapping(
            output_format.get("parser_definition") or {}, f"{fmt_path}.parser_definition"
        )
        fields_path = f"{fmt_path}.parser_definition.output_fields"
        fields_doc = self.mapping(definition.get("output_fields"), fields_path)
        fields = []
        for field_name, fdoc in fields_doc.items():
            fpath = f"{fields_path}.{field_name}"
            fdoc = self.mapping(fdoc, fpath)
            ftype = fdoc.get("field_type", "str")
            if ftype not in _FIELD_TYPES:
                raise self.fail(
                    f"{fpath}.field_type",
                    f"unknown type {ftype!r}; one of {', '.join(sorted(_FIELD_TYPES))}",
                )
            mandatory = fdoc.get("mandatory", False)
            if not isinstance(mandatory, bool):
                raise self.fail(f"{fpath}.mandatory", "must be true or false")
            description = fdoc.get("field_description", "")
            fields.append(OutputField(str(field_name), ftype, mandatory, str(description)))
        return AgentSpec(
            agent,
            tuple(nexts),
            parser_name,
            tuple(fields),
            kind,
            tuple(tools),
            dict(config),
            tool_limits,
            dict(prompt),
        )

    def tools(self, value: Any, path: str) -> tuple[list[str], dict[str, dict[str, Any]]]:
        """Tool names, each optionally with limit overrides: ``- name`` or
        ``- name: {timeout_s: 5, max_output_chars: 2000, calls_per_minute: 10}``."""
        if not isinstance(value, list):
            raise self.fail(path, "must be a list of tool names")
        names: list[str] = []
        limits: dict[str, dict[str, Any]] = {}
        for i, item in enumerate(value):
            if isinstance(item, dict) and len(item) == 1:
                name, overrides = next(iter(item.items()))
                overrides = self.mapping(overrides or {}, f"{path}[{i}].{name}")
                unknown = set(overrides) - _TOOL_LIMIT_KEYS
                if unknown:
                    raise self.fail(
                        f"{path}[{i}].{name}.{sorted(unknown)[0]}",
                        f"unknown key; expected one of {', '.join(sorted(_TOOL_LIMIT_KEYS))}",
                    )
                for key, v in overrides.items():
                    wanted = float if key == "timeout_s" else int
                    if isinstance(v, bool) or not isinstance(v, wanted | int) or v <= 0:
                        kind = "number" if wanted is float else "integer"
                        raise self.fail(f"{path}[{i}].{name}.{key}", f"must be a positive {kind}")
                limits[str(name)] = dict(overrides)
                item = name
            if not isinstance(item, str) or not item:
                raise self.fail(f"{path}[{i}]", "must be a tool name or {name: {limits}}")
            if item in names:
                raise self.fail(f"{path}[{i}]", f"tool {item!r} is listed twice")
            names.append(item)
        return names, limits
