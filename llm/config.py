"""LLM configuration: which provider, model and sampling parameters each agent uses, the
gateway's limits, budgets, the price table and the prompt override directory.

Sources, lowest precedence first: built-in defaults, the YAML file named by
``KF_LLM_CONFIG``, ``KF_*`` environment variables, then the ``--llm`` flag (which sets
the default provider). Per-agent settings beat the defaults of any source. docs/llm.md
documents every key.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from kernelflow.common.redact import scrub
from kernelflow.common.yaml_error import yaml_problem
from kernelflow.events.model import Usage

DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-5"
# A URL's user-info: an "@" before the path (a "#" or ":" in a password included).
_USER_INFO = re.compile(r"\s*[a-z][a-z0-9+.-]*://[^/]*@", re.IGNORECASE)


class ProviderSpecError(ValueError):
    """A provider spec or LLM configuration that cannot be used (bad user input)."""


def credential_free(url: str, where: str, key_setting: str) -> str:
    """``url``, refused when it carries credentials (``user:password@``): a provider's
    key is the one configured (``key_setting``), sent as a bearer token, never a URL's
    user-info, which would be recorded with every call (``llm_called``'s params), shown
    in logs and errors, and sent as Basic auth in the key's place."""
    if _USER_INFO.match(url):
        raise ProviderSpecError(
            f"{where}: the URL {scrub(url)} carries credentials (user:password@host), which "
            f"kernelflow refuses: give the URL without them and the key in {key_setting}"
        )
    return url


@dataclass(frozen=True)
class AgentLLM:
    """One agent's LLM: a provider spec (None: the default one) and sampling parameters."""

    provider: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None

    def over(self, base: AgentLLM) -> AgentLLM:
        """These settings, with ``base`` filling in what they leave unset."""
        return AgentLLM(
            provider=self.provider if self.provider is not None else base.provider,
            temperature=self.temperature if self.temperature is not None else base.temperature,
            max_tokens=self.max_tokens if self.max_tokens is not None else base.max_tokens,
        )


@dataclass(frozen=True)
class Limits:
    """How the gateway treats a provider endpoint (shared by every call to it)."""

    max_concurrency: int = 8
    requests_per_minute: float = 0.0  # 0: no limit
    tokens_per_minute: float = 0.0  # 0: no limit
    # Burst allowance of the rate limits: a full bucket holds this many seconds of rate.
    rate_window_s: float = 60.0
    timeout_s: float = 300.0  # per attempt
    max_retries: int = 6
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0


@dataclass(frozen=True)
class Budgets:
    """Token and cost limits (0: none). ``task_*`` per task, ``run_*`` per daemon process."""

    task_tokens: int = 0
    task_cost_usd: float = 0.0
    run_tokens: int = 0
    run_cost_usd: float = 0.0


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: float
    output: float
    cache_write: float | None = None  # default 1.25 x input (Anthropic's 5-minute cache)
    cache_read: float | None = None  # default 0.1 x input

    def cost(self, usage: Usage) -> float:
        write = self.cache_write if self.cache_write is not None else self.input * 1.25
        read = self.cache_read if self.cache_read is not None else self.input * 0.1
        return (
            usage.input_tokens * self.input
            + usage.output_tokens * self.output
            + usage.cache_creation_input_tokens * write
            + usage.cache_read_input_tokens * read
        ) / 1_000_000


# List prices at the time of writing; override them in the config file's `prices:`.
DEFAULT_PRICES: dict[str, Price] = {
    "claude-opus-4-5": Price(5.0, 25.0),
    "claude-opus-4": Price(15.0, 75.0),
    "claude-sonnet-4": Price(3.0, 15.0),
    "claude-3-7-sonnet": Price(3.0, 15.0),
    "claude-haiku-4-5": Price(1.0, 5.0),
    "claude-3-5-haiku": Price(0.8, 4.0),
}


def price_of(prices: Mapping[str, Price], model: str) -> Price | None:
    """The price of ``model``: an exact entry, else the longest entry it starts with
    (``claude-sonnet-4`` prices ``claude-sonnet-4-5-20250929``)."""
    if model in prices:
        return prices[model]
    matches = [name for name in prices if model.startswith(name)]
    return prices[max(matches, key=len)] if matches else None


@dataclass(frozen=True)
class OpenAIOptions:
    """What the OpenAI-compatible provider asks the server for."""

    logprobs: bool = True
    top_logprobs: int = 0
    # vLLM's extra parameters for token ids (dropped automatically if the server refuses).
    token_ids: bool = True


@dataclass(frozen=True)
class LLMConfig:
    provider: str | None = None  # the default provider spec
    defaults: AgentLLM = AgentLLM(temperature=None, max_tokens=8192)
    agents: dict[str, AgentLLM] = field(default_factory=dict)
    limits: Limits = Limits()
    budgets: Budgets = Budgets()
    prices: dict[str, Price] = field(default_factory=lambda: dict(DEFAULT_PRICES))
    prompts_dir: Path | None = None
    openai: OpenAIOptions = OpenAIOptions()
    # Where the settings came from, for error messages.
    source: str = "defaults"

    def for_agent(self, agent: str, env: Mapping[str, str] | None = None) -> AgentLLM:
        """The agent's effective settings: KF_AGENT_<AGENT>_* env, then the file's
        ``agents.<agent>``, then the defaults."""
        env = os.environ if env is None else env
        key = "KF_AGENT_" + agent.upper().replace("-", "_")
        from_env = AgentLLM(
            provider=env.get(f"{key}_LLM") or None,
            temperature=_num(env, f"{key}_TEMPERATURE", float),
            max_tokens=_num(env, f"{key}_MAX_TOKENS", int, positive=True),
        )
        resolved = from_env.over(self.agents.get(agent, AgentLLM())).over(self.defaults)
        return replace(resolved, provider=resolved.provider or self.provider)


# Settings that cannot work at 0 (a call that may write no token, or gets no time);
# elsewhere 0 is a usable value or means "no limit".
_POSITIVE = {"max_tokens", "timeout_s", "rate_window_s"}


def _num(
    env: Mapping[str, str], name: str, kind: type[float] | type[int], *, positive: bool = False
) -> Any:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = kind(raw)
    except ValueError as exc:
        raise ProviderSpecError(f"{name}={raw!r}: expected {kind.__name__}") from exc
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        expected = "positive" if positive else "not negative"
        raise ProviderSpecError(f"{name}={raw!r}: must be a finite number, {expected}")
    return value


def _section(where: str, raw: object, cls: type[Any]) -> Any:
    """Build dataclass ``cls`` from a mapping, refusing unknown keys and wrong types."""
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ProviderSpecError(f"{where}: must be a mapping")
    known = {f.name: f for f in fields(cls)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise ProviderSpecError(f"{where}.{key}: unknown key; known: {', '.join(known)}")
        want = known[key].type
        if "bool" in str(want):
            ok = isinstance(value, bool)
        elif "str" in str(want):
            ok = value is None or isinstance(value, str)
        elif "int" in str(want) and "float" not in str(want):
            ok = (value is None and "None" in str(want)) or (
                isinstance(value, int) and not isinstance(value, bool) and value >= 0
            )
        else:
            ok = (value is None and "None" in str(want)) or (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            )
        if not ok:
            raise ProviderSpecError(f"{where}.{key}: {value!r} is not a valid {want}")
        if key in _POSITIVE and value == 0:
            raise ProviderSpecError(f"{where}.{key}: must be positive")
        values[key] = value
    return cls(**values)


def parse_config(doc: object, source: str) -> LLMConfig:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ProviderSpecError(f"{source}: must be a mapping")
    allowed = {
        "provider",
        "temperature",
        "max_tokens",
        "agents",
        "limits",
        "budgets",
        "prices",
        "prompts_dir",
        "openai",
    }
    for key in doc:
        if key not in allowed:
            raise ProviderSpecError(f"{source}: {key}: unknown key; known: {', '.join(allowed)}")
    base = LLMConfig()
    defaults = _section(
        source,
        {k: doc[k] for k in ("provider", "temperature", "max_tokens") if k in doc},
        AgentLLM,
    ).over(base.defaults)
    agents_raw = doc.get("agents") or {}
    if not isinstance(agents_raw, dict):
        raise ProviderSpecError(f"{source}: agents: must map agent names to settings")
    agents = {
        str(name): _section(f"{source}: agents.{name}", raw, AgentLLM)
        for name, raw in agents_raw.items()
    }
    prices = dict(DEFAULT_PRICES)
    prices_raw = doc.get("prices") or {}
    if not isinstance(prices_raw, dict):
        raise ProviderSpecError(f"{source}: prices: must map model names to prices")
    for model, raw in prices_raw.items():
        price = _section(f"{source}: prices.{model}", raw, _PriceFields)
        if price.input is None or price.output is None:
            raise ProviderSpecError(f"{source}: prices.{model}: needs input and output")
        prices[str(model)] = Price(price.input, price.output, price.cache_write, price.cache_read)
    prompts_dir = doc.get("prompts_dir")
    if prompts_dir is not None and not isinstance(prompts_dir, str):
        raise ProviderSpecError(f"{source}: prompts_dir: must be a path")
    return LLMConfig(
        provider=defaults.provider,
        defaults=replace(defaults, provider=None),
        agents=agents,
        limits=_section(f"{source}: limits", doc.get("limits"), Limits),
        budgets=_section(f"{source}: budgets", doc.get("budgets"), Budgets),
        prices=prices,
        prompts_dir=Path(prompts_dir) if prompts_dir else None,
        openai=_section(f"{source}: openai", doc.get("openai"), OpenAIOptions),
        source=source,
    )


@dataclass(frozen=True)
class _PriceFields:
    input: float | None = None
    output: float | None = None
    cache_write: float | None = None
    cache_read: float | None = None


_LIMIT_ENV = {
    "KF_LLM_CONCURRENCY": ("max_concurrency", int),
    "KF_LLM_RPM": ("requests_per_minute", float),
    "KF_LLM_TPM": ("tokens_per_minute", float),
    "KF_LLM_TIMEOUT": ("timeout_s", float),
    "KF_LLM_MAX_RETRIES": ("max_retries", int),
}
_BUDGET_ENV = {
    "KF_BUDGET_TASK_TOKENS": ("task_tokens", int),
    "KF_BUDGET_TASK_USD": ("task_cost_usd", float),
    "KF_BUDGET_RUN_TOKENS": ("run_tokens", int),
    "KF_BUDGET_RUN_USD": ("run_cost_usd", float),
}


def load_config(env: Mapping[str, str] | None = None) -> LLMConfig:
    """The configuration from ``KF_LLM_CONFIG`` (if set) with ``KF_*`` overrides."""
    env = os.environ if env is None else env
    path = env.get("KF_LLM_CONFIG")
    if path:
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ProviderSpecError(f"KF_LLM_CONFIG={path}: cannot read: {exc}") from exc
        except yaml.YAMLError as exc:
            problem = yaml_problem(exc)
            raise ProviderSpecError(f"KF_LLM_CONFIG={path}: not valid YAML: {problem}") from exc
        config = parse_config(doc, path)
    else:
        config = LLMConfig()
    limits = {
        attr: value
        for name, (attr, kind) in _LIMIT_ENV.items()
        if (value := _num(env, name, kind, positive=attr in _POSITIVE)) is not None
    }
    budgets = {
        attr: value
        for name, (attr, kind) in _BUDGET_ENV.items()
        if (value := _num(env, name, kind)) is not None
    }
    defaults = AgentLLM(
        temperature=_num(env, "KF_LLM_TEMPERATURE", float),
        max_tokens=_num(env, "KF_LLM_MAX_TOKENS", int, positive=True),
    ).over(config.defaults)
    prompts_dir = env.get("KF_PROMPTS_DIR")
    return replace(
        config,
        defaults=defaults,
        limits=replace(config.limits, **limits),
        budgets=replace(config.budgets, **budgets),
        prompts_dir=Path(prompts_dir) if prompts_dir else config.prompts_dir,
    )
