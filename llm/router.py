"""The provider every agent talks to: it picks each agent's provider and parameters from
the configuration, enforces the per-run budget, and prices each call."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from kernelflow.common.redact import scrub
from kernelflow.common.suggest import did_you_mean
from kernelflow.llm.base import (
    EndpointUnreachable,
    LLMError,
    LLMProvider,
    LLMRequest,
    LLMResponse,
)
from kernelflow.llm.budget import RunMeter
from kernelflow.llm.config import LLMConfig, ProviderSpecError, credential_free, price_of
from kernelflow.llm.gateway import Gateway
from kernelflow.llm.recording import RecordingProvider, ReplayProvider
from kernelflow.llm.scripted import ScriptedProvider, ScriptError

SPEC_HELP = (
    "available: anthropic[:MODEL], openai:URL[#MODEL], scripted:FILE, record:DIR:SPEC, replay:DIR"
)


class ProviderRouter:
    name = "router"

    def __init__(self, config: LLMConfig) -> None:
        self.config = config
        self.budgets = config.budgets
        self.meter = RunMeter()
        self.gateways: dict[str, Gateway] = {}
        self._providers: dict[str, LLMProvider] = {}
        if config.provider:
            self.provider(config.provider)  # a bad spec is refused before anything runs
        for name, agent in config.agents.items():
            if agent.provider:
                self.provider(agent.provider, f"agents.{name}.provider")
        for key, value in os.environ.items():
            if key.startswith("KF_AGENT_") and key.endswith("_LLM") and value:
                self.provider(value, key)

    def gateway(self, key: str) -> Gateway:
        if key not in self.gateways:
            self.gateways[key] = Gateway(key, self.config.limits)
        return self.gateways[key]

    def provider(self, spec: str, where: str = "--llm") -> LLMProvider:
        if spec not in self._providers:
            self._providers[spec] = self._build(spec, where)
        return self._providers[spec]

    def _build(self, spec: str, where: str) -> LLMProvider:
        kind, _, arg = spec.partition(":")
        shown = scrub(spec)  # errors quote the spec: never a credential in it
        if kind == "scripted":
            if not arg:
                raise ProviderSpecError(
                    f"{where}: scripted:FILE needs the path of a responses file"
                )
            try:
                return ScriptedProvider(Path(arg))
            except ScriptError as exc:
                raise ProviderSpecError(str(exc)) from exc
        if kind == "anthropic":
            from kernelflow.llm.anthropic import AnthropicProvider

            return AnthropicProvider(arg or None, self.gateway("anthropic"))
        if kind == "openai":
            from kernelflow.llm.openai import OpenAIProvider

            url, _, model = credential_free(arg, where, "KF_OPENAI_API_KEY").partition("#")
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ProviderSpecError(
                    f"{where}: {shown!r}: openai needs a base URL, e.g. "
                    "openai:http://127.0.0.1:8000/v1#MODEL"
                )
            return OpenAIProvider(
                url, model or None, self.gateway(f"openai {parts.netloc}"), self.config.openai
            )
        if kind == "record":
            directory, _, inner = arg.partition(":")
            if not directory or not inner:
                raise ProviderSpecError(f"{where}: {shown!r}: use record:DIR:SPEC")
            return RecordingProvider(Path(directory), self._build(inner, where))
        if kind == "replay":
            directory, _, mode = arg.partition("#")
            if not directory or mode not in ("", "position"):
                raise ProviderSpecError(
                    f"{where}: {shown!r}: use replay:DIR or replay:DIR#position"
                )
            try:
                return ReplayProvider(Path(directory), by_position=mode == "position")
            except FileNotFoundError as exc:
                raise ProviderSpecError(str(exc)) from exc
        guess = did_you_mean(kind, ("anthropic", "openai", "scripted", "record", "replay"))
        raise ProviderSpecError(
            f"{where}: unknown LLM provider {kind!r} in {shown!r}{guess} ({SPEC_HELP})"
        )

    async def probe(self, agents: Iterable[str], *, call: bool = False) -> dict[str, str]:
        """Probe, once each, the providers these agents use (``Probed``; a provider with no
        server, scripted or replayed answers, has nothing to reach): spec (as shown) →
        what answered. EndpointUnreachable, naming the spec, for the first that does not;
        an agent with no provider is left to its first call, which says so."""
        found: dict[str, str] = {}
        for agent in agents:
            try:
                spec, _ = self.params_for(agent)
            except ProviderSpecError:
                continue
            shown = scrub(spec)
            if shown in found:
                continue
            probe = getattr(self.provider(spec), "probe", None)
            try:
                found[shown] = "nothing to reach" if probe is None else await probe(call=call)
            except EndpointUnreachable as exc:
                raise EndpointUnreachable(f"LLM {shown}: {exc}") from None
        return found

    def params_for(self, agent: str) -> tuple[str, dict[str, object]]:
        settings = self.config.for_agent(agent)
        if not settings.provider:
            raise ProviderSpecError(
                f"no LLM provider for agent {agent!r}: pass --llm or set KF_LLM, "
                f"KF_AGENT_{agent.upper()}_LLM or KF_LLM_CONFIG"
            )
        params: dict[str, object] = {}
        if settings.temperature is not None:
            params["temperature"] = settings.temperature
        if settings.max_tokens is not None:
            params["max_tokens"] = settings.max_tokens
        return settings.provider, params

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.meter.check(self.budgets)
        try:
            spec, params = self.params_for(request.agent)
            provider = self.provider(spec)
        except ProviderSpecError as exc:
            raise LLMError(str(exc)) from exc
        routed = dataclasses.replace(request, params={**params, **request.params})
        response = await provider.complete(routed)
        cost = response.cost_usd
        if cost is None and (price := price_of(self.config.prices, response.model)):
            cost = round(price.cost(response.usage), 8)
        self.meter.add(response.usage.total_tokens, cost)
        return dataclasses.replace(response, cost_usd=cost, params={**params, **response.params})
