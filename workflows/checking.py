"""What every check of a workflow document shares (docs/workflows.md, "What is refused"):
a problem and its key path, the checks of plain values (mappings, known keys, positive
integers, agent names), and the checks of ``limitation_info``.

``kernelflow.workflows.validate`` checks the rest of a document with them.
"""

from __future__ import annotations

import difflib
import re
import reprlib
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from kernelflow.workflows.model import FINISH, SequenceLimit

NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_agent_name(name: object) -> bool:
    """Whether ``name`` can name an agent: it becomes a NATS subject token and part of a
    consumer's name (letters, digits, '_' and '-'), and is not the workflow's end."""
    return isinstance(name, str) and bool(NAME.match(name)) and name != FINISH


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a workflow document, at ``path``."""

    path: str
    message: str
    # A mistake leaves a workflow that can still be built (an ignored key, a duplicate, an
    # agent nothing reaches): refused when submitted, tolerated in a workflow a task
    # recorded under older, laxer rules. Any other problem leaves nothing to build.
    mistake: bool = False
    line: int | None = None


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for a near miss of one of ``choices``, else nothing."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


_YAML_KINDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}
# Shows a value in a problem without walking all of it: a document's aliases can make a
# small text a huge (or self-containing) value.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxdict = 2, 4, 4
_SHORT_REPR.maxstring, _SHORT_REPR.maxother = 40, 40


def shown(value: Any) -> str:
    """``value`` as a problem describes it: its YAML kind, then the value, shortened."""
    if value is None:
        return "nothing"
    return f"{_YAML_KINDS.get(type(value), type(value).__name__)} {_SHORT_REPR.repr(value)}"


def child(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


class Checker:
    """Walks a document, collecting problems. Each method that checks a value returns
    it (converted where needed), or None where it is unusable: a problem then says why."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.unusable = 0  # problems that are not mistakes, so far

    def broken(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))
        self.unusable += 1

    def mistake(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message, mistake=True))

    # ------------------------------------------------------------------ value checks

    def mapping(self, value: Any, path: str, *, empty_ok: bool = True) -> dict[Any, Any] | None:
        """A mapping; a key given no value (``optional:``) counts as an empty one."""
        if value is None and empty_ok:
            return {}
        if not isinstance(value, dict):
            self.broken(path, f"must be a mapping, got {shown(value)}")
            return None
        return value

    def known_keys(self, doc: dict[Any, Any], path: str, allowed: Collection[str]) -> None:
        for key in doc:
            if key not in allowed:
                hint = did_you_mean(key, allowed) or f" (expected one of {', '.join(allowed)})"
                self.mistake(child(path, key), f"unknown key{hint}")

    def required(self, doc: dict[Any, Any], key: str, path: str, hint: str = "") -> Any:
        """``doc[key]``; None, and a problem (with ``hint``), where it is missing or given
        no value."""
        if key not in doc:
            self.broken(child(path, key), f"missing required key{hint}")
        elif doc[key] is None:
            self.broken(child(path, key), "required, but given no value")
        return doc.get(key)

    def positive_int(self, value: Any, path: str) -> int | None:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        quoted = isinstance(value, str) and value.strip().lstrip("+-").isdigit()
        hint = " (write the number without quotes)" if quoted else ""
        self.broken(path, f"must be a positive integer, got {shown(value)}{hint}")
        return None

    def agent_names(
        self, value: Any, path: str, known: Collection[str] | None, *, finish_ok: bool = False
    ) -> list[str] | None:
        """A list of agent names, each defined (or ``finish`` where ``finish_ok``)."""
        if value is None:
            return []
        if not isinstance(value, list):
            hint = f" (write [{value}])" if isinstance(value, str) else ""
            self.broken(path, f"must be a list of agent names, got {shown(value)}{hint}")
            return None
        names: list[str] = []
        usable = True
        for i, item in enumerate(value):
            name = self.agent_name(item, f"{path}[{i}]", known, finish_ok=finish_ok)
            if name is None:
                usable = False
            elif name in names:
                self.mistake(f"{path}[{i}]", f"{name!r} is listed twice")
            else:
                names.append(name)
        return names if usable else None

    def agent_name(
        self, value: Any, path: str, known: Collection[str] | None, *, finish_ok: bool = False
    ) -> str | None:
        if not isinstance(value, str):
            self.broken(path, f"must be an agent's name, got {shown(value)}")
            return None
        if known is None:
            return value  # agent_info is unusable: nothing to check the name against
        choices = [*known, FINISH] if finish_ok else list(known)
        if value not in choices:
            self.broken(path, f"unknown agent {value!r}{did_you_mean(value, choices)}")
            return None
        return value

    # ------------------------------------------------------------------ limits

    def limits(
        self, value: Any, known: list[str] | None
    ) -> tuple[int, dict[str, int], tuple[SequenceLimit, ...]] | None:
        """``(max_step, single_agent limits, sequences)`` from ``limitation_info``."""
        if value is None:
            return None  # missing: already said
        path = "limitation_info"
        limits = self.mapping(value, path, empty_ok=False)
        if limits is None:
            return None
        self.known_keys(limits, path, ("required", "optional"))
        required = self.required(limits, "required", path)
        if required is not None:
            required = self.mapping(required, f"{path}.required")
        max_step = None
        if required is not None:
            self.known_keys(required, f"{path}.required", ("max_step",))
            if "max_step" in required:
                max_step = self.positive_int(required["max_step"], f"{path}.required.max_step")
            else:
                self.broken(f"{path}.required.max_step", "missing required key")
        optional = self.mapping(limits.get("optional"), f"{path}.optional")
        repeat_path = f"{path}.optional.repeat_limits"
        repeat = None
        if optional is not None:
            self.known_keys(optional, f"{path}.optional", ("repeat_limits",))
            repeat = self.mapping(optional.get("repeat_limits"), repeat_path)
        if repeat is None:
            return None
        self.known_keys(repeat, repeat_path, ("single_agent", "sequences"))
        single = self.single_agent_limits(repeat.get("single_agent"), repeat_path, known)
        sequences = self.sequences(repeat.get("sequences"), repeat_path, known)
        if max_step is None or single is None or sequences is None:
            return None
        return max_step, single, sequences

    def single_agent_limits(
        self, value: Any, repeat_path: str, known: list[str] | None
    ) -> dict[str, int] | None:
        path = f"{repeat_path}.single_agent"
        doc = self.mapping(value, path)
        if doc is None:
            return None
        limits: dict[str, int] = {}
        usable = True
        for agent, limit in doc.items():
            at = child(path, agent)
            if known is not None and agent not in known:
                self.broken(at, f"unknown agent {agent!r}{did_you_mean(agent, known)}")
                usable = False
                continue
            checked = self.positive_int(limit, at)
            if checked is None:
                usable = False
            else:
                limits[agent] = checked
        return limits if usable else None

    def sequences(
        self, value: Any, repeat_path: str, known: list[str] | None
    ) -> tuple[SequenceLimit, ...] | None:
        path = f"{repeat_path}.sequences"
        doc = self.mapping(value, path)
        if doc is None:
            return None
        sequences = []
        usable = True
        for name, seq_doc in doc.items():
            seq_path = child(path, name)
            seq = self.mapping(seq_doc, seq_path, empty_ok=False)
            if seq is None:
                usable = False
                continue
            self.known_keys(seq, seq_path, ("pattern", "max_repeats"))
            pattern = self.pattern(self.required(seq, "pattern", seq_path), seq_path, known)
            max_repeats = None
            if "max_repeats" in seq:
                max_repeats = self.positive_int(seq["max_repeats"], f"{seq_path}.max_repeats")
            else:
                self.broken(f"{seq_path}.max_repeats", "missing required key")
            if pattern is None or max_repeats is None:
                usable = False
            else:
                sequences.append(SequenceLimit(str(name), tuple(pattern), max_repeats))
        return tuple(sequences) if usable else None

    def pattern(self, value: Any, seq_path: str, known: list[str] | None) -> list[str] | None:
        if value is None:
            return None  # missing: already said
        path = f"{seq_path}.pattern"
        if not isinstance(value, list):
            self.broken(path, f"must be a list of agent names, got {shown(value)}")
            return None
        if not value:
            self.broken(path, "must name at least one agent")
            return None
        # Unlike a list of options, a pattern may name an agent twice ([coder, coder]).
        names = [self.agent_name(item, f"{path}[{i}]", known) for i, item in enumerate(value)]
        return [n for n in names if n is not None] if None not in names else None

    # ------------------------------------------------------------------ the graph
