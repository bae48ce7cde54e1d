"""Check a workflow document (docs/workflows.md, "The file") and build its ``Workflow``.

Every problem is collected, not only the first, each under its key path
(``agent_info.coder.output_format.parser_definition.output_fields.code.mandatry``); a
misspelt key gets a "did you mean". Beyond types and required keys: unknown keys anywhere
(a misspelt limit would otherwise be ignored and never applied), references to agents
that do not exist, and the graph: every agent reachable from ``start_agent``, a way to
``finish`` from every agent, an agent handing over to the verifier that produces code.

This module knows nothing of YAML: ``kernelflow.workflows.loader`` reads the text, adds
duplicate keys and line numbers, and raises ``WorkflowError`` with the whole list.
"""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from kernelflow.workflows.model import (
    CODE_FIELD,
    DEFAULT_AGENT_KIND,
    FINISH,
    VERIFIER,
    AgentSpec,
    OutputField,
    SequenceLimit,
    Workflow,
)

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

TOP_KEYS = ("agent_info", "start_agent", "mandatory_llm_analysis", "limitation_info")
VERIFIER_KEYS = ("possible_next_agent",)
LLM_AGENT_KEYS = (
    "possible_next_agent",
    "output_format",
    "agent_kind",
    "tools",
    "agent_config",
    "prompt",
)
OUTPUT_FORMAT_KEYS = ("parser_name", "parser_definition")
FIELD_KEYS = ("field_type", "mandatory", "field_description")
FIELD_TYPES = ("str", "int", "float", "bool", "list", "dict")
TOOL_LIMIT_KEYS = ("timeout_s", "max_output_chars", "calls_per_minute", "memory_mb")
_NO_FIELDS_HINT = (
    "declare parser_definition.output_fields, or leave output_format out for a free-text answer"
)


