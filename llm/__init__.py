"""LLM providers, chosen by a spec string such as ``anthropic:MODEL`` or ``scripted:FILE``.

``make_provider`` returns a router: each agent's calls go to the provider and parameters
the configuration gives that agent (docs/llm.md), within the per-run budget, priced.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from kernelflow.llm.base import (
    BUDGET_EXHAUSTED,
    BudgetExceeded,
    EndpointUnreachable,
    LLMError,
    LLMProvider,
    LLMRequest,
    LLMResponse,
    is_budget_error,
)
from kernelflow.llm.config import (
    DEFAULT_ANTHROPIC_MODEL,
    Budgets,
    LLMConfig,
    ProviderSpecError,
    load_config,
)
from kernelflow.llm.router import ProviderRouter

__all__ = [
    "BUDGET_EXHAUSTED",
    "BudgetExceeded",
    "EndpointUnreachable",
    "LLMError",
    "LLMProvider",
    "LLMRequest",
    "LLMResponse",
    "ProviderRouter",
    "ProviderSpecError",
    "budgets_of",
    "default_llm_spec",
    "is_budget_error",
    "make_provider",
]


def make_provider(spec: str | None = None, config: LLMConfig | None = None) -> ProviderRouter:
    """The provider for a daemon. ``spec`` (``--llm`` / ``KF_LLM``) is the default provider
    of every agent the configuration does not give one. Raises ProviderSpecError."""
    config = load_config() if config is None else config
    if spec:
        config = dataclasses.replace(config, provider=spec)
    return ProviderRouter(config)


def default_llm_spec(env: Mapping[str, str] | None = None) -> str | None:
    """The provider spec to use when neither ``--llm`` nor ``KF_LLM`` gives one: the
    config file's ``provider``, else ``anthropic:<default model>`` when
    ``ANTHROPIC_API_KEY`` is set, else None. Raises ProviderSpecError on a bad config."""
    env = os.environ if env is None else env
    config = load_config(env)
    if config.provider:
        return config.provider
    if env.get("ANTHROPIC_API_KEY"):
        return f"anthropic:{DEFAULT_ANTHROPIC_MODEL}"
    return None


def budgets_of(provider: object) -> Budgets:
    """The budgets a provider enforces (none for a bare provider)."""
    budgets = getattr(provider, "budgets", None)
    return budgets if isinstance(budgets, Budgets) else Budgets()
