"""How the read model's state is saved: sealed pages and a small head, so that a save costs
what changed since the last one, not the whole history.

A daemon saves its read model every few seconds. Saved whole, that is every row of every
task the log ever held (some 750 bytes of JSON each) plus every latency recorded: after a
few weeks of work, tens of megabytes encoded on the daemon's loop and rewritten to
JetStream at each save. Instead, rows are sealed, in the order tasks first appeared, into
pages of ``page_rows`` rows that are written once, and each save writes a head: the
position, the run-wide tallies, the rows not in a page yet, and the sealed rows that
changed after their page was sealed (a reward recorded late, a task that was still
running).

Page ``k`` holds rows ``k*R`` to ``(k+1)*R - 1`` (``R = page_rows``, counting from 0) as
they were when the ``(k+2)*R``-th row appeared, with the latencies recorded since page
``k - 1``: a function of the log alone. Every read model of one log seals the same pages,
byte for byte, at the same positions, whether it folded from the start or resumed from
any head; so any daemon may store a page, and a head's list of rows changed since their
page holds whichever daemon stored it. A head counts its pages, and a save stores them
before it.

Pure: ``kernelflow.actors.readmodel`` does the storing and the loading.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from kernelflow.events.model import Event
from kernelflow.projections.metrics import (
    FOLD_VERSION,
    MetricsProjection,
    MetricsState,
    TaskMetrics,
    share_names,
)

PAGE_ROWS = 1000  # a page of JSON is then ~1 MB; fewer than 2 pages of rows wait unsealed


class Snapshot(msgspec.Struct, kw_only=True):
    """The head: the state without the rows and latencies its ``pages`` hold."""

    fold_version: int
    stream_created: str  # the log it is a fold of (a recreated stream starts again at 1)
    saved_at: float
    page_rows: int = PAGE_ROWS
    pages: int = 0
    state: MetricsState


class Page(msgspec.Struct, kw_only=True):
    fold_version: int
    stream_created: str
    index: int
    position: int  # where it was sealed: where the (index + 2) * R-th row appeared
    tasks: list[TaskMetrics]
    agent_latency_s: dict[str, list[float]]  # recorded since the page before
    llm_latency_s: dict[str, list[float]]


def page_name(head_name: str, page_rows: int, index: int) -> str:
    return f"{head_name}.rows{page_rows}.page{index:06d}"


class PagedMetrics:
    """A ``MetricsProjection`` that seals its rows into pages as it folds. ``apply`` as
    the projection's; ``unstored`` lists the pages sealed and not stored yet (the read
    model stores them and takes them off); ``head`` is what a save writes then."""

    def __init__(
        self, stream_created: str = "", page_rows: int = PAGE_ROWS, *, seal: bool = True
    ) -> None:
        self.projection = MetricsProjection()
        self.stream_created = stream_created
        self.page_rows = page_rows
        self.seal = seal  # False: nothing is saved, so nothing is sealed
        self.rows: list[TaskMetrics] = []  # in the order tasks first appeared
        self.pages = 0
        self.unstored: list[tuple[int, bytes]] = []  # (index, the page's JSON)
        self._sealed_ids: set[str] = set()
        self._changed: set[str] = set()  # sealed rows changed since: the head carries them
        # How many of each latency list the pages hold (agent dispatch, LLM call).
        self._sealed_agent: dict[str, int] = {}
        self._sealed_llm: dict[str, int] = {}

    def apply(self, position: int, event: Event) -> bool:
        tasks = self.projection.tasks
        before = len(tasks)
        if not self.projection.apply(position, event):
            return False
        if len(tasks) > before:
            self.rows.append(tasks[event.task_id])
            if self.seal and len(self.rows) == (self.pages + 2) * self.page_rows:
                self._seal_page()
        elif event.task_id in self._sealed_ids:
            self._changed.add(event.task_id)
        return True

    def _seal_page(self) -> None:
        k, r = self.pages, self.page_rows
        st = self.projection.state
        page = Page(
            fold_version=FOLD_VERSION,
            stream_created=self.stream_created,
            index=k,
            position=st.position,
            tasks=self.rows[k * r : (k + 1) * r],
            agent_latency_s=_unsealed(st.agent_latency_s, self._sealed_agent),
            llm_latency_s=_unsealed(st.llm_latency_s, self._sealed_llm),
        )
        self.unstored.append((k, msgspec.json.encode(page)))
        self._sealed_ids.update(t.task_id for t in page.tasks)
        self._sealed_agent = _lengths(st.agent_latency_s)
        self._sealed_llm = _lengths(st.llm_latency_s)
        self.pages += 1

    def head(self, saved_at: float) -> Snapshot:
        """The head of the state now (its pages must be stored before it)."""
        st = self.projection.state
        tasks = st.tasks
        rest = {tid: tasks[tid] for tid in sorted(self._changed)}
        rest.update((t.task_id, t) for t in self.rows[self.pages * self.page_rows :])
        return Snapshot(
            fold_version=FOLD_VERSION,
            stream_created=self.stream_created,
            saved_at=saved_at,
            page_rows=self.page_rows,
            pages=self.pages,
            state=msgspec.structs.replace(
                st,
                tasks=rest,
                agent_latency_s=_unsealed(st.agent_latency_s, self._sealed_agent),
                llm_latency_s=_unsealed(st.llm_latency_s, self._sealed_llm),
            ),
        )

    @classmethod
    def restore(cls, head: Snapshot, pages: Iterable[Page]) -> PagedMetrics:
        """The state a head and its pages (in order) were saved from. Raises ValueError
        (saying why) when they are not the parts of one saved state."""
        paged = cls(head.stream_created, head.page_rows)
        tasks: dict[str, TaskMetrics] = {}
        agent: dict[str, list[float]] = {}
        llm: dict[str, list[float]] = {}
        for page in pages:
            found = (page.fold_version, page.stream_created, page.index, len(page.tasks))
            wanted = (head.fold_version, head.stream_created, paged.pages, head.page_rows)
            if found != wanted:
                raise ValueError(f"page {paged.pages} is not this head's: {found} != {wanted}")
            for t in page.tasks:
                share_names(t)
                tasks[t.task_id] = t
            _extend(agent, page.agent_latency_s)
            _extend(llm, page.llm_latency_s)
            paged.pages += 1
        if paged.pages != head.pages:
            raise ValueError(f"the head counts {head.pages} pages, {paged.pages} were found")
        paged._sealed_ids = set(tasks)
        paged._sealed_agent, paged._sealed_llm = _lengths(agent), _lengths(llm)
        for tid, t in head.state.tasks.items():
            share_names(t)
            if tid in paged._sealed_ids:
                paged._changed.add(tid)
            tasks[tid] = t  # a sealed row keeps its place; the others follow in order
        _extend(agent, head.state.agent_latency_s)
        _extend(llm, head.state.llm_latency_s)
        paged.projection = MetricsProjection(
            msgspec.structs.replace(
                head.state, tasks=tasks, agent_latency_s=agent, llm_latency_s=llm
            )
        )
        paged.rows = list(tasks.values())
        if len(paged.rows) >= (paged.pages + 2) * paged.page_rows:
            # Sealing now would not seal at the position the log decides.
            raise ValueError(f"{len(paged.rows)} rows: page {paged.pages} was never sealed")
        return paged


def _lengths(lists: dict[str, list[float]]) -> dict[str, int]:
    return {name: len(values) for name, values in lists.items()}


def _unsealed(lists: dict[str, list[float]], sealed: dict[str, int]) -> dict[str, list[float]]:
    return {name: values[sealed.get(name, 0) :] for name, values in lists.items()}


def _extend(lists: dict[str, list[float]], more: dict[str, list[float]]) -> None:
    for name, values in more.items():
        lists.setdefault(name, []).extend(values)
