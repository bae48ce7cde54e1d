"""Search strategies: what to try next, as a pure function of the search's database.

A strategy plans a search in generations: ``generation(db, settings, g)`` gives the
candidates of generation ``g`` (each with its parents and inspirations) as a function of
the candidates of the generations before ``g`` only (their kernels, verdicts, speedups)
and of the seed. ``plan`` asks it for the generation to run now, or None when the search
is over. Asked again at any point, a strategy plans the same generation the same way,
which is what lets a search killed at any point resume exactly (the driver submits what
of that generation is not in the log yet, under the same task ids, and waits for the
rest).

Built in:

- ``best_of_n``: one generation of ``samples`` independent candidates; with ``early_win``
  (its default) the first one that passes ends the search and the rest are cancelled.
- ``evolve``: islands, each with an elite archive (its best ``elites`` kernels, plus the
  best of its neighbour every ``migrate_every`` generations); every generation each island
  gets ``samples`` children, each of a parent drawn from its archive (a tournament of two)
  and shown up to ``inspirations`` other elites, with their verifier feedback and timings.
- ``tree``: refinement tree: every generation expands the ``expand`` best kernels so far
  (fewest children first among equals) with ``samples`` children each.

Third-party strategies register through the entry-point group ``kernelflow.search``
(an object with ``name``, ``early_win``, ``rounds`` and ``generation``), or
``register_strategy``.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Protocol

from kernelflow.common.plugins import load_plugins, unknown_name
from kernelflow.projections.search import Candidate, SearchDatabase

ENTRY_POINT_GROUP = "kernelflow.search"


@dataclass(frozen=True)
class SearchConfig:
    """What a search was asked to do; recorded with every candidate (``search_settings``)
    so a resumed search can tell it is the same search."""

    strategy: str = "best_of_n"
    samples: int = 4  # per generation (evolve: per island; tree: per expanded kernel)
    seed: int = 0
    generations: int = 3  # evolve and tree, generation 0 included
    islands: int = 2
    elites: int = 3
    inspirations: int = 2
    migrate_every: int = 2
    expand: int = 2
    # Stop at the first pass (None: the strategy's own default).
    early_win: bool | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def check(self) -> None:
        """Raise ValueError for settings no search can run with."""
        for name in ("samples", "generations", "islands", "elites", "migrate_every", "expand"):
            if getattr(self, name) < 1:
                spelt = name.replace("_", "-")
                raise ValueError(f"{spelt} must be at least 1, got {getattr(self, name)}")
        if self.inspirations < 0:
            raise ValueError(f"inspirations must be 0 or more, got {self.inspirations}")
        strategy(self.strategy)


@dataclass(frozen=True)
class CandidateSpec:
    """One candidate to run: its place in the search and the kernels its coder is shown."""

    index: int
    generation: int
    island: int = 0
    parents: tuple[str, ...] = ()
    inspirations: tuple[str, ...] = ()


@dataclass(frozen=True)
class Generation:
    index: int
    candidates: tuple[CandidateSpec, ...] = field(default_factory=tuple)


class Strategy(Protocol):
    name: str
    early_win: bool  # whether the first pass ends the search, by default

    def rounds(self, settings: SearchConfig) -> int:
        """How many generations the search has (it may stop earlier)."""
        ...

    def generation(
        self, db: SearchDatabase, settings: SearchConfig, g: int
    ) -> tuple[CandidateSpec, ...]:
        """The candidates of generation ``g``, from the candidates of the generations
        before it only (``db.before(g)``) and the seed."""
        ...


def plan(found: Strategy, db: SearchDatabase, settings: SearchConfig) -> Generation | None:
    """The generation to run now: the newest one while any of its candidates is not in the
    log or not over, else the next one; None once the strategy's generations are done."""
    g = max((c.generation for c in db.candidates.values()), default=0)
    specs = found.generation(db, settings, g)
    recorded = {c.index for c in db.generation(g)}
    if not db.candidates or any(s.index not in recorded for s in specs):
        return Generation(g, specs)
    if not all(c.ended for c in db.generation(g)):
        return Generation(g, specs)
    if g + 1 >= found.rounds(settings):
        return None
    return Generation(g + 1, found.generation(db, settings, g + 1))


def _rng(settings: SearchConfig, *where: int) -> random.Random:
    # A string seed is hashed (SHA-512) the same way in every process and Python version.
    return random.Random(":".join(str(x) for x in (settings.seed, *where)))


def _first_index(db: SearchDatabase, g: int) -> int:
    """The first candidate number of generation ``g``: after those of the ones before."""
    return sum(1 for c in db.candidates.values() if c.generation < g)


class BestOfN:
    name = "best_of_n"
    early_win = True

    def rounds(self, settings: SearchConfig) -> int:
        return 1

    def generation(
        self, db: SearchDatabase, settings: SearchConfig, g: int
    ) -> tuple[CandidateSpec, ...]:
        return tuple(CandidateSpec(i, 0) for i in range(settings.samples))


