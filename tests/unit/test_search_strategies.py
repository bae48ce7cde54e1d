"""Search strategies plan from the log alone: the same search gives the same database
whatever order its candidates end in and wherever it was stopped and resumed; each
strategy's rules hold for every outcome (property tests over simulated candidates, with
the real strategies and the real database fold)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelflow.actors.prompts import agent_messages
from kernelflow.events.model import (
    Event,
    PriorKernel,
    TaskCancelled,
    TaskFinished,
    TaskSubmitted,
    TimingStats,
    VerificationCompleted,
    VerificationReport,
)
from kernelflow.projections.search import (
    ATTEMPT,
    CANDIDATE,
    GENERATION,
    INSPIRATIONS,
    INTERRUPTED,
    ISLAND,
    PARENTS,
    SEARCH,
    SearchDatabase,
)
from kernelflow.projections.task_state import TaskState, apply
from kernelflow.search.driver import Budget
from kernelflow.search.strategies import (
    CandidateSpec,
    Evolve,
    SearchConfig,
    Tree,
    UnknownStrategy,
    plan,
    register_strategy,
    strategy,
)
from kernelflow.workflows.loader import load_workflow, parse_workflow
from tests.conftest import EXAMPLES

S = "s"
VERDICTS = ["pass", "mismatch", "runtime_error", "compile_error", "rejected_static"]
Outcome = tuple[str, float | None]


def submitted(
    spec_index: int, generation: int, island: int, parents, inspirations, attempt: int = 0
) -> Event:
    redo = {ATTEMPT: str(attempt)} if attempt else {}
    return TaskSubmitted(
        task_id=f"{S}-r{attempt}-{spec_index}" if attempt else f"{S}-{spec_index}",
        seq=1,
        task_name="p",
        task_source="",
        workflow_name="w",
        workflow_yaml="",
        backend="triton",
        group_id=S,
        metadata={
            SEARCH: S,
            CANDIDATE: str(spec_index),
            GENERATION: str(generation),
            ISLAND: str(island),
            PARENTS: ",".join(parents),
            INSPIRATIONS: ",".join(inspirations),
            **redo,
        },
    )


def ended(task_id: str, outcome: Outcome) -> list[Event]:
    verdict, speedup = outcome
    timing = TimingStats(candidate_ms={"median": 1.0}) if speedup is not None else None
    report = VerificationReport(verdict=verdict, summary=verdict, speedup=speedup, timing=timing)  # type: ignore[arg-type]
    code = f"# kernel of {task_id}"
    return [
        VerificationCompleted(
            task_id=task_id, seq=2, agent="verifier", dispatch_id="d", code=code, report=report
        ),
        TaskFinished(
            task_id=task_id,
            seq=3,
            status="success" if verdict == "pass" else "failed",
            reason="",
            final_code=code,
            verdict=verdict,  # type: ignore[arg-type]
            speedup=speedup,
        ),
    ]


def simulate(
    search: SearchConfig,
    outcome: Callable[[int], Outcome],
    order: random.Random,
    log: list[Event],
    stop_after: int | None = None,
    *,
    interrupt: bool = False,
) -> SearchDatabase:
    """Run a search against ``outcome`` (candidate number → verdict, speedup), candidates
    of a generation ending in ``order``; every event goes to ``log``. With ``stop_after``,
    stop (as a kill would) once that many candidates have ended; ``interrupt``: as Ctrl-C
    does, cancelling the candidates still running (``INTERRUPTED``). The database is
    rebuilt from ``log`` first: what a restarted driver does."""
    db = SearchDatabase(S)
    # A restart reads the log: tasks interleaved, each task's own events in order.
    by_task: dict[str, list[Event]] = {}
    for e in log:
        by_task.setdefault(e.task_id, []).append(e)
    queues = list(by_task.values())
    while queues:
        q = order.choice(queues)
        db.apply(0, q.pop(0))
        if not q:
            queues.remove(q)
    found = strategy(search.strategy)
    ends = sum(1 for c in db.candidates.values() if c.ended)
    while (generation := plan(found, db, search)) is not None:
        for spec in generation.candidates:
            if spec.index not in {c.index for c in db.candidates.values()}:
                attempt = db.attempts.get(spec.index, 0)
                e = submitted(
                    spec.index,
                    spec.generation,
                    spec.island,
                    spec.parents,
                    spec.inspirations,
                    attempt,
                )
                log.append(e)
                db.apply(0, e)
        running = [c for c in db.generation(generation.index) if not c.ended]
        order.shuffle(running)
        for c in running:
            if stop_after is not None and ends >= stop_after:
                for cut in running if interrupt else ():
                    if not cut.ended:
                        log.append(TaskCancelled(task_id=cut.task_id, seq=2, reason=INTERRUPTED))
                return db
            for e in ended(c.task_id, outcome(c.index)):
                log.append(e)
                db.apply(0, e)
            ends += 1
    return db


outcomes = st.lists(
    st.tuples(st.sampled_from(VERDICTS), st.one_of(st.none(), st.floats(0.2, 5.0))),
    min_size=40,
    max_size=40,
).map(lambda xs: [(v, s if v == "pass" else None) for v, s in xs])
searches = st.builds(
    SearchConfig,
    strategy=st.sampled_from(["best_of_n", "evolve", "tree"]),
    samples=st.integers(1, 3),
    seed=st.integers(0, 5),
    generations=st.integers(1, 4),
    islands=st.integers(1, 3),
    elites=st.integers(1, 3),
    inspirations=st.integers(0, 2),
    migrate_every=st.integers(1, 3),
    expand=st.integers(1, 2),
)


@settings(max_examples=150, deadline=None)
@given(searches, outcomes, st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 12))
def test_a_search_stopped_anywhere_and_resumed_ends_with_the_same_database(
    search: SearchConfig, results: list[Outcome], first: int, second: int, stop: int
) -> None:
    def outcome(index: int) -> Outcome:
        return results[index % len(results)]

    straight = simulate(search, outcome, random.Random(first), [])
    log: list[Event] = []
    simulate(search, outcome, random.Random(second), log, stop_after=stop)
    resumed = simulate(search, outcome, random.Random(second + 1), log)
    assert resumed.lineage() == straight.lineage()
    # Every candidate number once, in planned order, each generation whole.
    assert [c.index for c in straight.ordered()] == list(range(len(straight.candidates)))


def _redos_unnamed(db: SearchDatabase) -> str:
    """The database's lineage, a redone task's id read as its candidate's first."""
    return re.sub(r"-r\d+(-\d+)", r"\1", json.dumps(db.lineage()))


