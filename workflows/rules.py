"""The conductor's routing rules, as pure functions of the workflow and the task's history.

After an agent finishes (seed 001; docs/architecture.md, "Routing"):
1. its output failed to parse and it may follow itself (within limits) → run it again;
2. options = ``possible_next_agent`` minus agents made illegal by limits;
3. after the verifier, a pass goes to ``finish`` and a failure removes ``finish``;
4. no option → finish; one option not under mandatory analysis → take it; otherwise the
   conductor's LLM chooses among the options.
An agent that could not work at all (provider down, no responses left) ends the task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from kernelflow.workflows.model import FINISH, VERIFIER, Workflow


@dataclass(frozen=True)
class Outcome:
    """How the agent that just ran ended."""

    agent: str
    parse_failed: bool = False
    agent_failed: bool = False
    verification_passed: bool | None = None


@dataclass(frozen=True)
class Route:
    """What the conductor does next. ``ask_llm`` means: choose among ``options``."""

    action: Literal["run", "finish", "ask_llm"]
    mode: Literal["auto", "retry", "limit"]
    options: tuple[str, ...]
    chosen: str | None
    reason: str


class Counters(Protocol):
    """The repeat-limit counters of a task (``kernelflow.projections.counters.RepeatCounters``)."""

    @property
    def step(self) -> int: ...

    def consecutive(self, agent: str) -> int: ...

    def sequence_repeats(self, name: str) -> int: ...


def illegal_agents(workflow: Workflow, counters: Counters) -> dict[str, str]:
    """Agents the limits forbid to run next, each with the limit that forbids it."""
    if counters.step >= workflow.max_step:
        return {a: f"max_step {workflow.max_step} reached" for a in workflow.agents}
    illegal: dict[str, str] = {}
    for agent in workflow.agents:
        limit = workflow.single_agent_limit(agent)
        if counters.consecutive(agent) >= limit:
            illegal[agent] = f"{agent} ran {limit} times in a row (single_agent limit)"
    for seq in workflow.sequences:
        if counters.sequence_repeats(seq.name) >= seq.max_repeats:
            illegal.setdefault(
                seq.pattern[0],
                f"sequence {seq.name} repeated {seq.max_repeats} times (max_repeats)",
            )
    return illegal


def route(workflow: Workflow, counters: Counters, outcome: Outcome) -> Route:
    """Decide what follows ``outcome``, given the counters of every agent run so far."""
    if outcome.agent_failed:
        return Route("finish", "auto", (), FINISH, f"{outcome.agent} could not complete its work")
    spec = workflow.agents[outcome.agent]
    illegal = illegal_agents(workflow, counters)
    if (
        outcome.parse_failed
        and outcome.agent in spec.possible_next
        and outcome.agent not in illegal
    ):
        return Route(
            "run", "retry", (outcome.agent,), outcome.agent, "output failed to parse; retrying"
        )
    if outcome.agent == VERIFIER and outcome.verification_passed:
        return Route("finish", "auto", (FINISH,), FINISH, "verification passed")

    options = [a for a in spec.possible_next if a not in illegal]
    removed = [illegal[a] for a in spec.possible_next if a in illegal]
    if outcome.agent == VERIFIER and FINISH in options:
        options.remove(FINISH)  # a failed verification may not end the task as done
    if not options:
        reason = "; ".join(removed) if removed else f"no agent may follow {outcome.agent}"
        return Route("finish", "limit" if removed else "auto", (), FINISH, reason)
    if len(options) == 1 and outcome.agent not in workflow.mandatory_llm_analysis:
        only = options[0]
        action: Literal["run", "finish"] = "finish" if only == FINISH else "run"
        return Route(action, "auto", (only,), only, "the only option")
    return Route("ask_llm", "auto", tuple(options), None, "the conductor's LLM chooses")


@dataclass(frozen=True)
class LLMDecision:
    chosen: str
    suggestion: str
    valid: bool
    reason: str


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def read_llm_decision(options: Sequence[str], response_text: str) -> LLMDecision:
    """Validate the conductor LLM's ``{decision, error_and_suggestion}`` against the options.

    Matching is case-insensitive. An unusable answer falls back to the first option, the
    order the workflow author wrote, and says why.
    """
    fallback = options[0]
    match = _JSON_OBJECT.search(response_text)
    try:
        answer = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        return LLMDecision(fallback, "", False, "answer had no JSON object; took the first option")
    suggestion = str(answer.get("error_and_suggestion") or "")
    decision = str(answer.get("decision") or "").strip().lower()
    for option in options:
        if option.lower() == decision:
            return LLMDecision(option, suggestion, True, f"the LLM chose {option}")
    return LLMDecision(
        fallback,
        suggestion,
        False,
        f"the LLM chose {decision!r}, not one of {list(options)}; took the first option",
    )
