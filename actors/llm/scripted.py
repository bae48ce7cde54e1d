"""Responses read from a file: the offline demo and tests run the whole system with it.

File format (YAML)::

    designer:            # agent name
      - text: "..."      # the first call of this agent in a task gets this answer
        latency_s: 0.2   # optional: simulated model latency
    coder:
      - "..."            # shorthand for {text: ...}

A task's n-th call of an agent gets entry n, so every task replays the same script and a
call repeated after a crash gets the same answer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from actors.llm.base import LLMError, LLMRequest, LLMResponse
from events.model import Usage


@dataclass(frozen=True)
class ScriptedEntry:
    text: str
    latency_s: float = 0.0


class ScriptError(ValueError):
    pass


def load_script(path: Path) -> dict[str, list[ScriptedEntry]]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read scripted responses: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ScriptError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ScriptError(f"{path}: must map agent names to lists of responses")
    script: dict[str, list[ScriptedEntry]] = {}
    for agent, entries in doc.items():
        if not isinstance(entries, list):
            raise ScriptError(f"{path}: {agent}: must be a list of responses")
        script[str(agent)] = [_entry(path, f"{agent}[{i}]", e) for i, e in enumerate(entries)]
    return script


def _entry(path: Path, where: str, raw: object) -> ScriptedEntry:
    if isinstance(raw, str):
        return ScriptedEntry(raw)
    if isinstance(raw, dict) and isinstance(raw.get("text"), str):
        latency = raw.get("latency_s", 0.0)
        if not isinstance(latency, int | float) or latency < 0:
            raise ScriptError(f"{path}: {where}.latency_s: must be a non-negative number")
        return ScriptedEntry(raw["text"], float(latency))
    raise ScriptError(f"{path}: {where}: must be a string or a mapping with 'text'")


class ScriptedProvider:
    name = "scripted"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.script = load_script(self.path)

    async def complete(self, request: LLMRequest) -> LLMResponse:
        entries = self.script.get(request.agent, [])
        if request.call_index >= len(entries):
            raise LLMError(
                f"scripted responses for agent {request.agent!r} exhausted: {self.path} has "
                f"{len(entries)}, this is call {request.call_index + 1}"
            )
        entry = entries[request.call_index]
        started = time.monotonic()
        if entry.latency_s:
            await asyncio.sleep(entry.latency_s)
        prompt_words = sum(len(m.content.split()) for m in request.messages)
        return LLMResponse(
            text=entry.text,
            provider=self.name,
            model=self.path.name,
            stop_reason="end_turn",
            # Word counts stand in for tokens so budgets and metrics have numbers to show.
            usage=Usage(input_tokens=prompt_words, output_tokens=len(entry.text.split())),
            latency_s=time.monotonic() - started,
        )
