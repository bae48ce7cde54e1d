"""LLM providers, chosen by a spec string such as ``scripted:FILE``."""

from __future__ import annotations

from pathlib import Path

from actors.llm.base import LLMError, LLMProvider, LLMRequest, LLMResponse
from actors.llm.scripted import ScriptedProvider, ScriptError

__all__ = ["LLMError", "LLMProvider", "LLMRequest", "LLMResponse", "make_provider"]


class ProviderSpecError(ValueError):
    pass


def make_provider(spec: str) -> LLMProvider:
    kind, _, arg = spec.partition(":")
    if kind == "scripted":
        if not arg:
            raise ProviderSpecError("--llm scripted:FILE needs the path of a responses file")
        try:
            return ScriptedProvider(Path(arg))
        except ScriptError as exc:
            raise ProviderSpecError(str(exc)) from exc
    raise ProviderSpecError(f"unknown LLM provider {kind!r} in {spec!r}; available: scripted:FILE")
