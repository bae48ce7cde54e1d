"""Properties of the routing rules over random workflows and random agent outcomes."""

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
from kernelflow.workflows.rules import Outcome, route

NAMES = ["designer", "coder", "tuner", VERIFIER]
CODE = (OutputField("code", "str", True),)


@st.composite
def workflows(draw: st.DrawFn) -> Workflow:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
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


def brute_consecutive(history: list[str], agent: str) -> int:
    return max(c for c in range(len(history) + 1) if history[len(history) - c :] == [agent] * c)


def brute_repeats(history: list[str], pattern: tuple[str, ...]) -> int:
    n = len(pattern)
    return max(
        k
        for k in range(len(history) // n + 1)
        if history[len(history) - k * n :] == list(pattern) * k
    )


def legal(wf: Workflow, history: list[str], agent: str) -> bool:
    """The limits, from their definitions, on the history the agent would extend."""
    if len(history) >= wf.max_step:
        return False
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
