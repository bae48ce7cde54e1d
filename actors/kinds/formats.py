"""The text formats models use to act (docs/agents.md, "Kinds"): pure parsers, no I/O.

ReAct replies::

    Thought: I need the factorial of 5.
    Action: calculator(expression='factorial(5)')
    ...
    Final Answer: 120            (also "Action: Final Answer: 120")

Tool-agent replies hold one or more ``TOOL_CALL: name(args)`` lines, or a final answer.

A call's arguments are Python-style keyword literals (``name(a='x', n=5)``), one JSON or
dict literal (``name({"a": "x"})``), or positional literals mapped to the tool's
parameters in the order its schema lists them. Only literals are accepted (parsed with
``ast.literal_eval``): nothing in a reply is ever evaluated as code.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelflow.common.syntax import parse_expression

FINAL_ANSWER = re.compile(r"^[ \t]*(?:Action:[ \t]*)?Final Answer:[ \t]*", re.MULTILINE)
_THOUGHT = re.compile(r"^[ \t]*Thought:[ \t]*", re.MULTILINE)
_ACTION = re.compile(r"^[ \t]*Action:[ \t]*", re.MULTILINE)
_TOOL_CALL = re.compile(r"^[ \t]*TOOL_CALL:[ \t]*", re.MULTILINE)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


class FormatError(ValueError):
    """A reply that does not follow the format; the message is shown to the model."""


@dataclass(frozen=True)
class ParsedCall:
    name: str
    args: dict[str, Any]


@dataclass(frozen=True)
class ReactReply:
    thought: str | None = None
    action: ParsedCall | None = None
    action_error: str | None = None  # an Action line that could not be read, and why
    final_answer: str | None = None


def parse_call(text: str, parameters: Mapping[str, Mapping[str, Any]]) -> tuple[ParsedCall, int]:
    """The first call at the start of ``text`` and the number of characters it spans.
    ``parameters`` maps tool names to their JSON Schemas (for positional arguments).
    Raises FormatError."""
    text = text.lstrip()
    head = _NAME.match(text)
    if head is None or not text[head.end() :].startswith("("):
        raise FormatError(f"expected a call like tool_name(arg=value), got {_clip(text)!r}")
    # The call ends at the first ')' after which the prefix is a valid expression: this
    # finds the end of multi-line and string arguments without a hand-written lexer.
    for end in (m.end() for m in re.finditer(r"\)", text)):
        try:
            node = parse_expression(text[:end].strip()).body
        except SyntaxError:
            continue
        if isinstance(node, ast.Call):
            return _call_args(head.group(0), node, parameters), end
    raise FormatError(f"unbalanced or invalid call syntax in {_clip(text)!r}")


def _call_args(
    name: str, node: ast.Call, parameters: Mapping[str, Mapping[str, Any]]
) -> ParsedCall:
    if any(k.arg is None for k in node.keywords):
        raise FormatError(f"{name}: **kwargs is not allowed in a call")
    try:
        positional = [ast.literal_eval(a) for a in node.args]
        keywords = {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}
    except (ValueError, SyntaxError, TypeError) as exc:
        raise FormatError(
            f"{name}: arguments must be literals (strings, numbers, lists, dicts), "
            f"got {_clip(ast.unparse(node))!r}"
        ) from exc
    if len(positional) == 1 and isinstance(positional[0], dict) and not keywords:
        return ParsedCall(name, {str(k): v for k, v in positional[0].items()})
    if positional:
        schema = parameters.get(name, {})
        order = list(schema.get("properties", {}))
        if len(positional) > len(order):
            raise FormatError(
                f"{name}: {len(positional)} positional arguments but the tool takes "
                f"{len(order)} ({', '.join(order) or 'none'}); name them"
            )
        for key, value in zip(order, positional, strict=False):
            if key in keywords:
                raise FormatError(f"{name}: argument {key!r} given twice")
            keywords[key] = value
    return ParsedCall(name, keywords)


def final_answer(text: str) -> str | None:
    """The text after the last ``Final Answer:`` marker, or None."""
    matches = list(FINAL_ANSWER.finditer(text))
    return text[matches[-1].end() :].strip() if matches else None


def parse_react(text: str, parameters: Mapping[str, Mapping[str, Any]]) -> ReactReply:
    """Read one ReAct reply. A final answer wins over an action in the same reply only
    when no action precedes it (the model must see an action's result first)."""
    thought_m = _THOUGHT.search(text)
    action_m = next(
        (m for m in _ACTION.finditer(text) if not FINAL_ANSWER.match(text, m.start())), None
    )
    answer_m = FINAL_ANSWER.search(text)
    thought = None
    if thought_m is not None:
        stops = [m.start() for m in (action_m, answer_m) if m and m.start() > thought_m.end()]
        thought = text[thought_m.end() : min(stops, default=len(text))].strip() or None
    if action_m is not None and (answer_m is None or action_m.start() < answer_m.start()):
        try:
            call, _ = parse_call(text[action_m.end() :], parameters)
        except FormatError as exc:
            return ReactReply(thought=thought, action_error=str(exc))
        return ReactReply(thought=thought, action=call)
    if answer_m is not None:
        return ReactReply(thought=thought, final_answer=final_answer(text))
    return ReactReply(thought=thought)


def parse_tool_calls(
    text: str, parameters: Mapping[str, Mapping[str, Any]]
) -> tuple[list[ParsedCall], list[str]]:
    """Every ``TOOL_CALL:`` in a reply, and the errors of those that could not be read."""
    calls: list[ParsedCall] = []
    errors: list[str] = []
    for m in _TOOL_CALL.finditer(text):
        try:
            call, _ = parse_call(text[m.end() :], parameters)
            calls.append(call)
        except FormatError as exc:
            errors.append(str(exc))
    return calls, errors


def format_call(name: str, args: Mapping[str, Any]) -> str:
    """A call as the text formats write it (inverse of ``parse_call`` for keyword args)."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def tool_catalogue(specs: Sequence[Mapping[str, Any]]) -> str:
    """The tools as the text-format prompts list them."""
    lines = []
    for spec in specs:
        params = spec.get("parameters", {})
        required = set(params.get("required", []))
        args = ", ".join(
            f"{k}: {v.get('type', 'any')}{'' if k in required else ' (optional)'}"
            for k, v in params.get("properties", {}).items()
        )
        lines.append(f"- {spec['name']}({args}): {spec.get('description', '')}")
    return "\n".join(lines) if lines else "(no tools)"


def _clip(text: str, limit: int = 80) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[:limit] + "..."