@settings(max_examples=150, deadline=None)
@given(searches, outcomes, st.integers(0, 1000), st.integers(0, 1000), st.integers(0, 12))
def test_a_search_interrupted_anywhere_redoes_what_the_interrupt_cancelled(
    search: SearchConfig, results: list[Outcome], first: int, second: int, stop: int
) -> None:
    def outcome(index: int) -> Outcome:
        return results[index % len(results)]

    straight = simulate(search, outcome, random.Random(first), [])
    log: list[Event] = []
    simulate(search, outcome, random.Random(second), log, stop_after=stop, interrupt=True)
    resumed = simulate(search, outcome, random.Random(second + 1), log)
    assert _redos_unnamed(resumed) == _redos_unnamed(straight)
    assert all(c.status != "cancelled" for c in resumed.candidates.values())
    # Interrupted twice: the second redo is a task of its own too.
    again: list[Event] = []
    simulate(search, outcome, random.Random(second), again, stop_after=stop, interrupt=True)
    simulate(search, outcome, random.Random(second), again, stop_after=stop + 1, interrupt=True)
    twice = simulate(search, outcome, random.Random(second + 2), again)
    assert _redos_unnamed(twice) == _redos_unnamed(straight)


@settings(max_examples=150, deadline=None)
@given(outcomes, st.integers(0, 5), st.integers(1, 3), st.integers(1, 3), st.integers(1, 3))
def test_evolution_builds_only_on_its_islands_elites_and_never_on_a_hack(
    results: list[Outcome], seed: int, islands: int, elites: int, migrate_every: int
) -> None:
    search = SearchConfig(
        strategy="evolve",
        samples=2,
        seed=seed,
        generations=4,
        islands=islands,
        elites=elites,
        inspirations=2,
        migrate_every=migrate_every,
    )
    db = simulate(search, lambda i: results[i % len(results)], random.Random(seed), [])
    for c in db.ordered():
        archive = {a.task_id for a in Evolve.archive(db, search, c.island, c.generation)}
        for shown in (*c.parents, *c.inspirations):
            assert shown in archive
            assert db.candidates[shown].verdict != "rejected_static"
        assert not set(c.parents) & set(c.inspirations)
        if c.generation > 0 and archive:
            assert c.parents  # a child of an island with elites has a parent
        for a in archive:  # migrants come from the neighbour, only at migrations
            if db.candidates[a].island != c.island:
                assert db.candidates[a].island == (c.island - 1) % islands
                assert c.generation >= migrate_every


@settings(max_examples=150, deadline=None)
@given(outcomes, st.integers(1, 3), st.integers(1, 3))
def test_a_refinement_tree_expands_the_best_kernels(
    results: list[Outcome], samples: int, expand: int
) -> None:
    search = SearchConfig(strategy="tree", samples=samples, generations=3, expand=expand)
    db = simulate(search, lambda i: results[i % len(results)], random.Random(0), [])
    for g in range(1, 3):
        children = db.generation(g)
        expanded = {p for c in children for p in c.parents}
        best = Tree.expanded(db, search, g)
        assert expanded == {b.task_id for b in best}
        if best:
            scores = sorted((c.score for c in db.before(g) if c.score is not None), reverse=True)
            assert max(db.candidates[t].score or 0 for t in expanded) == scores[0]
            assert len(children) == samples * len(best)


