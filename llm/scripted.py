"""Responses read from a file: the offline demo and tests run the whole system with it.

File format (YAML)::

    designer:            # agent name
      - text: "..."      # the first call of this agent in a task gets this answer
        latency_s: 0.2   # optional: simulated model latency
    coder:
      - "..."            # shorthand for {text: ...}
      - tool_calls:      # native tool calls (``text`` is then optional, default "")
          - name: read_file
            args: {path: kernel.py}
            id: call_a   # optional; default call_<call index>_<n>
    solver:
      - choices:         # the samples of a group answer differently: one of these each
          - "Final Answer: 42"
          - {text: "Final Answer: 41", latency_s: 0.1}

A task's n-th call of an agent gets entry n, so every task replays the same script and a
call repeated after a crash gets the same answer (and the same tool call ids). An entry
with ``choices`` (entries as above) gives sample k of a group ``choices[k % len(choices)]``,
k being the number that ends the task id (``kernelflow rollout`` names its tasks
``ro-<run>-<prompt>-<k>`` from k = 0, ``submit --samples N`` ``<id>-1`` … ``<id>-N``); a
task id that ends in no number picks by a hash of the id. Still deterministic per task.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from kernelflow.common.yaml_error import yaml_problem
from kernelflow.events.model import ToolUse, Usage
from kernelflow.llm.base import LLMError, LLMRequest, LLMResponse

TOOL_CALL_KEYS = ("name", "args", "id")


@dataclass(frozen=True)
class ScriptedEntry:
    text: str
    latency_s: float = 0.0
    # An empty id is given its default when the call is answered (it needs the call index).
    tool_calls: tuple[ToolUse, ...] = ()
    # The samples of a group pick one of these instead (see ``sample_index``).
    choices: tuple[ScriptedEntry, ...] = ()

    def for_task(self, task_id: str) -> ScriptedEntry:
        if not self.choices:
            return self
        return self.choices[sample_index(task_id) % len(self.choices)]


_TRAILING_NUMBER = re.compile(r"(\d+)$")


def sample_index(task_id: str) -> int:
    """Which sample of its group a task is: the number its id ends with, else a stable
    hash of the id."""
    match = _TRAILING_NUMBER.search(task_id)
    if match:
        return int(match.group(1))
    return int.from_bytes(hashlib.sha256(task_id.encode()).digest()[:4], "big")


class ScriptError(ValueError):
    pass


def load_script(path: Path) -> dict[str, list[ScriptedEntry]]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read scripted responses: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ScriptError(f"{path}: not valid YAML: {yaml_problem(exc)}") from exc
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
    if isinstance(raw, dict) and "choices" in raw:
        return _choices(path, where, raw)
    if not isinstance(raw, dict) or not ("text" in raw or "tool_calls" in raw):
        raise ScriptError(
            f"{path}: {where}: must be a string or a mapping with 'text', 'tool_calls' or 'choices'"
        )
    text = raw.get("text", "")
    if not isinstance(text, str):
        raise ScriptError(f"{path}: {where}.text: must be a string")
    latency = raw.get("latency_s", 0.0)
    if not isinstance(latency, int | float) or latency < 0:
        raise ScriptError(f"{path}: {where}.latency_s: must be a non-negative number")
    calls = raw.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ScriptError(f"{path}: {where}.tool_calls: must be a list of {{name, args, id}}")
    tool_calls = tuple(
        _tool_call(path, f"{where}.tool_calls[{n}]", call) for n, call in enumerate(calls)
    )
    return ScriptedEntry(text, float(latency), tool_calls)


def _choices(path: Path, where: str, raw: dict[object, object]) -> ScriptedEntry:
    choices = raw["choices"]
    if len(raw) != 1 or not isinstance(choices, list) or not choices:
        raise ScriptError(
            f"{path}: {where}: 'choices' must be a non-empty list of responses, alone in its entry"
        )
    picked = [_entry(path, f"{where}.choices[{n}]", c) for n, c in enumerate(choices)]
    if any(p.choices for p in picked):
        raise ScriptError(f"{path}: {where}: a choice cannot have choices of its own")
    return ScriptedEntry("", choices=tuple(picked))


def _tool_call(path: Path, where: str, raw: object) -> ToolUse:
    if not isinstance(raw, dict):
        raise ScriptError(f"{path}: {where}: must be a mapping with 'name' (and 'args', 'id')")
    unknown = sorted(str(k) for k in raw if k not in TOOL_CALL_KEYS)
    if unknown:
        raise ScriptError(f"{path}: {where}: unknown key {unknown[0]!r} (use name, args, id)")
    name, args, call_id = raw.get("name"), raw.get("args", {}), raw.get("id", "")
    if not isinstance(name, str) or not name:
        raise ScriptError(f"{path}: {where}.name: must be a non-empty string")
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise ScriptError(f"{path}: {where}.args: must be a mapping of argument names to values")
    if not isinstance(call_id, str):
        raise ScriptError(f"{path}: {where}.id: must be a string")
    return ToolUse(id=call_id, name=name, args=args)


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
        entry = entries[request.call_index].for_task(request.task_id)
        started = time.monotonic()
        if entry.latency_s:
            await asyncio.sleep(entry.latency_s)
        tool_calls = [
            ToolUse(id=c.id or f"call_{request.call_index}_{n}", name=c.name, args=c.args)
            for n, c in enumerate(entry.tool_calls)
        ]
        prompt_words = sum(len(m.content.split()) for m in request.messages)
        answer_words = len(entry.text.split()) + sum(
            1 + len(json.dumps(c.args).split()) for c in tool_calls
        )
        return LLMResponse(
            text=entry.text,
            provider=self.name,
            model=self.path.name,
            stop_reason="tool_use" if tool_calls else "end_turn",
            # Word counts stand in for tokens so budgets and metrics have numbers to show.
            usage=Usage(input_tokens=prompt_words, output_tokens=answer_words),
            latency_s=time.monotonic() - started,
            tool_calls=tool_calls,
        )
