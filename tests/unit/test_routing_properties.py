"""Properties of the routing rules over random workflows, histories and agent outcomes:
limits are never broken and every limit that removes an option is named with its counts;
a parse failure reruns its agent while the limits allow; a pass finishes unless the
verifier is under mandatory analysis and may hand the kernel to an agent besides its
author."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.projections.counters import repeat_counters
from kernelflow.workflows.model import (
    FINISH,
    VERIFIER,
    AgentSpec,
    OutputField,
    SequenceLimit,
    Workflow,
)
from kernelflow.workflows.rules import Outcome, removal_text, route

NAMES = ["designer", "coder", "tuner", VERIFIER]
CODE = (OutputField("code", "str", True),)


@st.composite
def workflows(draw: st.DrawFn, with_verifier: bool = False) -> Workflow:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
    if with_verifier and VERIFIER not in names:
        names.append(VERIFIER)
    agents = {}
    for name in names:
        nexts = draw(st.lists(st.sampled_from([*names, FINISH]), max_size=4, unique=True))
        fields = () if name == VERIFIER else CODE
        agents[name] = AgentSpec(name, tuple(nexts), "p" if fields else None, fields)
    sequences = tuple(
        SequenceLimit(f"s{i}", tuple(pattern), draw(st.integers(1, 3)))
        for i, pattern in enumerate(
            draw(st.lists(st.lists(st.sampled_from(names), min_size=1, max_size=3), max_size=2))
        )
    )
    return Workflow(
        name="random",
        agents=agents,
        start_agent=draw(st.sampled_from(names)),
        max_step=draw(st.integers(1, 12)),
        mandatory_llm_analysis=frozenset(draw(st.lists(st.sampled_from(names), unique=True))),
        single_agent_limits={n: draw(st.integers(1, 4)) for n in names if draw(st.booleans())},
        sequences=sequences,
    )


def histories(wf: Workflow, last: str | None = None) -> st.SearchStrategy[list[str]]:
    """Any sequence of the workflow's agents (ending with ``last``), up to past max_step."""
    runs = st.lists(st.sampled_from(sorted(wf.agents)), max_size=wf.max_step + 2)
    if last is None:
        return runs.filter(bool)
    return runs.map(lambda history: [*history, last])


@st.composite
def outcomes(draw: st.DrawFn, history: list[str]) -> Outcome:
    """How the last agent of ``history`` may end: the verifier passes or fails, an LLM
    agent's answer parses or not; either may fail to work at all."""
    agent = history[-1]
    if draw(st.integers(0, 9)) == 0:
        return Outcome(agent, agent_failed=True)
    if agent == VERIFIER:
        return Outcome(
            agent, verification_passed=draw(st.booleans()), code_author=author_of(history)
        )
    return Outcome(agent, parse_failed=draw(st.booleans()))


def author_of(history: list[str]) -> str | None:
    """Whose code the verifier checked: the agent before it (none: the task's own)."""
    return history[-2] if len(history) > 1 else None


def brute_consecutive(history: list[str], agent: str) -> int:
    return max(c for c in range(len(history) + 1) if history[len(history) - c :] == [agent] * c)


