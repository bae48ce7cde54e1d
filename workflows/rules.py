"""The conductor's routing rules, as pure functions of the workflow and the task's history.

After an agent finishes (docs/workflows.md, "Routing"):

1. An agent that could not work at all (provider down, no responses left) ends the task.
2. The limits remove agents: every agent once ``max_step`` agents ran (in a kernel
   workflow, every agent but the verifier when one step is left: no check could follow
   its answer, and the task ends judged by its last verification); an agent that ran
   its ``single_agent`` limit in a row (default 3); the first agent of a ``sequences``
   pattern that ended the history ``max_repeats`` times back to back. Each removal is
   recorded on the decision with its limit and the counts that reached it.
3. Output that failed to parse reruns the same agent, whether or not it lists itself in
   ``possible_next_agent`` (a parse failure is retried, not routed), unless a limit removed
   it; then it is routed like any other result, the retry named among the removed options.
4. After the verifier, a failure removes ``finish``. A pass never goes back to the
   kernel's author (the agent whose code passed): it finishes when no other of the
   verifier's next agents is left by the limits, and otherwise the conductor's LLM chooses
   among ``finish`` (first, so that a fallback finishes) and those agents (several options:
   an LLM decision). So the predefined ``default`` (verifier → [finish, coder], the coder
   wrote the kernel) finishes on a pass with no LLM call, while the optimizer example
   ``default_with_optimizer.yaml`` (verifier → [finish, coder, optimizer]) may send a
   kernel the coder got right on to the optimizer, and ``conductor_connect_all`` may send
   it back to the designer for another round. The built-in verifier (named, not defined)
   finishes on a pass and goes back to the kernel's author on a failure. In a workflow
   that improves after a pass (``improve_after_pass``, the predefined ``agentic``), a pass
   goes back to its author while its fraction of speed-of-light is below the target and
   the limits let the author run, and finishes otherwise (not timed: finishes).
5. An agent with ``route_by`` chooses for itself: the agent its answer names is taken when
   the limits leave it.
6. No option left → finish; one option, after an agent not in ``mandatory_llm_analysis``
   → take it; otherwise the conductor's LLM chooses among the options.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kernelflow.events.model import ROUTING_VERSION, RemovedOption
from kernelflow.workflows.model import FINISH, VERIFIER, Workflow

# The ``limit`` of a removal that keeps, in a prompt workflow, the steps its final answer
# needs (``illegal_agents``): part of ``max_step``.
RESERVE = "max_step_reserve"


@dataclass(frozen=True)
class Outcome:
    """How the agent that just ran ended."""

    agent: str
    parse_failed: bool = False
    agent_failed: bool = False
    verification_passed: bool | None = None
    # The agent whose code the verifier checked (None: the code submitted with the task).
    code_author: str | None = None
    # The agent's parsed answer, if it gave one (an agent with ``route_by`` routes by it).
    output: Mapping[str, Any] | None = None
    # A verified kernel's fraction of speed-of-light (None: not timed, or no roofline).
    sol_fraction: float | None = None


@dataclass(frozen=True)
class Route:
    """What the conductor does next. ``ask_llm`` means: choose among ``options``.
    ``removed``: the agents the limits took out of this decision."""

    action: Literal["run", "finish", "ask_llm"]
    mode: Literal["auto", "retry", "limit"]
    options: tuple[str, ...]
    chosen: str | None
    reason: str
    removed: tuple[RemovedOption, ...] = ()


class Counters(Protocol):
    """The repeat-limit counters of a task (``kernelflow.projections.counters.RepeatCounters``)."""

    @property
    def step(self) -> int: ...

    def consecutive(self, agent: str) -> int: ...

    def sequence_repeats(self, name: str) -> int: ...


def illegal_agents(
    workflow: Workflow, counters: Counters, routing_version: int = ROUTING_VERSION
) -> dict[str, RemovedOption]:
    """Agents the limits forbid to run next, each with the limit that forbids it (the
    first that applies, in the order max_step, single_agent, sequences), under the task's
    ``routing_version`` (``TaskSubmitted.routing_version``)."""
    if counters.step >= workflow.max_step:
        return {
            a: RemovedOption(
                agent=a, limit="max_step", count=counters.step, maximum=workflow.max_step
            )
            for a in workflow.agents
        }
    illegal: dict[str, RemovedOption] = {}
    if VERIFIER in workflow.agents and counters.step == workflow.max_step - 1:
        # A kernel task ends judged by its last verification: in the one step left, an
        # answer no verification can follow could not change that, only cost a call.
        for agent in workflow.agents:
            if agent != VERIFIER:
                illegal[agent] = RemovedOption(
                    agent=agent, limit="max_step", count=counters.step, maximum=workflow.max_step
                )
    elif VERIFIER not in workflow.agents and routing_version >= 2:
        # A prompt task's outcome is its final answer, which only an agent that may end
        # the task gives: an agent is not started unless the steps left hold it and the
        # shortest way from it to such an agent (AgentFlow's solution generator keeps its
        # step: docs/workflows.md, "Limits").
        for agent, after in workflow.steps_to_answer.items():
            if counters.step + 1 + after > workflow.max_step:
                illegal[agent] = RemovedOption(
                    agent=agent, limit=RESERVE, count=counters.step, maximum=workflow.max_step
                )
    for agent in workflow.agents:
        if agent in illegal:
            continue
        limit, runs = workflow.single_agent_limit(agent), counters.consecutive(agent)
        if runs >= limit:
            illegal[agent] = RemovedOption(
                agent=agent, limit="single_agent", count=runs, maximum=limit
            )
    for seq in workflow.sequences:
        repeats = counters.sequence_repeats(seq.name)
        if repeats >= seq.max_repeats:
            illegal.setdefault(
                seq.pattern[0],
                RemovedOption(
                    agent=seq.pattern[0],
                    limit="sequence",
                    count=repeats,
                    maximum=seq.max_repeats,
                    sequence=seq.name,
                ),
            )
    return illegal


def removal_text(removed: RemovedOption) -> str:
    """Why a limit removed an agent, in words."""
    if removed.limit == RESERVE:
        return (
            f"max_step {removed.maximum}: {removed.count} agents ran, and {removed.agent} "
            "would leave no step for the agent that gives the final answer"
        )
    if removed.limit == "max_step" and removed.count < removed.maximum:
        return (
            f"max_step {removed.maximum}: {removed.count} agents ran, and no verification "
            f"could follow {removed.agent} in the one step left"
        )
    if removed.limit == "max_step":
        return f"max_step {removed.maximum} reached ({removed.count} agents ran)"
    if removed.limit == "single_agent":
        return (
            f"{removed.agent} ran {removed.count} times in a row "
            f"(single_agent limit {removed.maximum})"
        )
    if removed.limit == "sequence":
        return (
            f"sequence {removed.sequence} repeated {removed.count} times back to back "
            f"(max_repeats {removed.maximum}): no {removed.agent}"
        )
    return f"{removed.agent}: {removed.limit} {removed.count} of {removed.maximum}"


def route(
    workflow: Workflow,
    counters: Counters,
    outcome: Outcome,
    routing_version: int = ROUTING_VERSION,
) -> Route:
    """Decide what follows ``outcome``, given the counters of every agent run so far (the
    task's ``routing_version``: the rules it was submitted under)."""
    agent = outcome.agent
    if outcome.agent_failed:
        return Route("finish", "auto", (), FINISH, f"{agent} could not complete its work")
    illegal = illegal_agents(workflow, counters, routing_version)
    if outcome.parse_failed:
        if agent not in illegal:
            return Route("run", "retry", (agent,), agent, "output failed to parse; retrying")
        return _choose(
            workflow,
            agent,
            list(workflow.agents[agent].possible_next),
            illegal,
            retry_removed=illegal[agent],
        )
    spec = workflow.agents[agent]
    improvable = workflow.improve is not None and outcome.code_author in spec.possible_next
    if agent == VERIFIER and outcome.verification_passed and improvable:
        return _improve(workflow, illegal, outcome)
    if agent == VERIFIER and spec.built_in:
        return _after_the_built_in_verifier(workflow, illegal, outcome)
    if agent == VERIFIER and outcome.verification_passed:
        return _after_a_pass(workflow, illegal, outcome.code_author)
    candidates = list(spec.possible_next)
    if agent == VERIFIER and FINISH in candidates:
        candidates.remove(FINISH)  # a failed verification may not end the task as done
    if spec.route_by is not None and outcome.output is not None:
        chosen = spec.route_by.chosen(outcome.output)
        if chosen is not None and chosen not in illegal:
            answer = str(outcome.output[spec.route_by.field]).strip()
            removed = tuple(illegal[a] for a in candidates if a in illegal)
            return Route(
                "finish" if chosen == FINISH else "run",
                "limit" if removed else "auto",
                tuple(a for a in candidates if a not in illegal),
                chosen,
                f"{agent} answered {spec.route_by.field} {answer!r}",
                removed,
            )
    return _choose(workflow, agent, candidates, illegal)


def _choose(
    workflow: Workflow,
    after: str,
    candidates: list[str],
    illegal: dict[str, RemovedOption],
    retry_removed: RemovedOption | None = None,
) -> Route:
    """Rules 2 and 5: the candidates the limits leave, and who picks among them."""
    removed = [retry_removed] if retry_removed is not None else []
    removed += [illegal[a] for a in candidates if a in illegal and illegal[a] not in removed]
    options = [a for a in candidates if a not in illegal]
    mode: Literal["auto", "limit"] = "limit" if removed else "auto"
    why = _why(removed)
    head = "output failed to parse, not retried: " if retry_removed is not None else ""
    if not options:
        reason = head + (why or f"no agent may follow {after}")
        return Route("finish", mode, (), FINISH, reason, tuple(removed))
    if len(options) == 1 and after not in workflow.mandatory_llm_analysis:
        only = options[0]
        action: Literal["run", "finish"] = "finish" if only == FINISH else "run"
        reason = f"{head}{why}; the only option left" if why else "the only option"
        return Route(action, mode, (only,), only, reason, tuple(removed))
    return Route(
        "ask_llm", mode, tuple(options), None, "the conductor's LLM chooses", tuple(removed)
    )


def _after_a_pass(
    workflow: Workflow, illegal: dict[str, RemovedOption], author: str | None
) -> Route:
    """Rule 4 for a pass: finish, or let the conductor's LLM hand the kernel on."""
    onward = [a for a in workflow.agents[VERIFIER].possible_next if a not in (FINISH, author)]
    removed = tuple(illegal[a] for a in onward if a in illegal)
    options = [a for a in onward if a not in illegal]
    if not options:
        why = f"; nothing else may follow: {_why(removed)}" if removed else ""
        mode: Literal["auto", "limit"] = "limit" if removed else "auto"
        return Route("finish", mode, (FINISH,), FINISH, "verification passed" + why, removed)
    return Route(
        "ask_llm",
        "limit" if removed else "auto",
        (FINISH, *options),
        None,
        "verification passed; the conductor's LLM chooses whether to hand it on",
        removed,
    )


def _improve(workflow: Workflow, illegal: dict[str, RemovedOption], outcome: Outcome) -> Route:
    """Rule 4 in a workflow that improves after a pass: the kernel goes back to its author
    until one reaches the target fraction of speed-of-light or the limits stop it."""
    assert workflow.improve is not None and outcome.code_author is not None
    author, sol = outcome.code_author, outcome.sol_fraction
    target = workflow.improve.target_sol_fraction
    if sol is None:
        return Route(
            "finish", "auto", (FINISH,), FINISH,
            "verification passed; not timed here, so no speed-of-light to improve towards",
        )  # fmt: skip
    reached = f"verification passed at {sol:.0%} of speed-of-light"
    if sol >= target:
        why = f"{reached}, the target {target:.0%} reached"
        return Route("finish", "auto", (FINISH,), FINISH, why)
    if author in illegal:
        removed = (illegal[author],)
        why = f"{reached}, below the target {target:.0%}; no more improving: {_why(removed)}"
        return Route("finish", "limit", (FINISH,), FINISH, why, removed)
    why = f"{reached}, below the target {target:.0%}: {author} improves it"
    return Route("run", "auto", (author,), author, why)


def _after_the_built_in_verifier(
    workflow: Workflow, illegal: dict[str, RemovedOption], outcome: Outcome
) -> Route:
    """Rule 4 for the verifier a workflow names without defining it: a pass finishes, a
    failure goes back to the agent whose code failed (when the limits let it run)."""
    if outcome.verification_passed:
        return Route("finish", "auto", (FINISH,), FINISH, "verification passed")
    author = outcome.code_author
    candidates = [author] if author is not None and author in workflow.agents else []
    return _choose(workflow, VERIFIER, candidates, illegal)


def _why(removed: Sequence[RemovedOption]) -> str:
    return "; ".join(dict.fromkeys(removal_text(r) for r in removed))


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