def test_best_of_n_is_one_generation_of_independent_candidates() -> None:
    search = SearchConfig(strategy="best_of_n", samples=5)
    db = simulate(search, lambda i: ("mismatch", None), random.Random(0), [])
    assert [(c.generation, c.parents) for c in db.ordered()] == [(0, ())] * 5


def test_a_pass_is_built_on_before_any_failure() -> None:
    """Kernels are ranked: the fastest pass first, any pass before any failure."""
    results = {0: ("mismatch", None), 1: ("pass", 1.5), 2: ("pass", 2.5)}
    search = SearchConfig(strategy="tree", samples=3, generations=2, expand=1)
    db = simulate(search, lambda i: results.get(i, ("pass", 1.0)), random.Random(0), [])
    assert [c.parents for c in db.generation(1)] == [(f"{S}-2",)] * 3


def test_the_coder_is_shown_its_parent_and_inspirations_with_their_feedback() -> None:
    task = TaskSubmitted(
        task_id="s-3",
        seq=1,
        task_name="relu",
        task_source=(EXAMPLES / "tasks" / "relu.py").read_text(),
        workflow_name="coder_only",
        workflow_yaml=load_workflow("coder_only")[1],
        backend="triton",
        group_id=S,
        prior_kernels=[
            PriorKernel(
                task_id="s-1",
                role="parent",
                code="# parent kernel",
                verdict="mismatch",
                feedback="output: 3 of 8 elements differ",
            ),
            PriorKernel(
                task_id="s-2",
                role="inspiration",
                code="# other kernel",
                verdict="pass",
                speedup=1.7,
            ),
        ],
    )
    state = TaskState("s-3")
    apply(state, task)
    workflow = parse_workflow(task.workflow_yaml, task.workflow_name)
    prompt = agent_messages(state, workflow, "coder")[-1].content
    parent, other = prompt.index("# parent kernel"), prompt.index("# other kernel")
    assert "Kernel to improve (mismatch)" in prompt[:parent]
    assert "3 of 8 elements differ" in prompt[parent:other]
    assert "Another kernel to learn from (pass, 1.70x the baseline)" in prompt[parent:other]


class Ladder:
    """A strategy of one's own: one candidate a generation, built on the best so far."""

    name = "ladder"
    early_win = False

    def rounds(self, settings: SearchConfig) -> int:
        return settings.generations

    def generation(self, db: SearchDatabase, settings: SearchConfig, g: int) -> tuple:
        best = next((c for c in db.before(g) if c.score is not None), None)
        return (CandidateSpec(g, g, parents=(best.task_id,) if best else ()),)


def test_a_strategy_of_ones_own_plugs_in_and_unknown_names_are_listed() -> None:
    register_strategy(Ladder())
    search = SearchConfig(strategy="ladder", generations=3)
    db = simulate(search, lambda i: ("pass", 1.0 + i), random.Random(0), [])
    assert [c.parents for c in db.ordered()] == [(), (f"{S}-0",), (f"{S}-1",)]
    with pytest.raises(UnknownStrategy, match=r"unknown search strategy 'nope'; known: .*ladder"):
        SearchConfig(strategy="nope").check()


def test_each_budget_stops_a_search_where_it_is_reached() -> None:
    db = simulate(
        SearchConfig(strategy="best_of_n", samples=4),
        lambda i: ("mismatch", None),
        random.Random(0),
        [],
    )
    for i, c in enumerate(db.ordered()):  # each candidate: 1,000 tokens, $0.01, 10 s busy
        c.tokens, c.cost_usd = 1000, 0.01
        c.submitted_at, c.ended_at = 100.0 + 10 * i, 110.0 + 10 * i
    assert Budget().reached(db) is None
    assert Budget(candidates=5).reached(db) is None
    assert "candidate budget (5)" in (Budget(candidates=5).reached(db, submitted=1) or "")
    assert "token budget (4000)" in (Budget(tokens=4000).reached(db) or "")
    assert Budget(tokens=4001).reached(db) is None
    assert "dollar budget ($0.04)" in (Budget(dollars=0.04).reached(db) or "")
    assert "wall-time budget (40s)" in (Budget(wall_s=40).reached(db) or "")
    # Busy time: the union of the candidates' spans, not the time between them.
    db.ordered()[3].submitted_at = db.ordered()[3].ended_at = 500.0
    assert db.busy_s() == 30.0 and Budget(wall_s=40).reached(db) is None
