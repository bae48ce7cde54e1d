"""Workflows that extend another (docs/workflows.md, "Extending a workflow").

A file that starts with ``base: NAME`` is a layer over that workflow: its ``agent_info``
entries are merged per agent over the base's (an agent's keys replace the base's keys of
that agent, the base's other keys and agents stay), each limit of ``limitation_info``
(``max_step``, ``single_agent``, ``sequences``) is inherited unless the layer gives it, and
every other key replaces the base's. What results is checked as any workflow is, and is
what a task records: a task never depends on a base that may change after it.

Pure: the loader reads the files (``kernelflow.workflows.loader``); this module merges the
documents and says where each value of the result came from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

BASE_KEY = "base"
Path = tuple[str, ...]
# Where each value of a merged document came from (a file, a predefined workflow's name),
# by the path of the value: see ``whole_values``.
Origins = dict[Path, str]

# The mappings a layer merges into, key by key ("*": any key); any other value is whole,
# and a layer that gives it replaces it.
_MERGED: tuple[Path, ...] = (
    (),
    ("agent_info",),
    ("agent_info", "*"),
    ("limitation_info",),
    ("limitation_info", "required"),
    ("limitation_info", "optional"),
    ("limitation_info", "optional", "repeat_limits"),
)


def _merges(path: Path) -> bool:
    return any(
        len(p) == len(path) and all(a in ("*", b) for a, b in zip(p, path, strict=True))
        for p in _MERGED
    )


def whole_values(doc: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every whole value of ``doc`` (one a layer replaces, not merges into) by its path,
    in the document's order."""
    if isinstance(doc, Mapping) and _merges(path):
        for key, value in doc.items():
            yield from whole_values(value, (*path, str(key)))
    elif path:
        yield path, doc


def origins_of(doc: Any, source: str) -> Origins:
    """Every whole value of ``doc`` coming from ``source``."""
    return {path: source for path, _ in whole_values(doc)}


def merge(base: Any, layer: Any, base_origins: Origins, source: str) -> tuple[Any, Origins]:
    """``layer`` (from ``source``, its ``base`` key left out) over ``base``, and where
    each value of the result came from (``base_origins`` for the base's)."""
    merged = _merge(base, layer, ())
    given = origins_of(layer, source)
    origins = {
        path: given.get(path) or base_origins.get(path, source) for path, _ in whole_values(merged)
    }
    return merged, origins


def _merge(base: Any, layer: Any, path: Path) -> Any:
    if not (isinstance(base, Mapping) and isinstance(layer, Mapping) and _merges(path)):
        return layer
    out = dict(base)
    for key, value in layer.items():
        out[key] = _merge(base[key], value, (*path, str(key))) if key in base else value
    return out


def without_base(doc: Mapping[Any, Any]) -> dict[Any, Any]:
    return {k: v for k, v in doc.items() if k != BASE_KEY}


def dotted(path: Path) -> str:
    return ".".join(path)


def origin_of(path: str, origins: Origins) -> str | None:
    """Where the value at the dotted ``path`` (or the whole value holding it) came from."""
    for whole, source in origins.items():
        prefix = dotted(whole)
        if path == prefix or path.startswith((f"{prefix}.", f"{prefix}[")):
            return source
    return None


def annotated(doc: Mapping[Any, Any], origins: Origins) -> str:
    """``doc`` as YAML, each whole value followed by a comment naming where it came from."""
    lines: list[str] = []
    _annotate(doc, (), origins, lines)
    return "\n".join(lines)


def _annotate(doc: Any, path: Path, origins: Origins, lines: list[str]) -> None:
    indent = "  " * len(path)
    for key, value in doc.items():
        at = (*path, str(key))
        if isinstance(value, Mapping) and _merges(at):
            lines.append(f"{indent}{key}:")
            _annotate(value, at, origins, lines)
            continue
        note = f"  # {origins[at]}" if at in origins else ""
        if _short(value):
            lines.append(f"{indent}{key}: {_inline(value)}{note}")
            continue
        lines.append(f"{indent}{key}:{note}")
        block = yaml.safe_dump(value, sort_keys=False, allow_unicode=True, width=88)
        lines += [f"{indent}  {line}" for line in block.rstrip("\n").splitlines()]


def _inline(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=1 << 20)
    return text.removesuffix("...\n").strip()


def _short(value: Any) -> bool:
    """A value shown on its key's line: a scalar, or a list of a few scalars."""
    if isinstance(value, list):
        return all(not isinstance(v, list | dict) for v in value) and len(json.dumps(value)) < 60
    return not isinstance(value, dict) and "\n" not in str(value)
