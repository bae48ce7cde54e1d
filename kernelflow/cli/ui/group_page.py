"""A group's page: its rollouts with their rewards and Flow-GRPO advantages
(``projections.flow_grpo``: the rewards ``kernelflow export grpo`` trains on, normalised
within the group), and, for a search, its islands and its tree.

A search is a group whose tasks were submitted with search metadata (``kernelflow.search``;
the search's id is the group id), folded by ``projections.search.SearchDatabase``: each
candidate's generation, island, parents and inspirations, and the verdict and speedup of
the kernel it ended with. Its candidates are drawn by island, in columns, and as a tree
from parents to children. Metadata is whatever the submitter wrote: parents that are not
in the search and cycles of parents are drawn as they are, never followed blindly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kernelflow.cli.ui.data import LocalFold
from kernelflow.cli.ui.html import (
    badge,
    cell,
    esc,
    number,
    sol_cell,
    speedup,
    table,
    task_link,
    task_speedup,
)
from kernelflow.projections.flow_grpo import GroupStats, GrpoOptions, RewardTable
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.search import Candidate, SearchDatabase
from kernelflow.projections.speedups import report_interval

# How a candidate is drawn wherever it appears (an island, the tree).
Node = Callable[[Candidate], str]


def group_fragment(group_id: str, fold: LocalFold) -> str | None:
    """The live part of a group's page; None when no task of the log is in the group."""
    task_ids = fold.group_tasks(group_id)
    if not task_ids:
        return None
    tasks = [fold.metrics.tasks[t] for t in task_ids]
    options = GrpoOptions()
    rewards = RewardTable.from_tasks(tasks, options, fold.metrics.position, fold.rewards.tasks)
    stats = rewards.groups.get(group_id)
    search = fold.searches.get(group_id)
    if search is not None and not search.candidates:
        search = None
    parts = [f"<h1>{'search' if search else 'group'} {esc(group_id)}</h1>"]
    parts.append(_summary(tasks, rewards, stats))
    if search is not None:
        parts.append(search_view(search))
    parts.append("<h2>Rollouts</h2>")
    parts.append(_rollouts(tasks, rewards, stats, options))
    return "".join(parts)


def _summary(tasks: Sequence[TaskMetrics], rewards: RewardTable, stats: GroupStats | None) -> str:
    ended = [t for t in tasks if t.ended]
    succeeded = sum(t.correct for t in ended)
    line = (
        f"{len(tasks)} rollouts: {len(ended)} ended, {succeeded} succeeded, "
        f"{len(tasks) - len(ended)} running. "
    )
    if stats is None:
        line += "Advantages are computed once rollouts end."
    else:
        fns = ", ".join(sorted({r.reward_fn for r in rewards.rollouts.values() if r.ended}))
        line += f"Reward {fns}: mean {number(stats.mean, 3)}, std {number(stats.std, 3)}"
        line += {
            "ok": "; advantage = (reward - mean) / (std + ε).",
            "singleton": "; one rollout ended: its advantage is 0.",
            "zero_variance": "; every reward is the same: advantages are 0 (no signal).",
        }[stats.verdict]
    return f'<p class="card">{esc(line)}</p>'


def _rollouts(
    tasks: Sequence[TaskMetrics],
    rewards: RewardTable,
    stats: GroupStats | None,
    options: GrpoOptions,
) -> str:
    rows = []
    for t in tasks:
        r = rewards.rollouts[t.task_id]
        reward = advantage = "—"
        if r.ended:
            reward = f'{number(r.reward, 3)} <span class="muted">{esc(r.source)}</span>'
            if stats is not None:
                advantage = number(stats.advantage(r.reward, options), 3)
        rows.append(
            [
                task_link(t.task_id),
                badge(t.status),
                str(t.steps),
                " → ".join(badge(v) for v in t.verdicts) or "none",
                task_speedup(t),
                sol_cell(t.final_sol_fraction if t.ended and t.final_verdict == "pass" else None),
                reward,
                advantage,
                cell(t.reason if t.ended else ""),
            ]
        )
    headers = ["task", "status", "steps", "verifications", "speedup", "sol", "reward", "advantage"]
    return table([*headers, "reason"], rows, cls="rollouts")


def candidate_speedup(c: Candidate) -> str:
    interval = report_interval(c.report) if c.report is not None else ()
    return speedup(c.speedup, c.speedup_conclusive, interval)


def search_view(search: SearchDatabase) -> str:
    """Islands in columns and the tree of parents and children, each candidate with its
    verdict and speedup; the best candidate is outlined."""
    candidates = search.ordered()
    best = search.best()
    head = f"{len(candidates)} candidates"
    if best is not None:
        head += f"; best so far {best.task_id} ({best.verdict}, {candidate_speedup(best)})"
    parts = [f'<h2>Search</h2><p class="card">{esc(head)}</p>']

    def node(c: Candidate) -> str:
        bits = [task_link(c.task_id), f"gen {c.generation}", badge(c.verdict or c.status)]
        bits.append(candidate_speedup(c))
        if c.inspirations:
            shown = ", ".join(task_link(i) for i in c.inspirations)
            bits.append(f'<span class="muted">inspired by {shown}</span>')
        cls = ' class="best"' if c is best else ""
        return f'<span{cls} data-task="{esc(c.task_id)}">' + " · ".join(bits) + "</span>"

    if len({c.island for c in candidates}) > 1:
        parts.append("<h2>Islands</h2>" + _islands(candidates, node))
    if any(c.parents for c in candidates):
        parts.append("<h2>Tree</h2>" + _tree(candidates, node))
    return "".join(parts)


def _islands(candidates: Sequence[Candidate], node: Node) -> str:
    islands: dict[int, list[Candidate]] = {}
    for c in candidates:
        islands.setdefault(c.island, []).append(c)
    columns = []
    for island in sorted(islands):
        members = sorted(islands[island], key=lambda c: (c.generation, c.index))
        items = "".join(f"<li>{node(c)}</li>" for c in members)
        columns.append(
            f'<div class="island"><div class="head">island {island}</div><ul>{items}</ul></div>'
        )
    return f'<div class="islands">{"".join(columns)}</div>'


def _tree(candidates: Sequence[Candidate], node: Node) -> str:
    """Each candidate under its first parent in the search (its other parents named
    beside it); candidates without one are roots. Drawn without recursion, each once, so
    that no metadata (a deep chain, a cycle of parents) can break the page."""
    by_id = {c.task_id: c for c in candidates}
    children: dict[str, list[Candidate]] = {c.task_id: [] for c in candidates}
    under: dict[str, str] = {}
    for c in candidates:
        first = next((p for p in c.parents if p in by_id and p != c.task_id), None)
        if first is not None:
            children[first].append(c)
            under[c.task_id] = first

    def label(c: Candidate) -> str:
        others = [p for p in c.parents if p != under.get(c.task_id)]
        if not others:
            return node(c)
        return node(c) + f' <span class="muted">also from {esc(", ".join(others))}</span>'

    drawn: set[str] = set()
    out = ['<ul class="tree">']
    # Roots first; then whatever a cycle of parents left unreached, from its first member.
    for root in [c for c in candidates if c.task_id not in under] + list(candidates):
        if root.task_id in drawn:
            continue
        drawn.add(root.task_id)
        out.append(f"<li>{label(root)}<ul>")
        stack = [iter(children[root.task_id])]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                out.append("</ul></li>")
            elif child.task_id not in drawn:
                drawn.add(child.task_id)
                out.append(f"<li>{label(child)}<ul>")
                stack.append(iter(children[child.task_id]))
    out.append("</ul>")
    return "".join(out)