def brute_repeats(history: list[str], pattern: tuple[str, ...]) -> int:
    n = len(pattern)
    return max(
        k
        for k in range(len(history) // n + 1)
        if history[len(history) - k * n :] == list(pattern) * k
    )


def brute_steps_to_answer(wf: Workflow, agent: str) -> int | None:
    """How many agents at least run after ``agent`` up to one that may end the task."""
    reach = {agent}
    for n in range(len(wf.agents)):
        if any(
            FINISH in wf.agents[a].possible_next or not wf.agents[a].possible_next for a in reach
        ):
            return n
        reach = {b for a in reach for b in wf.agents[a].possible_next if b in wf.agents}
    return None


def legal(wf: Workflow, history: list[str], agent: str) -> bool:
    """The limits, from their definitions, on the history the agent would extend."""
    if len(history) >= wf.max_step:
        return False
    if VERIFIER in wf.agents and agent != VERIFIER and len(history) == wf.max_step - 1:
        return False  # the one step left is the verifier's: nothing could check another
    after = brute_steps_to_answer(wf, agent)
    if VERIFIER not in wf.agents and after is not None and len(history) + 1 + after > wf.max_step:
        return False  # a prompt workflow keeps the steps its final answer needs
    if brute_consecutive(history, agent) >= wf.single_agent_limit(agent):
        return False
    return not any(
        s.pattern[0] == agent and brute_repeats(history, s.pattern) >= s.max_repeats
        for s in wf.sequences
    )


@settings(max_examples=300, deadline=None)
@given(workflows(), st.data())
def test_tasks_end_within_limits_and_never_break_one(wf: Workflow, data: st.DataObject) -> None:
    history = [wf.start_agent]
    for _ in range(wf.max_step + 1):
        agent = history[-1]
        outcome = Outcome(
            agent,
            parse_failed=agent != VERIFIER and data.draw(st.booleans()),
            verification_passed=data.draw(st.booleans()) if agent == VERIFIER else None,
            code_author=author_of(history),
        )
        r = route(wf, repeat_counters(history, wf.sequence_patterns), outcome)
        if outcome.verification_passed is False:
            # A failed check may end the task only because nothing else may run.
            assert FINISH not in r.options
        if r.action == "finish":
            return
        if r.action == "ask_llm":
            # Whatever the conductor's LLM picks among the options must be legal.
            assert r.options and all(o == FINISH or legal(wf, history, o) for o in r.options)
            chosen = data.draw(st.sampled_from(r.options))
            if chosen == FINISH:
                return
        else:
            assert r.chosen is not None and legal(wf, history, r.chosen)
            chosen = r.chosen
        history.append(chosen)
        assert len(history) <= wf.max_step
    raise AssertionError(f"no finish after {len(history)} steps with max_step {wf.max_step}")


@settings(max_examples=300, deadline=None)
@given(workflows(), st.data())
def test_a_parse_failure_reruns_its_agent_while_the_limits_allow(
    wf: Workflow, data: st.DataObject
) -> None:
    """Whether or not the agent lists itself among its next agents."""
    history = data.draw(histories(wf))
    agent = history[-1]
    r = route(wf, repeat_counters(history, wf.sequence_patterns), Outcome(agent, parse_failed=True))
    if legal(wf, history, agent):
        assert (r.action, r.mode, r.options, r.chosen, r.removed) == (
            "run",
            "retry",
            (agent,),
            agent,
            (),
        )
    else:  # routed like any result, the retry named first among what the limits removed
        assert r.chosen != agent and agent not in r.options and r.removed[0].agent == agent


@settings(max_examples=300, deadline=None)
@given(workflows(with_verifier=True), st.data())
def test_a_pass_finishes_unless_the_verifier_may_hand_the_kernel_on(
    wf: Workflow, data: st.DataObject
) -> None:
    history = data.draw(histories(wf, last=VERIFIER))
    author = author_of(history)
    r = route(
        wf,
        repeat_counters(history, wf.sequence_patterns),
        Outcome(VERIFIER, verification_passed=True, code_author=author),
    )
    onward = [
        a
        for a in wf.agents[VERIFIER].possible_next
        if a not in (FINISH, author) and legal(wf, history, a)
    ]
    if not onward:
        assert (r.action, r.chosen, r.options) == ("finish", FINISH, (FINISH,))
    else:  # finish first: a conductor LLM that cannot answer keeps the passed kernel
        assert (r.action, r.options) == ("ask_llm", (FINISH, *onward))


@settings(max_examples=500, deadline=None)
@given(workflows(), st.data())
def test_every_option_a_limit_excludes_is_named_with_its_counts(
    wf: Workflow, data: st.DataObject
) -> None:
    history = data.draw(histories(wf))
    outcome = data.draw(outcomes(history))
    agent = outcome.agent
    r = route(wf, repeat_counters(history, wf.sequence_patterns), outcome)
    # The agents this decision considers, before the limits.
    if outcome.agent_failed:
        considered: set[str] = set()
    elif outcome.verification_passed:
        considered = set(wf.agents[VERIFIER].possible_next) - {FINISH, outcome.code_author}
    elif r.mode == "retry":
        considered = {agent}
    else:
        considered = set(wf.agents[agent].possible_next) - {FINISH}
        considered |= {agent} if outcome.parse_failed else set()
    removed = {x.agent: x for x in r.removed}
    assert len(removed) == len(r.removed)
    for candidate in considered:
        assert (candidate in removed) == (not legal(wf, history, candidate))
        assert (candidate in removed) != (candidate in r.options)
    for x in r.removed:
        assert x.agent in considered
        if x.limit == "max_step":
            assert x.count == len(history) and x.maximum == wf.max_step
            assert x.count >= x.maximum or (x.count == x.maximum - 1 and x.agent != VERIFIER)
        elif x.limit == "max_step_reserve":  # a prompt workflow keeps its answer's steps
            after = brute_steps_to_answer(wf, x.agent)
            assert VERIFIER not in wf.agents and after is not None
            assert x.count == len(history) and x.maximum == wf.max_step
            assert x.count < x.maximum < x.count + 1 + after
        elif x.limit == "single_agent":
            limit = wf.single_agent_limit(x.agent)
            assert x.count == brute_consecutive(history, x.agent) >= x.maximum == limit
        else:
            assert x.limit == "sequence"
            [seq] = [s for s in wf.sequences if s.name == x.sequence]
            assert seq.pattern[0] == x.agent and x.maximum == seq.max_repeats
            assert x.count == brute_repeats(history, seq.pattern) >= x.maximum
        if r.action != "ask_llm":  # decided by the rules alone: the reason says which
            assert r.mode == "limit" and removal_text(x) in r.reason


@given(
    st.lists(st.sampled_from(["a", "b", "c"]), max_size=20),
    st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=4),
)
def test_counters_projection_agrees_with_brute_force(
    history: list[str], pattern: list[str]
) -> None:
    counters = repeat_counters(history, {"p": pattern})
    assert counters.step == len(history)
    for agent in ("a", "b", "c"):
        assert counters.consecutive(agent) == brute_consecutive(history, agent)
    assert counters.sequence_repeats("p") == brute_repeats(history, tuple(pattern))