class Evolve:
    name = "evolve"
    early_win = False

    def rounds(self, settings: SearchConfig) -> int:
        return settings.generations

    def generation(
        self, db: SearchDatabase, settings: SearchConfig, g: int
    ) -> tuple[CandidateSpec, ...]:
        first = _first_index(db, g)
        specs = []
        for island in range(settings.islands):
            archive = self.archive(db, settings, island, g)
            for slot in range(settings.samples):
                rng = _rng(settings, g, island, slot)
                parent = _tournament(archive, rng)
                others = [c for c in archive if parent is None or c.task_id != parent.task_id]
                shown = rng.sample(others, min(settings.inspirations, len(others)))
                specs.append(
                    CandidateSpec(
                        index=first + island * settings.samples + slot,
                        generation=g,
                        island=island,
                        parents=(parent.task_id,) if parent is not None else (),
                        inspirations=tuple(c.task_id for c in shown),
                    )
                )
        return tuple(specs)

    @staticmethod
    def archive(db: SearchDatabase, settings: SearchConfig, island: int, g: int) -> list[Candidate]:
        """The island's elites before generation ``g``: its best ``elites`` kernels, with
        the best kernel its neighbour (island - 1) had at each migration (every
        ``migrate_every`` generations), best first."""
        own = [c for c in db.before(g, island) if c.score is not None]
        neighbour = (island - 1) % settings.islands
        migrants: dict[str, Candidate] = {}
        if neighbour != island:
            for m in range(settings.migrate_every, g + 1, settings.migrate_every):
                best = next((c for c in db.before(m, neighbour) if c.score is not None), None)
                if best is not None:
                    migrants[best.task_id] = best
        pool = {c.task_id: c for c in own[: settings.elites]} | migrants
        return sorted(pool.values(), key=Candidate.sort_key)


def _tournament(archive: list[Candidate], rng: random.Random) -> Candidate | None:
    """The better of two elites drawn at random (the only one, or none)."""
    if not archive:
        return None
    a, b = rng.choice(archive), rng.choice(archive)
    return min(a, b, key=Candidate.sort_key)


class Tree:
    name = "tree"
    early_win = False

    def rounds(self, settings: SearchConfig) -> int:
        return settings.generations

    def generation(
        self, db: SearchDatabase, settings: SearchConfig, g: int
    ) -> tuple[CandidateSpec, ...]:
        first = _first_index(db, g)
        nodes = self.expanded(db, settings, g) if g > 0 else []
        if not nodes:  # the roots, or nothing yet worth refining: fresh attempts
            return tuple(CandidateSpec(first + i, g) for i in range(settings.samples))
        return tuple(
            CandidateSpec(first + n * settings.samples + i, g, parents=(node.task_id,))
            for n, node in enumerate(nodes)
            for i in range(settings.samples)
        )

    @staticmethod
    def expanded(db: SearchDatabase, settings: SearchConfig, g: int) -> list[Candidate]:
        """The ``expand`` best kernels before generation ``g``; among equally good ones,
        those with fewer children first."""
        earlier = db.before(g)
        children: dict[str, int] = {}
        for c in earlier:
            for p in c.parents:
                children[p] = children.get(p, 0) + 1
        nodes = [c for c in earlier if c.score is not None]
        nodes.sort(key=lambda c: (c.sort_key()[0], children.get(c.task_id, 0), c.index))
        return nodes[: settings.expand]


_STRATEGIES: dict[str, Strategy] = {}


class UnknownStrategy(ValueError):
    pass


def register_strategy(found: Strategy) -> Strategy:
    known = _STRATEGIES.get(found.name)
    if known is not None and known is not found:
        raise ValueError(f"search strategy {found.name!r} is already registered")
    _STRATEGIES[found.name] = found
    return found


@cache
def _plugins() -> tuple[str, ...]:
    def problem(name: str, obj: object) -> str | None:
        if callable(getattr(obj, "generation", None)) and getattr(obj, "name", None) == name:
            return None
        return f"is not a search strategy named {name!r}"

    def register(name: str, obj: object) -> None:
        if name not in _STRATEGIES:
            register_strategy(obj)  # type: ignore[arg-type]

    return load_plugins(ENTRY_POINT_GROUP, problem, register)


def strategy_names() -> list[str]:
    _plugins()
    return sorted(_STRATEGIES)


def strategy(name: str) -> Strategy:
    if name not in _STRATEGIES:
        problems = _plugins()
        if name not in _STRATEGIES:
            raise UnknownStrategy(unknown_name("search strategy", name, _STRATEGIES, problems))
    return _STRATEGIES[name]


for _builtin in (BestOfN(), Evolve(), Tree()):
    register_strategy(_builtin)
