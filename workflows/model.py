"""A workflow as the conductor sees it, after validation (see ``kernelflow.workflows.loader``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINISH = "finish"
VERIFIER = "verifier"  # the one agent that is a program, not an LLM
DEFAULT_SINGLE_AGENT_LIMIT = 3
DEFAULT_AGENT_KIND = "llm"  # one LLM call, its answer parsed: what designer/coder are
CODE_FIELD = "code"  # the output field the verifier checks
# An agent without ``output_format`` (optional: docs/workflows.md, "output_format") answers
# in free text: its whole answer is its ``answer`` field, and the last fenced code block in
# it its ``code`` field; one that may hand over to the verifier must give such a block
# (kernelflow.workflows.parsing).
ANSWER_FIELD = "answer"


@dataclass(frozen=True)
class OutputField:
    name: str
    field_type: str
    mandatory: bool
    description: str = ""


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


@dataclass(frozen=True)
class SequenceLimit:
    name: str
    pattern: tuple[str, ...]
    max_repeats: int


@dataclass(frozen=True)
class Workflow:
    name: str
    agents: dict[str, AgentSpec]
    start_agent: str
    max_step: int
    mandatory_llm_analysis: frozenset[str] = frozenset()
    single_agent_limits: dict[str, int] = field(default_factory=dict)
    sequences: tuple[SequenceLimit, ...] = ()

    @property
    def sequence_patterns(self) -> dict[str, tuple[str, ...]]:
        return {s.name: s.pattern for s in self.sequences}

    def single_agent_limit(self, agent: str) -> int:
        return self.single_agent_limits.get(agent, DEFAULT_SINGLE_AGENT_LIMIT)
