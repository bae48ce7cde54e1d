"""Extract an agent's declared ``output_fields`` from LLM text.

Accepted shapes, tried in order: a JSON object (bare or in a fenced block) holding the
fields; ``<field>…</field>`` tagged sections (their text read as the field's type: ``42``
for an ``int``, ``true`` for a ``bool``); and, for an agent with a single string field,
the last fenced code block. Types and mandatory fields are then checked, a ``tool`` field
must name one of the workflow's tools, and a ``route_by`` field one of its answers (docs/
workflows.md, "output_format"); a failure says precisely what was wrong, because the
reason is fed back to the agent on retry.

An agent that declares no fields (no ``output_format``) answers in free text: the whole
answer is its ``answer`` field, and the last fenced code block in it, if any, its ``code``
field, the one the verifier checks. An answer without one fails to parse where the agent
may hand over to the verifier, which would otherwise check nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from kernelflow.workflows.model import (
    ANSWER_FIELD,
    CODE_FIELD,
    TOOL_FIELD_TYPE,
    VERIFIER,
    AgentSpec,
    OutputField,
)

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "list": list,
    "dict": dict,
    TOOL_FIELD_TYPE: str,
}
_BOOLEANS = {"true": True, "false": False}


class ParseError(ValueError):
    pass


def parse_output(
    spec: AgentSpec, text: str, *, whole_answer: bool = False, tools: Sequence[str] = ()
) -> dict[str, Any]:
    """The declared fields of ``text``. With ``whole_answer`` (the text is an explicit
    final answer), an agent with one string field takes the whole text as that field when
    nothing more structured is found. ``tools``: the workflow's toolset, which a ``tool``
    field must name one of."""
    if not spec.output_fields:
        return _free_text(spec, text)
    names = {f.name for f in spec.output_fields}
    found = (
        _from_json(text, names) or _from_tags(text, spec.output_fields) or _from_fence(spec, text)
    )
    if not found and whole_answer and _single_str_field(spec) and text.strip():
        found = {spec.output_fields[0].name: text.strip()}
    if not found:
        expected = ", ".join(sorted(names))
        raise ParseError(
            f"no output found: answer with a JSON object with the fields {expected}"
            + (" or one fenced code block" if _single_str_field(spec) else "")
        )
    fields: dict[str, Any] = {}
    for f in spec.output_fields:
        if f.name not in found:
            if f.mandatory:
                raise ParseError(f"mandatory field {f.name!r} is missing")
            continue
        value = found[f.name]
        wanted = _TYPES[f.field_type]
        if not isinstance(value, wanted) or (f.field_type in ("int", "float") and value is True):
            raise ParseError(f"field {f.name!r} must be {f.field_type}, got {type(value).__name__}")
        if f.mandatory and isinstance(value, str) and not value.strip():
            raise ParseError(f"mandatory field {f.name!r} is empty")
        fields[f.name] = _tool(f, str(value), tools) if f.field_type == TOOL_FIELD_TYPE else value
    _check_route(spec, fields)
    return fields


def _tool(f: OutputField, value: str, tools: Sequence[str]) -> str:
    """A ``tool`` field's value: the name of one of ``tools``."""
    name = value.strip()
    if name not in tools:
        raise ParseError(
            f"field {f.name!r} must name one of the tools: {', '.join(tools) or 'none'}; "
            f"got {name!r}"
        )
    return name


def _check_route(spec: AgentSpec, fields: dict[str, Any]) -> None:
    """An agent that chooses what follows it (``route_by``) must answer one of its values
    (whatever the case and surrounding spaces): anything else is no choice."""
    route = spec.route_by
    if route is None or route.field not in fields or route.chosen(fields) is not None:
        return
    answers = ", ".join(answer for answer, _ in route.values)
    raise ParseError(
        f"field {route.field!r} must be one of {answers}, got {str(fields[route.field])!r}"
    )


def _free_text(spec: AgentSpec, text: str) -> dict[str, Any]:
    answer = text.strip()
    if not answer:
        raise ParseError("the answer is empty")
    fields: dict[str, Any] = {ANSWER_FIELD: answer}
    blocks = _code_blocks(text)
    if blocks:
        fields[CODE_FIELD] = blocks[-1]
    elif VERIFIER in spec.possible_next:
        raise ParseError(
            "no code found: give the complete module as one fenced code block "
            "(```python ... ```); the last one in your answer is what gets verified"
        )
    return fields


def _code_blocks(text: str) -> list[str]:
    """The bodies of the fenced blocks that hold code, not a JSON answer."""
    return [body for lang, body in _FENCE.findall(text) if lang.lower() != "json"]


def _from_json(text: str, names: set[str]) -> dict[str, Any] | None:
    candidates = [body for lang, body in _FENCE.findall(text) if lang.lower() in ("json", "")]
    candidates.append(text)
    for candidate in candidates:
        start = candidate.find("{")
        if start < 0:
            continue
        try:
            value, _ = json.JSONDecoder().raw_decode(candidate[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict) and names & value.keys():
            return value
    return None


def _from_tags(text: str, fields: Sequence[OutputField]) -> dict[str, Any] | None:
    found: dict[str, Any] = {}
    for f in fields:
        name = f.name
        match = re.search(rf"<{re.escape(name)}>(.*?)</{re.escape(name)}>", text, re.DOTALL)
        if match:
            body = match.group(1).strip("\n")
            fenced = _FENCE.findall(body)
            found[name] = _typed(f, fenced[-1][1] if fenced else body)
    return found or None


def _typed(f: OutputField, body: str) -> Any:
    """A tagged section's text as its field's type (as JSON writes it: ``42``, ``2.5``,
    ``true``, ``[1, 2]``); text that is none stays text, for the type check to refuse."""
    if f.field_type in ("str", TOOL_FIELD_TYPE):
        return body
    word = body.strip()
    if f.field_type == "bool":
        return _BOOLEANS.get(word.lower(), body)
    try:
        return json.loads(word)
    except json.JSONDecodeError:
        return body


def _single_str_field(spec: AgentSpec) -> bool:
    return len(spec.output_fields) == 1 and spec.output_fields[0].field_type == "str"


def _from_fence(spec: AgentSpec, text: str) -> dict[str, Any] | None:
    if not _single_str_field(spec):
        return None
    blocks = _code_blocks(text)
    return {spec.output_fields[0].name: blocks[-1]} if blocks else None
