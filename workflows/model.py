"""A workflow as the conductor sees it, after validation (see ``kernelflow.workflows.loader``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

FINISH = "finish"
# The one agent that is a program, not an LLM. Built in: a workflow may name it without
# defining it (docs/workflows.md, "The verifier").
VERIFIER = "verifier"
DEFAULT_SINGLE_AGENT_LIMIT = 3
DEFAULT_AGENT_KIND = "llm"  # one LLM call, its answer parsed: what designer/coder are
CODE_FIELD = "code"  # the output field the verifier checks, unless an agent names another
# An agent without ``output_format`` (optional: docs/workflows.md, "output_format") answers
# in free text: its whole answer is its ``answer`` field, and the last fenced code block in
# it its ``code`` field; one that may hand over to the verifier must give such a block
# (kernelflow.workflows.parsing).
ANSWER_FIELD = "answer"
# An output field's type that holds the name of one of the workflow's tools (AgentFlow's
# planner chooses its tool with one: docs/workflows.md, "output_format").
TOOL_FIELD_TYPE = "tool"
# ``improve_after_pass``'s target when it names none: KernelAgent stops at 95 % of
# speed-of-light (docs/workflows.md, "Improving after a pass").
DEFAULT_TARGET_SOL = 0.95


@dataclass(frozen=True)
class OutputField:
    name: str
    field_type: str
    mandatory: bool
    description: str = ""


@dataclass(frozen=True)
class RouteBy:
    """``route_by``: the value of ``field`` in the agent's answer picks the next agent."""

    field: str
    # Value → agent (or ``finish``), in the order the workflow lists them.
    values: tuple[tuple[str, str], ...]

    def chosen(self, fields: Mapping[str, Any]) -> str | None:
        """The agent the answer names, if its value is one of ``values`` (whatever its
        case and surrounding spaces)."""
        value = fields.get(self.field)
        if not isinstance(value, str):
            return None
        wanted = value.strip().lower()
        return next((agent for answer, agent in self.values if answer.lower() == wanted), None)


@dataclass(frozen=True)
class AgentSpec:
    name: str
    possible_next: tuple[str, ...]
    parser_name: str | None = None
    # None declared: a free-text answer (see ANSWER_FIELD).
    output_fields: tuple[OutputField, ...] = ()
    # How the agent works (``agent_kind``: llm, react, tool, coding or a plugin's kind),
    # the tools it may call and its kind's settings (``agent_config``), checked against the
    # agent-kind registry when a task is submitted.
    kind: str = DEFAULT_AGENT_KIND
    tools: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    # Per-tool limit overrides from the YAML (``- calculator: {timeout_s: 5}``).
    tool_limits: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The workflow's own prompt templates for this agent (``prompt: {system, user}``),
    # replacing the built-in files; same placeholders (``$task_source``...).
    prompt_templates: dict[str, str] = field(default_factory=dict)
    # The output field holding the agent's code: what the verifier checks when this agent
    # hands over to it (``code_field``, else ``code``, else its one mandatory string field
    # where it hands over to the verifier); None: the agent writes no code.
    code_field: str | None = None
    # The agent chooses what follows it (``route_by``): its answer's field, and which
    # agent each value of it leads to.
    route_by: RouteBy | None = None
    # The verifier the workflow named without defining it: it finishes on a pass and goes
    # back to the agent whose code failed (docs/workflows.md, "The verifier").
    built_in: bool = False

    def code_in(self, fields: Mapping[str, Any]) -> str | None:
        """The code in this agent's parsed answer ``fields``, if it has any."""
        value = fields.get(self.code_field) if self.code_field is not None else None
        return value if isinstance(value, str) else None


@dataclass(frozen=True)
class SequenceLimit:
    name: str
    pattern: tuple[str, ...]
    max_repeats: int


@dataclass(frozen=True)
class Improvement:
    """``improve_after_pass``: a passing kernel goes back to its author to be made faster
    until one reaches ``target_sol_fraction`` of the machine's speed-of-light or the limits
    end the task, which then ends with the best kernel that passed (docs/workflows.md,
    "Improving after a pass")."""

    target_sol_fraction: float = DEFAULT_TARGET_SOL


@dataclass(frozen=True)
class Workflow:
    name: str
    agents: dict[str, AgentSpec]
    start_agent: str
    max_step: int
    mandatory_llm_analysis: frozenset[str] = frozenset()
    single_agent_limits: dict[str, int] = field(default_factory=dict)
    sequences: tuple[SequenceLimit, ...] = ()
    # The agents whose LLM turns are the policy's (``trainable_agents``): what ``export
    # grpo`` takes by default. None: every agent's, the conductor's included.
    trainable_agents: frozenset[str] | None = None
    # The reward functions a task of this workflow is scored with unless its submitter
    # names others (``rewards``); empty: the defaults for its kind of task.
    rewards: tuple[str, ...] = ()
    # ``improve_after_pass`` (None: a pass is final, rule 4 of docs/workflows.md, "Routing").
    improve: Improvement | None = None

    @property
    def toolset(self) -> tuple[str, ...]:
        """The tools of the workflow's agents, each once, in the order they are given."""
        return tuple(dict.fromkeys(t for spec in self.agents.values() for t in spec.tools))

    def ends_task(self, agent: str) -> bool:
        """Whether the task may end right after ``agent``: ``finish`` is among its next
        agents, or it has none. In a prompt workflow such an agent gives the final answer."""
        possible = self.agents[agent].possible_next
        return not possible or FINISH in possible

    @property
    def steps_to_answer(self) -> dict[str, int]:
        """For each agent from which an agent that may end the task can be reached: how
        many agents at least run after it up to and including that one (0 for such an
        agent itself)."""
        steps = {a: 0 for a in self.agents if self.ends_task(a)}
        frontier = list(steps)
        while frontier:
            reached = []
            for agent, spec in self.agents.items():
                if agent not in steps and any(n in frontier for n in spec.possible_next):
                    steps[agent] = steps[frontier[0]] + 1
                    reached.append(agent)
            frontier = reached
        return steps

    @property
    def sequence_patterns(self) -> dict[str, tuple[str, ...]]:
        return {s.name: s.pattern for s in self.sequences}

    def single_agent_limit(self, agent: str) -> int:
        return self.single_agent_limits.get(agent, DEFAULT_SINGLE_AGENT_LIMIT)
