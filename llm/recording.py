"""Record and replay LLM exchanges.

``record:DIR:SPEC`` calls the provider ``SPEC`` and stores every exchange in ``DIR`` as
``<key>.json``; ``replay:DIR`` answers from those files and fails clearly on a request it
has never seen. The key is a hash of what the model was shown: the agent, the prompt
messages (with the tool calls and tool results they carry) and the tools offered. Task
ids, call positions, models and sampling parameters are not part of it, so a recorded run
replays under any task id and any configuration.

A prompt that embeds something that differs from run to run (a verifier's feedback on
uninitialised memory, timings) cannot match its record. ``replay:DIR#position`` then
falls back to the record of the same agent's call at the same position in its task
(``pos-<agent>-<n>.json``, the last task recorded wins) and says so in the call's params.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from kernelflow.events.model import ToolUse, Usage
from kernelflow.llm.base import LLMError, LLMProvider, LLMRequest, LLMResponse

RECORD_VERSION = 1


def request_key(request: LLMRequest) -> str:
    # Tool fields join the key only where present: records of plain calls keep their keys.
    # Tool call ids count only as which result answers which call: ids of calls parsed from
    # text embed the task id, and a record must replay under any task id.
    ids: dict[str, int] = {}
    messages: list[list[Any]] = []
    for m in request.messages:
        shown: list[Any] = [m.role, m.content]
        if m.tool_calls:
            calls = [[ids.setdefault(c.id, len(ids)), c.name, c.args] for c in m.tool_calls]
            shown.append({"tool_calls": calls})
        if m.tool_call_id is not None:
            shown.append({"tool_call_id": ids.setdefault(m.tool_call_id, len(ids))})
        messages.append(shown)
    key: dict[str, Any] = {"agent": request.agent, "messages": messages}
    if request.tools:
        key["tools"] = request.tools
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


class RecordingProvider:
    name = "record"

    def __init__(self, directory: Path, inner: LLMProvider) -> None:
        self.directory = Path(directory)
        self.inner = inner
        self.directory.mkdir(parents=True, exist_ok=True)

    async def probe(self, *, call: bool = False) -> str:
        """The recorded provider's probe (``Probed``), where it has a server."""
        probe = getattr(self.inner, "probe", None)
        return "nothing to reach" if probe is None else str(await probe(call=call))

    async def complete(self, request: LLMRequest) -> LLMResponse:
        response = await self.inner.complete(request)
        key = request_key(request)
        record = {
            "version": RECORD_VERSION,
            "key": key,
            "recorded_at": time.time(),
            "agent": request.agent,
            "messages": msgspec.to_builtins(request.messages),
            "params": request.params,
            "tools": request.tools,
            "response": {
                "text": response.text,
                "provider": response.provider,
                "model": response.model,
                "stop_reason": response.stop_reason,
                "usage": msgspec.to_builtins(response.usage),
                "latency_s": response.latency_s,
                "token_ids": response.token_ids,
                "logprobs": response.logprobs,
                "prompt_token_ids": response.prompt_token_ids,
                "params": response.params,
                "request_id": response.request_id,
                "tool_calls": msgspec.to_builtins(response.tool_calls),
            },
        }
        # Written whole or not at all: a reader never sees half a record.
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".rec-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(record, out, indent=1)
        os.replace(tmp, self.directory / f"{key}.json")
        position = self.directory / f"pos-{request.agent}-{request.call_index}.json"
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".pos-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"key": key}, out)
        os.replace(tmp, position)
        return response


class ReplayProvider:
    name = "replay"

    def __init__(self, directory: Path, *, by_position: bool = False) -> None:
        self.directory = Path(directory)
        self.by_position = by_position
        if not self.directory.is_dir():
            raise FileNotFoundError(f"replay: {self.directory} is not a directory of records")

    async def complete(self, request: LLMRequest) -> LLMResponse:
        started = time.monotonic()
        key = request_key(request)
        path = self.directory / f"{key}.json"
        matched = "prompt"
        if not path.is_file() and self.by_position:
            position = self.directory / f"pos-{request.agent}-{request.call_index}.json"
            try:
                path = self.directory / f"{json.loads(position.read_text())['key']}.json"
                matched = "position"
            except (OSError, ValueError, KeyError, TypeError):
                pass
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            recorded: dict[str, Any] = record["response"]
            tool_calls = msgspec.convert(recorded.get("tool_calls") or [], list[ToolUse])
        except FileNotFoundError:
            raise LLMError(
                f"replay: no recorded answer for this {request.agent} request (key "
                f"{key[:16]}…) in {self.directory}; record one with --llm record:DIR:SPEC"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:  # msgspec.ValidationError is one
            raise LLMError(f"replay: {path}: unreadable record: {exc}") from None
        return LLMResponse(
            text=str(recorded["text"]),
            provider=self.name,
            model=str(recorded.get("model") or ""),
            stop_reason=str(recorded.get("stop_reason") or ""),
            usage=msgspec.convert(recorded.get("usage") or {}, Usage),
            latency_s=time.monotonic() - started,
            token_ids=recorded.get("token_ids"),
            logprobs=recorded.get("logprobs"),
            prompt_token_ids=recorded.get("prompt_token_ids"),
            params={
                **(recorded.get("params") or {}),
                "replayed_from": f"{recorded.get('provider', '')}:{path.stem[:16]}",
                "replay_match": matched,
            },
            cost_usd=0.0,  # nothing was spent
            request_id=str(recorded.get("request_id") or ""),
            tool_calls=tool_calls,
        )
