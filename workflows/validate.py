"""Check a workflow document (docs/workflows.md, "The file") and build its ``Workflow``.

Every problem is collected, not only the first, each under its key path
(``agent_info.coder.output_format.parser_definition.output_fields.code.mandatry``); a
misspelt key gets a "did you mean". Beyond types and required keys: unknown keys anywhere
(a misspelt limit would otherwise be ignored and never applied), references to agents
that do not exist (the verifier and ``finish`` are built in: named, never defined), the
field the verifier checks, and the graph: every agent reachable from ``start_agent``, a
way to ``finish`` from every agent.

This module knows nothing of YAML: ``kernelflow.workflows.loader`` reads the text, adds
duplicate keys and line numbers, and raises ``WorkflowError`` with the whole list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from kernelflow.workflows.checking import (
    NAME,
    Checker,
    Problem,
    child,
    did_you_mean,
    is_agent_name,
    shown,
)
from kernelflow.workflows.model import (
    CODE_FIELD,
    DEFAULT_AGENT_KIND,
    DEFAULT_TARGET_SOL,
    FINISH,
    TOOL_FIELD_TYPE,
    VERIFIER,
    AgentSpec,
    Improvement,
    OutputField,
    RouteBy,
    Workflow,
)

TOP_KEYS = (
    "agent_info",
    "start_agent",
    "mandatory_llm_analysis",
    "limitation_info",
    "trainable_agents",
    "rewards",
    "improve_after_pass",
)
IMPROVE_KEYS = ("target_sol_fraction",)
VERIFIER_KEYS = ("possible_next_agent",)
LLM_AGENT_KEYS = (
    "possible_next_agent",
    "output_format",
    "agent_kind",
    "tools",
    "agent_config",
    "prompt",
    "code_field",
    "route_by",
)
OUTPUT_FORMAT_KEYS = ("parser_name", "parser_definition")
FIELD_KEYS = ("field_type", "mandatory", "field_description")
FIELD_TYPES = ("str", "int", "float", "bool", "list", "dict", TOOL_FIELD_TYPE)
TOOL_LIMIT_KEYS = ("timeout_s", "max_output_chars", "calls_per_minute", "memory_mb")
_NO_FIELDS_HINT = (
    "declare parser_definition.output_fields, or leave output_format out for a free-text answer"
)
# A document given as text (a submit command's workflow_yaml) is recorded as it is, so it
# must not depend on another workflow that may change; kernelflow merges a file's base.
_BASE_IN_TEXT = (
    "only a workflow file may extend another (kernelflow merges it with its base when it "
    "reads the file); a workflow given as text must be whole"
)
_EXTEND_HINT = " (or extend a workflow that has one: base: default)"


def check_document(doc: Any, name: str) -> tuple[Workflow | None, list[Problem]]:
    """The workflow ``doc`` describes (None where a problem that is not a mistake leaves
    nothing to build), and every problem found in it."""
    checker = _Checker()
    workflow = checker.workflow(doc, name)
    return workflow, checker.problems


class _Checker(Checker):
    """Checks a whole document: its agents, their answers and tools, and the graph."""

    # ------------------------------------------------------------------ the document

    def workflow(self, doc: Any, name: str) -> Workflow | None:
        if doc is None:
            self.broken("(document)", "the workflow is empty")
            return None
        doc = self.mapping(doc, "(document)", empty_ok=False)
        if doc is None:
            return None
        if "base" in doc:
            self.broken("base", _BASE_IN_TEXT)
        self.known_keys({k: v for k, v in doc.items() if k != "base"}, "", TOP_KEYS)
        agents_doc = self.agent_info(self.required(doc, "agent_info", ""))
        # The names agent_info defines, and the built-in verifier, for checking references
        # (None: unknown, so references go unchecked rather than all reported as unknown).
        known = None
        agents = None
        if agents_doc is not None:
            defined = [a for a in agents_doc if is_agent_name(a)]
            known = defined if VERIFIER in defined else [*defined, VERIFIER]
            built = {a: self.agent(a, agents_doc[a], known) for a in defined}
            agents = {a: spec for a, spec in built.items() if spec is not None}
        # The graph is checked only where every agent could be built: else it would report
        # the consequences of problems already listed.
        graph_sound = agents is not None and self.unusable == 0
        start = self.start_agent(self.required(doc, "start_agent", ""), known)
        mandatory = self.agent_names(
            doc.get("mandatory_llm_analysis"), "mandatory_llm_analysis", known
        )
        limits = self.limits(self.required(doc, "limitation_info", "", _EXTEND_HINT), known)
        trainable = self.trainable(doc.get("trainable_agents"), agents_doc)
        rewards = self.rewards(doc.get("rewards"))
        improve = self.improvement(doc.get("improve_after_pass", False))
        if agents is not None:
            _add_built_in_verifier(agents, start)
            if graph_sound:
                self.graph(agents, start)
                self.tool_fields(agents)
                if improve:
                    self.improvable(agents)
        if (
            self.unusable
            or agents is None
            or start is None
            or mandatory is None
            or not limits
            or trainable is None
            or rewards is None
            or improve is None
        ):
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
            trainable_agents=frozenset(trainable) if trainable else None,
            rewards=tuple(rewards),
            improve=improve or None,
        )

    def tool_fields(self, agents: dict[str, AgentSpec]) -> None:
        """A ``tool`` field names one of the workflow's tools: a workflow without any
        could never parse it."""
        if any(spec.tools for spec in agents.values()):
            return
        for spec in agents.values():
            for f in spec.output_fields:
                if f.field_type == TOOL_FIELD_TYPE:
                    self.broken(
                        f"agent_info.{spec.name}.output_format.parser_definition."
                        f"output_fields.{f.name}.field_type",
                        "a tool field names one of the workflow's tools, and no agent here "
                        "has any: give the agent that runs them tools: [NAME, ...]",
                    )

    def trainable(self, value: Any, agents_doc: dict[Any, Any] | None) -> list[str] | None:
        """``trainable_agents``: the LLM agents whose turns are the policy's."""
        path = "trainable_agents"
        if value is None:
            return []
        if value == []:
            self.broken(path, "names no agent: leave it out to train every agent's turns")
            return None
        if isinstance(value, list) and VERIFIER in value:
            self.broken(
                f"{path}[{value.index(VERIFIER)}]",
                "the verifier is a program: it makes no LLM turns to train",
            )
            return None
        llm_agents = None if agents_doc is None else [a for a in agents_doc if a != VERIFIER]
        return self.agent_names(value, path, llm_agents)

    def improvement(self, value: Any) -> Improvement | Literal[False] | None:
        """``improve_after_pass``: ``true``, or ``{target_sol_fraction: F}`` with F in
        (0, 1]; ``false`` (or left out): a pass is final. None: broken."""
        path = "improve_after_pass"
        if value is True or value is False:
            return Improvement() if value else False
        doc = self.mapping(value, path)
        if doc is None:
            return None
        self.known_keys(doc, path, IMPROVE_KEYS)
        target = doc.get("target_sol_fraction", DEFAULT_TARGET_SOL)
        if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1:
            self.broken(
                f"{path}.target_sol_fraction",
                f"must be a fraction of speed-of-light above 0 and at most 1, got {shown(target)}",
            )
            return None
        return Improvement(target_sol_fraction=float(target))

    def improvable(self, agents: dict[str, AgentSpec]) -> None:
        """Improving after a pass sends the kernel back to its author: the verifier must
        list an agent besides ``finish``."""
        verifier = agents.get(VERIFIER)
        if verifier is not None and any(a != FINISH for a in verifier.possible_next):
            return
        self.broken(
            "improve_after_pass",
            "a passing kernel goes back to its author to be improved, and the verifier "
            "lists no agent: add the kernel's author to the verifier's possible_next_agent",
        )

    def rewards(self, value: Any) -> list[str] | None:
        """``rewards``: reward function names (checked against the registry on submission)."""
        if value is None:
            return []
        if not isinstance(value, list) or not value:
            self.broken("rewards", f"must be a list of reward function names, got {shown(value)}")
            return None
        usable = True
        for i, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                self.broken(f"rewards[{i}]", f"must be a reward function's name, got {shown(item)}")
                usable = False
        return [str(v).strip() for v in value] if usable else None

    def start_agent(self, value: Any, known: list[str] | None) -> str | None:
        if value is None:
            return None  # missing: already said
        if not isinstance(value, str):
            named = isinstance(value, list) and value and isinstance(value[0], str)
            hint = f" (write start_agent: {value[0]})" if named else ""
            self.broken("start_agent", f"must be one agent's name, got {shown(value)}{hint}")
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
                    child("agent_info", agent),
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
        kind_ok = isinstance(kind, str) and bool(NAME.match(kind))
        if not kind_ok:
            self.broken(f"{path}.agent_kind", f"must be an agent kind's name, got {shown(kind)}")
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
        before = self.unusable
        code_field = self.code_field(agent, doc, fields, VERIFIER in nexts)
        route_by = self.route_by(doc.get("route_by"), f"{path}.route_by", fields, nexts)
        if self.unusable > before:
            return None
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
            code_field=code_field,
            route_by=route_by,
        )

    def code_field(
        self, agent: str, doc: dict[Any, Any], fields: tuple[OutputField, ...], to_verifier: bool
    ) -> str | None:
        """The field holding the agent's code (docs/workflows.md, "The verifier"): the one
        ``code_field`` names, else ``code``, else, for an agent that hands over to the
        verifier, its one mandatory string field."""
        path = f"agent_info.{agent}"
        strings = [f.name for f in fields if f.field_type == "str"]
        if "code_field" in doc:
            named = doc["code_field"]
            if not fields and named == CODE_FIELD:
                return CODE_FIELD
            if not fields:
                self.broken(
                    f"{path}.code_field",
                    f"an agent without output_format gives its code as a fenced block, its "
                    f"{CODE_FIELD!r} field: declare output_format to name another",
                )
                return None
            if named not in strings:
                self.broken(
                    f"{path}.code_field",
                    f"must name one of the agent's string fields "
                    f"({', '.join(strings) or 'it declares none'}), got {shown(named)}"
                    f"{did_you_mean(named, strings)}",
                )
                return None
            return str(named)
        if not fields:  # a free-text answer: its last fenced block is its code
            return CODE_FIELD if to_verifier else None
        if CODE_FIELD in strings:
            return CODE_FIELD
        mandatory = [f.name for f in fields if f.field_type == "str" and f.mandatory]
        if to_verifier and len(mandatory) == 1:
            return mandatory[0]
        if to_verifier:
            declared = ", ".join(
                f"{f.name}: {f.field_type}{'' if f.mandatory else ', optional'}" for f in fields
            )
            self.mistake(
                f"{path}.output_format.parser_definition.output_fields",
                f"{agent!r} hands over to the verifier, which checks one string field of its "
                f"answer, but it has no {CODE_FIELD!r} field nor a single mandatory string "
                f"field: name the field to check with code_field: FIELD under "
                f"agent_info.{agent} (declared: {declared})",
            )
        return None

    def route_by(
        self, value: Any, path: str, fields: tuple[OutputField, ...], nexts: list[str]
    ) -> RouteBy | None:
        """``route_by: {field, values: {answer: agent}}``: the agent's answer picks what
        follows it (docs/workflows.md, "Routing")."""
        if value is None:
            return None
        doc = self.mapping(value, path, empty_ok=False)
        if doc is None:
            return None
        before = self.unusable
        self.known_keys(doc, path, ("field", "values"))
        strings = [f.name for f in fields if f.field_type == "str"]
        name = self.required(doc, "field", path)
        if name is not None and name not in strings:
            self.broken(
                f"{path}.field",
                f"must name one of the agent's string fields "
                f"({', '.join(strings) or 'it declares none'}), got {shown(name)}"
                f"{did_you_mean(name, strings)}",
            )
        values = self.required(doc, "values", path)
        values = None if values is None else self.mapping(values, f"{path}.values", empty_ok=False)
        pairs: dict[str, str] = {}
        for answer, agent in (values or {}).items():
            at = child(f"{path}.values", answer)
            if not isinstance(answer, str) or not answer.strip():
                self.broken(
                    at,
                    f"must be an answer's text, got {shown(answer)} (quote it: YAML reads "
                    "yes, no, on and off as true and false)",
                )
            elif agent not in nexts:
                self.broken(
                    at, f"{shown(agent)} is not one of possible_next_agent ({', '.join(nexts)})"
                )
            elif answer.strip().lower() in {a.lower() for a in pairs}:
                self.broken(at, f"{answer!r} is given twice (answers match whatever their case)")
            else:
                pairs[answer.strip()] = agent
        if self.unusable > before or name is None or values is None:
            return None
        return RouteBy(str(name), tuple(pairs.items()))

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
            self.broken(f"{fmt_path}.parser_name", f"must be a string, got {shown(parser_name)}")
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
        fields = [self.output_field(n, f, child(fields_path, n)) for n, f in fields_doc.items()]
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
                f"unknown type {shown(field_type)}{did_you_mean(field_type, FIELD_TYPES)} "
                f"(one of {', '.join(FIELD_TYPES)})",
            )
        mandatory = doc.get("mandatory", False)
        if not isinstance(mandatory, bool):
            self.broken(f"{path}.mandatory", f"must be true or false, got {shown(mandatory)}")
        description = doc.get("field_description", "")
        if not isinstance(description, str):
            self.mistake(f"{path}.field_description", f"must be text, got {shown(description)}")
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
            self.broken(path, f"must be a list of tool names, got {shown(value)}")
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
                self.broken(f"{path}.{key}", f"must be a positive {kind}, got {shown(limit)}")
                usable = False
        return {k: v for k, v in overrides.items() if k in TOOL_LIMIT_KEYS} if usable else None

    def graph(self, agents: dict[str, AgentSpec], start: str | None) -> None:
        """Mistakes in how agents connect: agents nothing reaches, agents from which no
        path ends."""
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


def _add_built_in_verifier(agents: dict[str, AgentSpec], start: str | None) -> None:
    """Add the verifier a workflow names without defining it: it may finish, or go back
    to any agent that hands over to it (the routing rules send a failure to the one whose
    code failed)."""
    authors = tuple(a for a, spec in agents.items() if VERIFIER in spec.possible_next)
    if VERIFIER not in agents and (authors or start == VERIFIER):
        agents[VERIFIER] = AgentSpec(VERIFIER, (FINISH, *authors), built_in=True)


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