def is_agent_name(name: object) -> bool:
    """Whether ``name`` can name an agent: it becomes a NATS subject token and part of a
    consumer's name (letters, digits, '_' and '-'), and is not the workflow's end."""
    return isinstance(name, str) and bool(_NAME.match(name)) and name != FINISH


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a workflow document, at ``path``."""

    path: str
    message: str
    # A mistake leaves a workflow that can still be built (an ignored key, a duplicate, an
    # agent nothing reaches): refused when submitted, tolerated in a workflow a task
    # recorded under older, laxer rules. Any other problem leaves nothing to build.
    mistake: bool = False
    line: int | None = None


def check_document(doc: Any, name: str) -> tuple[Workflow | None, list[Problem]]:
    """The workflow ``doc`` describes (None where a problem that is not a mistake leaves
    nothing to build), and every problem found in it."""
    checker = _Checker()
    workflow = checker.workflow(doc, name)
    return workflow, checker.problems


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for a near miss of one of ``choices``, else nothing."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_YAML_KINDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}
# Shows a value in a problem without walking all of it: a document's aliases can make a
# small text a huge (or self-containing) value.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxdict = 2, 4, 4
_SHORT_REPR.maxstring, _SHORT_REPR.maxother = 40, 40


def _shown(value: Any) -> str:
    """``value`` as a problem describes it: its YAML kind, then the value, shortened."""
    if value is None:
        return "nothing"
    return f"{_YAML_KINDS.get(type(value), type(value).__name__)} {_SHORT_REPR.repr(value)}"


def _child(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class _Checker:
    """Walks a document, collecting problems. Each method that checks a value returns
    it (converted where needed), or None where it is unusable: a problem then says why."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.unusable = 0  # problems that are not mistakes, so far

    def broken(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))
        self.unusable += 1

    def mistake(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, mistake=True))

    # ------------------------------------------------------------------ value checks

    def mapping(self, value: Any, path: str, *, empty_ok: bool = True) -> dict[Any, Any] | None:
        """A mapping; a key given no value (``optional:``) counts as an empty one."""
        if value is None and empty_ok:
            return {}
        if not isinstance(value, dict):
            self.broken(path, f"must be a mapping, got {_shown(value)}")
            return None
        return value

    def known_keys(self, doc: dict[Any, Any], path: str, allowed: Collection[str]) -> None:
        for key in doc:
            if key not in allowed:
                hint = did_you_mean(key, allowed) or f" (expected one of {', '.join(allowed)})"
                self.mistake(_child(path, key), f"unknown key{hint}")

    def required(self, doc: dict[Any, Any], key: str, path: str) -> Any:
        """``doc[key]``; None, and a problem, where it is missing or given no value."""
        if key not in doc:
            self.broken(_child(path, key), "missing required key")
        elif doc[key] is None:
            self.broken(_child(path, key), "required, but given no value")
        return doc.get(key)

    def positive_int(self, value: Any, path: str) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        quoted = isinstance(value, str) and value.strip().lstrip("+-").isdigit()
        hint = " (write the number without quotes)" if quoted else ""
        self.broken(path, f"must be a positive integer, got {_shown(value)}{hint}")
        return None

    def agent_names(
        self, value: Any, path: str, known: Collection[str] | None, *, finish_ok: bool = False
    ) -> list[str] | None:
        """A list of agent names, each defined (or ``finish`` where ``finish_ok``)."""
        if value is None:
            return []
        if not isinstance(value, list):
            hint = f" (write [{value}])" if isinstance(value, str) else ""
            self.broken(path, f"must be a list of agent names, got {_shown(value)}{hint}")
            return None
        names: list[str] = []
        usable = True
        for i, item in enumerate(value):
            name = self.agent_name(item, f"{path}[{i}]", known, finish_ok=finish_ok)
            if name is None:
                usable = False
            elif name in names:
                self.mistake(f"{path}[{i}]", f"{name!r} is listed twice")
            else:
                names.append(name)
        return names if usable else None

    def agent_name(
        self, value: Any, path: str, known: Collection[str] | None, *, finish_ok: bool = False
    ) -> str | None:
        if not isinstance(value, str):
            self.broken(path, f"must be an agent's name, got {_shown(value)}")
            return None
        if known is None:
            return value  # agent_info is unusable: nothing to check the name against
        choices = [*known, FINISH] if finish_ok else list(known)
        if value not in choices:
            self.broken(path, f"unknown agent {value!r}{did_you_mean(value, choices)}")
            return None
        return value

    # ------------------------------------------------------------------ the document

    def workflow(self, doc: Any, name: str) -> Workflow | None:
        if doc is None:
            self.broken("(document)", "the workflow is empty")
            return None
        doc = self.mapping(doc, "(document)", empty_ok=False)
        if doc is None:
            return None
        self.known_keys(doc, "", TOP_KEYS)
        agents_doc = self.agent_info(self.required(doc, "agent_info", ""))
        # The names agent_info defines, for checking references (None: unknown, so
        # references go unchecked rather than all reported as unknown).
        known = None
        agents = None
        if agents_doc is not None:
            known = [a for a in agents_doc if is_agent_name(a)]
            built = {a: self.agent(a, agents_doc[a], known) for a in known}
            agents = {a: spec for a, spec in built.items() if spec is not None}
        # The graph is checked only where every agent could be built: else it would report
        # the consequences of problems already listed.
        graph_sound = agents is not None and self.unusable == 0
        start = self.start_agent(self.required(doc, "start_agent", ""), known)
        mandatory = self.agent_names(
            doc.get("mandatory_llm_analysis"), "mandatory_llm_analysis", known
        )
        limits = self.limits(self.required(doc, "limitation_info", ""), known)
        if agents is not None and graph_sound:
            self.graph(agents, start)
        if self.unusable or agents is None or start is None or mandatory is None or not limits:
            return None
        max_step, single_agent_limits, sequences = limits
        return Workflow(
            name=name,
            agents=agents,
            start_agent=start,
            max_step=max_step,
            mandatory_llm_analysis=frozenset(mandatory),
            single_agent_limits=single_agent_limits,
            sequences=sequences,
        )

    def start_agent(self, value: Any, known: list[str] | None) -> str | None:
        if value is None:
            return None  # missing: already said
        if not isinstance(value, str):
            named = isinstance(value, list) and value and isinstance(value[0], str)
            hint = f" (write start_agent: {value[0]})" if named else ""
            self.broken("start_agent", f"must be one agent's name, got {_shown(value)}{hint}")
            return None
        if known is not None and value not in known:
            self.broken(
                "start_agent",
                f"{value!r} is not defined in agent_info{did_you_mean(value, known)}",
            )
            return None
        return value

    def agent_info(self, value: Any) -> dict[Any, Any] | None:
        """``agent_info`` with its names checked; None where it is missing or unusable."""
        if value is None:
            return None  # missing: already said
        doc = self.mapping(value, "agent_info", empty_ok=False)
        if doc is None:
            return None
        if not doc:
            self.broken("agent_info", "defines no agents")
            return None
        for agent in doc:
            if not is_agent_name(agent):
                self.broken(
                    _child("agent_info", agent),
                    f"agent names use letters, digits, '_' and '-' and may not be {FINISH!r}",
                )
        return doc

    def agent(self, agent: str, value: Any, known: list[str]) -> AgentSpec | None:
        path = f"agent_info.{agent}"
        doc = self.mapping(value, path)  # a bare ``verifier:`` entry leads nowhere
        if doc is None:
            return None
        if agent == VERIFIER:
            for key in doc:
                if key in LLM_AGENT_KEYS and key not in VERIFIER_KEYS:
                    self.mistake(
                        f"{path}.{key}",
                        "the verifier is a program, not an LLM agent: its result is its "
                        "report, and it takes only possible_next_agent",
                    )
            others = {k: v for k, v in doc.items() if k not in LLM_AGENT_KEYS}
            self.known_keys(others, path, VERIFIER_KEYS)
        else:
            self.known_keys(doc, path, LLM_AGENT_KEYS)
        nexts = self.agent_names(
            doc.get("possible_next_agent"), f"{path}.possible_next_agent", known, finish_ok=True
        )
        if agent == VERIFIER:
            return AgentSpec(agent, tuple(nexts)) if nexts is not None else None
        kind = doc.get("agent_kind", DEFAULT_AGENT_KIND)
        kind_ok = isinstance(kind, str) and bool(_NAME.match(kind))
        if not kind_ok:
            self.broken(f"{path}.agent_kind", f"must be an agent kind's name, got {_shown(kind)}")
        tools = self.tools(doc.get("tools"), f"{path}.tools")
        config = self.mapping(doc.get("agent_config"), f"{path}.agent_config")
        prompt = self.prompt(doc.get("prompt"), f"{path}.prompt")
        output = self.output_format(doc, path)
        if (
            nexts is None
            or not kind_ok
            or tools is None
            or config is None
            or prompt is None
            or output is None
        ):
            return None
        parser_name, fields = output
        names, limits = tools
        return AgentSpec(
            agent,
            tuple(nexts),
            parser_name,
            fields,
            kind,
            tuple(names),
            dict(config),
            limits,
            prompt,
        )

    def prompt(self, value: Any, path: str) -> dict[str, str] | None:
        doc = self.mapping(value, path)
        if doc is None:
            return None
        self.known_keys(doc, path, ("system", "user"))
        templates = {}
        for key in ("system", "user"):
            if key not in doc:
                continue
            text = doc[key]
            if isinstance(text, str) and text.strip():
                templates[key] = text
            else:
                self.broken(f"{path}.{key}", "must be a non-empty template text")
        return templates

    def output_format(
        self, doc: dict[Any, Any], path: str
    ) -> tuple[str | None, tuple[OutputField, ...]] | None:
        """``(parser_name, fields)``; no fields for an agent without ``output_format``,
        which answers in free text (docs/workflows.md, "output_format"; see parsing.py)."""
        if "output_format" not in doc:
            return None, ()
        fmt_path = f"{path}.output_format"
        if doc["output_format"] in (None, {}):  # ``output_format:`` or ``output_format: {}``
            self.mistake(fmt_path, f"is empty: {_NO_FIELDS_HINT}")
            return None, ()
        fmt = self.mapping(doc["output_format"], fmt_path)
        if fmt is None:
            return None
        self.known_keys(fmt, fmt_path, OUTPUT_FORMAT_KEYS)
        parser_name = fmt.get("parser_name")
        if parser_name is not None and not isinstance(parser_name, str):
            self.broken(f"{fmt_path}.parser_name", f"must be a string, got {_shown(parser_name)}")
            return None
        def_path = f"{fmt_path}.parser_definition"
        definition = self.mapping(fmt.get("parser_definition"), def_path)
        if definition is None:
            return None
        self.known_keys(definition, def_path, ("output_fields",))
        fields_path = f"{def_path}.output_fields"
        fields_doc = self.mapping(definition.get("output_fields"), fields_path)
        if fields_doc is None:
            return None
        if not fields_doc:
            # Taken as a free-text answer, but surely not what the author meant.
            self.mistake(fields_path, f"no fields declared: {_NO_FIELDS_HINT}")
        fields = [self.output_field(n, f, _child(fields_path, n)) for n, f in fields_doc.items()]
        if None in fields:
            return None
        return parser_name, tuple(f for f in fields if f is not None)

    def output_field(self, name: Any, value: Any, path: str) -> OutputField | None:
        doc = self.mapping(value, path, empty_ok=False)
        if doc is None:
            return None
        self.known_keys(doc, path, FIELD_KEYS)
        field_type = doc.get("field_type", "str")
        if field_type not in FIELD_TYPES:
            self.broken(
                f"{path}.field_type",
                f"unknown type {_shown(field_type)}{did_you_mean(field_type, FIELD_TYPES)} "
                f"(one of {', '.join(FIELD_TYPES)})",
            )
        mandatory = doc.get("mandatory", False)
        if not isinstance(mandatory, bool):
            self.broken(f"{path}.mandatory", f"must be true or false, got {_shown(mandatory)}")
        description = doc.get("field_description", "")
        if not isinstance(description, str):
            self.mistake(f"{path}.field_description", f"must be text, got {_shown(description)}")
            description = ""
        if field_type not in FIELD_TYPES or not isinstance(mandatory, bool):
            return None
        return OutputField(str(name), field_type, mandatory, description)

    def tools(self, value: Any, path: str) -> tuple[list[str], dict[str, dict[str, Any]]] | None:
        """Tool names, each optionally with limit overrides: ``- name`` or
        ``- name: {timeout_s: 5, max_output_chars: 2000, calls_per_minute: 10}``."""
        if value is None:
            return [], {}
        if not isinstance(value, list):
            self.broken(path, f"must be a list of tool names, got {_shown(value)}")
            return None
        names: list[str] = []
        limits: dict[str, dict[str, Any]] = {}
        usable = True
        for i, item in enumerate(value):
            name = item
            if isinstance(item, dict) and len(item) == 1:
                name, overrides = next(iter(item.items()))
                checked = self.tool_limits(overrides, f"{path}[{i}].{name}")
                if checked is None:
                    usable = False
                elif isinstance(name, str):
                    limits[name] = checked
            if not isinstance(name, str) or not name:
                self.broken(f"{path}[{i}]", "must be a tool name or {name: {limits}}")
                usable = False
            elif name in names:
                self.broken(f"{path}[{i}]", f"tool {name!r} is listed twice")
                usable = False
            else:
                names.append(name)
        return (names, limits) if usable else None

    def tool_limits(self, value: Any, path: str) -> dict[str, Any] | None:
        overrides = self.mapping(value, path)
        if overrides is None:
            return None
        self.known_keys(overrides, path, TOOL_LIMIT_KEYS)
        usable = True
        for key, limit in overrides.items():
            if key not in TOOL_LIMIT_KEYS:
                continue
            wanted = float if key == "timeout_s" else int
            if isinstance(limit, bool) or not isinstance(limit, wanted | int) or limit <= 0:
                kind = "number" if wanted is float else "integer"
                self.broken(f"{path}.{key}", f"must be a positive {kind}, got {_shown(limit)}")
                usable = False
        return {k: v for k, v in overrides.items() if k in TOOL_LIMIT_KEYS} if usable else None

    # ------------------------------------------------------------------ limits

    def limits(
        self, value: Any, known: list[str] | None
    ) -> tuple[int, dict[str, int], tuple[SequenceLimit, ...]] | None:
        """``(max_step, single_agent limits, sequences)`` from ``limitation_info``."""
        if value is None:
            return None  # missing: already said
        path = "limitation_info"
        limits = self.mapping(value, path, empty_ok=False)
        if limits is None:
            return None
        self.known_keys(limits, path, ("required", "optional"))
        required = self.required(limits, "required", path)
        if required is not None:
            required = self.mapping(required, f"{path}.required")
        max_step = None
        if required is not None:
            self.known_keys(required, f"{path}.required", ("max_step",))
            if "max_step" in required:
                max_step = self.positive_int(required["max_step"], f"{path}.required.max_step")
            else:
                self.broken(f"{path}.required.max_step", "missing required key")
        optional = self.mapping(limits.get("optional"), f"{path}.optional")
        repeat_path = f"{path}.optional.repeat_limits"
        repeat = None
        if optional is not None:
            self.known_keys(optional, f"{path}.optional", ("repeat_limits",))
            repeat = self.mapping(optional.get("repeat_limits"), repeat_path)
        if repeat is None:
            return None
        self.known_keys(repeat, repeat_path, ("single_agent", "sequences"))
        single = self.single_agent_limits(repeat.get("single_agent"), repeat_path, known)
        sequences = self.sequences(repeat.get("sequences"), repeat_path, known)
        if max_step is None or single is None or sequences is None:
            return None
        return max_step, single, sequences

    def single_agent_limits(
        self, value: Any, repeat_path: str, known: list[str] | None
    ) -> dict[str, int] | None:
        path = f"{repeat_path}.single_agent"
        doc = self.mapping(value, path)
        if doc is None:
            return None
        limits: dict[str, int] = {}
        usable = True
        for agent, limit in doc.items():
            at = _child(path, agent)
            if known is not None and agent not in known:
                self.broken(at, f"unknown agent {agent!r}{did_you_mean(agent, known)}")
                usable = False
                continue
            checked = self.positive_int(limit, at)
            if checked is None:
                usable = False
            else:
                limits[agent] = checked
        return limits if usable else None

    def sequences(
        self, value: Any, repeat_path: str, known: list[str] | None
    ) -> tuple[SequenceLimit, ...] | None:
        path = f"{repeat_path}.sequences"
        doc = self.mapping(value, path)
        if doc is None:
            return None
        sequences = []
        usable = True
        for name, seq_doc in doc.items():
            seq_path = _child(path, name)
            seq = self.mapping(seq_doc, seq_path, empty_ok=False)
            if seq is None:
                usable = False
                continue
            self.known_keys(seq, seq_path, ("pattern", "max_repeats"))
            pattern = self.pattern(self.required(seq, "pattern", seq_path), seq_path, known)
            max_repeats = None
            if "max_repeats" in seq:
                max_repeats = self.positive_int(seq["max_repeats"], f"{seq_path}.max_repeats")
            else:
                self.broken(f"{seq_path}.max_repeats", "missing required key")
            if pattern is None or max_repeats is None:
                usable = False
            else:
                sequences.append(SequenceLimit(str(name), tuple(pattern), max_repeats))
        return tuple(sequences) if usable else None

    def pattern(self, value: Any, seq_path: str, known: list[str] | None) -> list[str] | None:
        if value is None:
            return None  # missing: already said
        path = f"{seq_path}.pattern"
        if not isinstance(value, list):
            self.broken(path, f"must be a list of agent names, got {_shown(value)}")
            return None
        if not value:
            self.broken(path, "must name at least one agent")
            return None
        # Unlike a list of options, a pattern may name an agent twice ([coder, coder]).
        names = [self.agent_name(item, f"{path}[{i}]", known) for i, item in enumerate(value)]
        return [n for n in names if n is not None] if None not in names else None

    # ------------------------------------------------------------------ the graph

    def graph(self, agents: dict[str, AgentSpec], start: str | None) -> None:
        """Mistakes in how agents connect: agents nothing reaches, agents from which no
        path ends, hand-overs to the verifier from an agent that writes no code."""
        if start is not None:
            reached = _reachable([start], lambda a: agents[a].possible_next)
            for agent in agents:
                if agent not in reached:
                    self.mistake(
                        f"agent_info.{agent}",
                        f"no path from start_agent {start!r} reaches {agent!r}: name it in "
                        "some agent's possible_next_agent, or remove it",
                    )
        # An agent ends the task by handing over to finish or to no one; the verifier
        # too, whatever follows it: a passed verification may always finish.
        ends = [
            a
            for a, spec in agents.items()
            if a == VERIFIER or FINISH in spec.possible_next or not spec.possible_next
        ]
        before = {a: [b for b, spec in agents.items() if a in spec.possible_next] for a in agents}
        can_end = _reachable(ends, lambda a: before[a])
        for agent in agents:
            if agent not in can_end:
                loop = _reachable([agent], lambda a: agents[a].possible_next)
                self.mistake(
                    f"agent_info.{agent}.possible_next_agent",
                    f"no path from {agent!r} leads to {FINISH}: from there only "
                    f"{', '.join(sorted(loop))} can follow, and none of them ends the task",
                )
        for agent, spec in agents.items():
            if VERIFIER in spec.possible_next and spec.output_fields and not _writes_code(spec):
                declared = ", ".join(f.name for f in spec.output_fields)
                self.mistake(
                    f"agent_info.{agent}.output_format.parser_definition.output_fields",
                    f"{agent!r} hands over to the verifier, which checks a {CODE_FIELD!r} "
                    f"field (a string), but declares only: {declared}",
                )


def _writes_code(spec: AgentSpec) -> bool:
    return any(f.name == CODE_FIELD and f.field_type == "str" for f in spec.output_fields)


def _reachable(starts: Iterable[str], nexts: Callable[[str], Iterable[str]]) -> set[str]:
    """The agents reachable from ``starts`` (included) following ``nexts``."""
    seen: set[str] = set()
    stack = [a for a in starts if a != FINISH]
    while stack:
        agent = stack.pop()
        if agent in seen:
            continue
        seen.add(agent)
        stack.extend(a for a in nexts(agent) if a != FINISH and a not in seen)
    return seen
