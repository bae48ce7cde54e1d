"""What each projection does with each kind of event, decided for every one of them.

A projection's handler table is built by ``handler_table``, which refuses (at import) a
table that leaves an event type undecided: every type of ``EVENT_TYPES`` is either handled
or named as ignored. Adding an event type therefore makes each projection that has not
decided about it fail loudly instead of silently skipping it.

Events of a kind this version does not know (``UnknownEvent``, written by a newer
kernelflow) have no handler anywhere: projections skip them. They still take their place
in a task's sequence, which the folds count (``TaskState.last``, ``TaskMetrics.last_seq``)
so that appends and deduplication stay right.

Messages of the log that are not events of their task (``QuarantinedEvent`` placeholders:
see ``kernelflow.events.quarantine``) have no handler either, and take no place in their
task's sequence: the folds that count events skip them before counting
(``task_state.apply``; ``MetricsProjection.apply`` only counts them, as ``quarantined``).
Like ``UnknownEvent`` they are not in ``EVENT_TYPES``, so no table can name them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from kernelflow.events.model import EVENT_TYPES, Event

H = TypeVar("H")

# projection name -> (handled, ignored) event types, for tests and docs to enumerate.
DECISIONS: dict[str, tuple[frozenset[type[Event]], frozenset[type[Event]]]] = {}


class UndecidedEvents(TypeError):
    """A projection's table leaves an event type neither handled nor ignored."""


def handler_table(
    projection: str, handled: Mapping[type[Event], H], *, ignored: Iterable[type[Event]]
) -> dict[type[Event], H]:
    """``handled`` as a plain dict (a lookup by exact type: replays fold millions of
    events), once checked to decide about every event type exactly once."""
    handled_types, ignored_types = frozenset(handled), frozenset(ignored)
    undecided = set(EVENT_TYPES) - handled_types - ignored_types
    twice = handled_types & ignored_types
    strangers = (handled_types | ignored_types) - set(EVENT_TYPES)
    if undecided or twice or strangers:
        problems = [
            f"{label}: {', '.join(sorted(t.__name__ for t in types))}"
            for label, types in (
                ("neither handled nor ignored", undecided),
                ("both handled and ignored", twice),
                ("not event types of this version", strangers),
            )
            if types
        ]
        raise UndecidedEvents(f"projection {projection!r}: " + "; ".join(problems))
    DECISIONS[projection] = (handled_types, ignored_types)
    return dict(handled)
