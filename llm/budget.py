"""Token and cost budgets.

Per task: a pure fold over the task's recorded LLM calls, checked by an agent (and the
conductor) before each call. Per run: a meter of what this daemon process spent, checked
by the provider router before each call. Calls already in flight when a budget runs out
finish; no new one starts.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from kernelflow.events.model import LLMCalled
from kernelflow.llm.base import BUDGET_EXHAUSTED, BudgetExceeded
from kernelflow.llm.config import Budgets
from kernelflow.projections.task_state import TaskState


def task_calls(state: TaskState) -> Iterator[LLMCalled]:
    for d in state.dispatches:
        yield from d.llm_calls
    yield from state.conductor_calls.values()


def task_spend(state: TaskState) -> tuple[int, float]:
    """Tokens (all kinds) and USD the task's recorded LLM calls used."""
    tokens, cost = 0, 0.0
    for call in task_calls(state):
        tokens += call.usage.total_tokens
        cost += call.cost_usd or 0.0
    return tokens, cost


def task_budget_error(state: TaskState, budgets: Budgets) -> str | None:
    """Why the task may make no more LLM calls (starts with ``BUDGET_EXHAUSTED``), or None."""
    if not (budgets.task_tokens or budgets.task_cost_usd):
        return None
    tokens, cost = task_spend(state)
    if budgets.task_tokens and tokens >= budgets.task_tokens:
        return f"{BUDGET_EXHAUSTED} the task used {tokens} tokens of its {budgets.task_tokens}"
    if budgets.task_cost_usd and cost >= budgets.task_cost_usd:
        return f"{BUDGET_EXHAUSTED} the task spent ${cost:.4f} of its ${budgets.task_cost_usd:g}"
    return None


class RunMeter:
    """What this process's LLM calls used, across all tasks (thread-safe)."""

    def __init__(self) -> None:
        self.tokens = 0
        self.cost_usd = 0.0
        self.calls = 0
        self._lock = threading.Lock()

    def add(self, tokens: int, cost_usd: float | None) -> None:
        with self._lock:
            self.calls += 1
            self.tokens += tokens
            self.cost_usd += cost_usd or 0.0

    def check(self, budgets: Budgets) -> None:
        with self._lock:
            tokens, cost = self.tokens, self.cost_usd
        if budgets.run_tokens and tokens >= budgets.run_tokens:
            raise BudgetExceeded(f"this run used {tokens} tokens of its {budgets.run_tokens}")
        if budgets.run_cost_usd and cost >= budgets.run_cost_usd:
            raise BudgetExceeded(f"this run spent ${cost:.4f} of its ${budgets.run_cost_usd:g}")
