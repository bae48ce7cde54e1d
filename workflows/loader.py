"""Load workflow YAML (docs/workflows.md, "The file") and refuse it with every problem it has.

A refusal lists each problem on a line of its own, with the source, the key path and,
where known, the line: ``my.yaml: agent_info.coder.possible_next_agent[1]: unknown agent
'verifer'; did you mean 'verifier'? (line 7)``. The checks themselves are in
``kernelflow.workflows.validate``; this module reads the YAML, finds duplicate keys (YAML
itself keeps the last silently) and knows where each key is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kernelflow.common.suggest import did_you_mean
from kernelflow.common.yaml_error import yaml_problem
from kernelflow.workflows.checking import Problem
from kernelflow.workflows.checking import is_agent_name as is_agent_name  # for the daemon
from kernelflow.workflows.extend import (
    BASE_KEY,
    Origins,
    merge,
    origin_of,
    origins_of,
    without_base,
)
from kernelflow.workflows.model import VERIFIER, Workflow
from kernelflow.workflows.validate import check_document

# libyaml's loader where PyYAML was built with it: the same safe subset, ~8x faster (every
# submitted task parses its workflow).
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
_LAST_STEP = re.compile(r"(\.[^.\[]*|\[\d+\])$")


class WorkflowError(ValueError):
    """Why a workflow cannot be used; ``problems`` holds each one found in its document."""

    def __init__(self, message: str, problems: Sequence[Problem] = ()) -> None:
        super().__init__(message)
        self.problems = tuple(problems)

    @classmethod
    def listing(cls, source: str, problems: Sequence[Problem]) -> WorkflowError:
        ordered = sorted(problems, key=lambda p: (p.line or 0, p.path))
        lines = [
            f"{source}: {p.path}: {p.message}" + (f" (line {p.line})" if p.line else "")
            for p in ordered
        ]
        if len(lines) > 1:
            lines.insert(0, f"{source}: {len(lines)} problems:")
        return cls("\n".join(lines), ordered)


@cache
def _predefined() -> dict[str, str]:
    """The predefined workflows' texts by name: package data, read once (every submitted
    task names one)."""
    root = resources.files("kernelflow.workflows")
    return {
        p.name[: -len(".yaml")]: p.read_text("utf-8")
        for p in root.iterdir()
        if p.name.endswith(".yaml")
    }


# The predefined workflows under the names the workflow specification gives their files
# (default_workflow.yaml, ...): NAME_workflow is NAME (docs/workflows.md, "Named workflows").
ALIAS_SUFFIX = "_workflow"


def predefined_name(name: str) -> str | None:
    """The predefined workflow ``name`` means, itself or as an alias; None: none."""
    if name in _predefined():
        return name
    base = name.removesuffix(ALIAS_SUFFIX)
    return base if name.endswith(ALIAS_SUFFIX) and base in _predefined() else None


def aliases(name: str) -> tuple[str, ...]:
    """The other names of a predefined workflow."""
    return (f"{name}{ALIAS_SUFFIX}",)


@dataclass(frozen=True)
class Found:
    """A workflow's text, and where it came from."""

    name: str
    text: str
    source: str  # what a problem in it is reported under: a path, or a predefined name
    path: Path | None = None  # a file's (a relative ``base:`` path starts in its folder)

    @property
    def identity(self) -> str:
        return str(self.path.resolve()) if self.path else f"predefined {self.name}"

    @property
    def folder(self) -> Path | None:
        return self.path.parent if self.path else None


@dataclass(frozen=True)
class Listed:
    """A workflow ``kernelflow workflow list`` shows."""

    name: str
    source: str  # "predefined", or the file
    shadowed_by: str | None = None  # the workflow of the same name found first
    aliases: tuple[str, ...] = ()  # a predefined workflow's other names


def catalogue(dirs: Sequence[Path] = ()) -> list[Listed]:
    """The predefined workflows, then the named ones in ``dirs`` (in their order: the
    first of a name is the one found by it)."""
    listed = [Listed(name, "predefined", aliases=aliases(name)) for name in sorted(_predefined())]
    first = {n: w.source for w in listed for n in (w.name, *w.aliases)}
    for folder in dirs:
        for path in sorted(_named_files(folder)):
            name = path.stem
            listed.append(Listed(name, str(path), first.get(name)))
            first.setdefault(name, str(path))
    return listed


def _named_files(folder: Path) -> list[Path]:
    """The workflow files of ``folder``: ``*.yaml`` / ``*.yml`` holding a mapping with
    ``agent_info`` or ``base`` (other YAML files, a compose file say, are not named)."""
    try:
        paths = [p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()]
    except OSError:
        return []
    found = []
    for path in paths:
        try:
            doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and ("agent_info" in doc or BASE_KEY in doc):
            found.append(path)
    return found


def find_workflow(
    name_or_path: str, dirs: Sequence[Path] = (), folder: Path | None = None
) -> Found:
    """A workflow by file path (relative to ``folder`` if given), predefined name, or the
    name of a file ``NAME.yaml`` / ``NAME.yml`` in ``dirs`` (the first that has one)."""
    path = Path(name_or_path)
    if folder is not None and not path.is_absolute():
        path = folder / path
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        try:
            return Found(path.stem, path.read_text(encoding="utf-8"), name_or_path, path)
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkflowError(f"{name_or_path}: cannot read workflow file: {exc}") from exc
    predefined = predefined_name(name_or_path)
    if predefined is not None:
        return Found(predefined, _predefined()[predefined], name_or_path)
    if is_agent_name(name_or_path):  # a plain name: no path in it
        for d in dirs:
            for suffix in (".yaml", ".yml"):
                candidate = d / f"{name_or_path}{suffix}"
                if candidate.is_file():
                    return find_workflow(str(candidate))
    listed = catalogue(dirs)
    known = sorted({w.name for w in listed})
    spellings = {n for w in listed for n in (w.name, *w.aliases)}
    looked = f"; named workflows are looked for in: {', '.join(map(str, dirs))}" if dirs else ""
    raise WorkflowError(
        f"unknown workflow {name_or_path!r}; available: {', '.join(known)} (or give the path "
        f"of a .yaml file{looked}){did_you_mean(name_or_path, spellings)}"
    )


@dataclass(frozen=True)
class Extended:
    """A workflow document with its bases merged in, and where each value came from."""

    name: str
    source: str
    document: Any
    origins: Origins
    bases: tuple[str, ...]  # the chain of bases, nearest first
    lines: dict[str, int]  # the line of each key path in the file itself
    duplicates: tuple[Problem, ...]  # keys given twice in the file itself

    @property
    def text(self) -> str:
        """The merged document as YAML: what a task records (it never depends on a base
        that may change later)."""
        over = f"# {self.source} over {' over '.join(self.bases)}, merged by kernelflow\n"
        body = yaml.safe_dump(self.document, sort_keys=False, allow_unicode=True)
        return (over if self.bases else "") + body


def extend(found: Found, dirs: Sequence[Path] = (), chain: tuple[str, ...] = ()) -> Extended:
    """``found`` over its base (and the base's over its own...), merged."""
    doc, lines, duplicates = _parsed(found.text, found.source)
    if not isinstance(doc, dict) or BASE_KEY not in doc:
        return Extended(
            found.name,
            found.source,
            doc,
            origins_of(doc, found.source),
            (),
            lines,
            tuple(duplicates),
        )
    base_name = doc[BASE_KEY]
    where = f"{found.source}: {BASE_KEY}"
    if not isinstance(base_name, str) or not base_name.strip():
        raise WorkflowError(f"{where}: must name a workflow or a file, got {base_name!r}")
    if found.identity in chain:
        raise WorkflowError(
            f"{where}: {base_name!r} extends {found.source} in turn: a workflow cannot be "
            "its own base"
        )
    try:
        base_found = find_workflow(base_name, dirs, found.folder)
    except WorkflowError as exc:
        raise WorkflowError(f"{where}: {exc}") from exc
    base = extend(base_found, dirs, (*chain, found.identity))
    if not isinstance(base.document, dict):
        raise WorkflowError(f"{where}: {base_found.source} is not a workflow (not a mapping)")
    merged, origins = merge(base.document, without_base(doc), base.origins, found.source)
    return Extended(
        found.name,
        found.source,
        merged,
        origins,
        (base_found.source, *base.bases),
        lines,
        tuple(duplicates),
    )


def resolve_workflow(name_or_path: str, dirs: Sequence[Path] = ()) -> tuple[str, str]:
    """``(name, yaml_text)`` of a predefined workflow name, a YAML file path or a named
    workflow in ``dirs``; a file with a ``base`` comes merged with it, and is refused here,
    each problem named where it was set, when the merged workflow has any."""
    found = find_workflow(name_or_path, dirs)
    extended = extend(found, dirs)
    if not extended.bases:
        return found.name, found.text  # as written: its problems are reported by line
    _, problems = check_document(extended.document, found.name)
    if problems or extended.duplicates:
        located = [_from_layers(p, extended) for p in problems]
        raise WorkflowError.listing(found.source, [*extended.duplicates, *located])
    return found.name, extended.text


def _parsed(text: str, source: str) -> tuple[Any, dict[str, int], list[Problem]]:
    try:
        return _read_yaml(text)
    except yaml.YAMLError as exc:
        raise WorkflowError(f"{source}: not valid YAML: {yaml_problem(exc)}") from exc


def _from_layers(problem: Problem, extended: Extended) -> Problem:
    """``problem`` located in the file where its value was set: the line, for the file
    itself; the workflow it came from, for a base."""
    origin = origin_of(problem.path, extended.origins)
    if origin is None or origin == extended.source:
        return _located(problem, extended.lines)
    return Problem(problem.path, f"{problem.message} (set in {origin})", problem.mistake)


def parse_workflow(text: str, name: str, source: str | None = None) -> Workflow:
    """The workflow ``text`` describes; WorkflowError listing every problem in it."""
    source = source or name
    workflow, problems = _check(text, name, source)
    if problems or workflow is None:
        raise WorkflowError.listing(source, problems)
    return workflow


def parse_recorded_workflow(text: str, name: str) -> Workflow:
    """The workflow of a task already in the log: accepted when submitted, perhaps under
    older rules that let mistakes through (an unknown key, an agent nothing reaches). The
    task runs on as it began, so only problems that leave nothing to build refuse it."""
    workflow, problems = _check(text, name, name)
    if workflow is None:
        raise WorkflowError.listing(name, [p for p in problems if not p.mistake])
    return workflow


def load_workflow(name_or_path: str, dirs: Sequence[Path] = ()) -> tuple[Workflow, str]:
    name, text = resolve_workflow(name_or_path, dirs)
    return parse_workflow(text, name, source=name_or_path), text


def check_candidate(workflow: Workflow, has_candidate: bool) -> None:
    """Refuse a task whose workflow starts with the verifier but that brings no code for
    it to check: the verifier could only fail, and nothing could follow it."""
    if workflow.start_agent == VERIFIER and not has_candidate:
        raise WorkflowError(
            f"{workflow.name}: start_agent: the workflow starts with the verifier, which "
            "checks code given with the task: pass the code to check (--candidate FILE; "
            "candidate_code in a submit command)"
        )


def _check(text: str, name: str, source: str) -> tuple[Workflow | None, list[Problem]]:
    doc, lines, duplicates = _parsed(text, source)
    workflow, problems = check_document(doc, name)
    located = [_located(p, lines) for p in problems]
    return workflow, duplicates + located


def _read_yaml(text: str) -> tuple[Any, dict[str, int], list[Problem]]:
    """The document, the line of each key path, and a problem for each duplicate key."""
    loader = _YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}, []
        lines, duplicates = _key_lines(node)
        return loader.construct_document(node), lines, duplicates
    finally:
        loader.dispose()


def _key_lines(root: yaml.Node) -> tuple[dict[str, int], list[Problem]]:
    """Walk the YAML nodes (before YAML folds duplicate keys into one): the line of each
    key path, and a problem for every key given twice in one mapping."""
    lines: dict[str, int] = {}
    duplicates: list[Problem] = []
    visited: set[int] = set()  # an alias makes a node appear twice, or in itself
    stack: list[tuple[str, yaml.Node]] = [("", root)]
    while stack:
        path, node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[str, int] = {}
            last: dict[str, tuple[int, yaml.Node]] = {}  # what YAML keeps of each key
            for key_node, value_node in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                    stack.append((path, value_node))
                    continue
                key, line = str(key_node.value), key_node.start_mark.line + 1
                if key in first_line:
                    duplicates.append(
                        Problem(
                            f"{path}.{key}" if path else key,
                            f"duplicate key, first at line {first_line[key]}: YAML keeps "
                            "only the last one; remove or rename the other",
                            mistake=True,
                            line=line,
                        )
                    )
                first_line.setdefault(key, line)
                last[key] = (line, value_node)
            for key, (line, value_node) in last.items():
                child = f"{path}.{key}" if path else key
                lines.setdefault(child, line)
                stack.append((child, value_node))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines.setdefault(f"{path}[{i}]", item.start_mark.line + 1)
                stack.append((f"{path}[{i}]", item))
    return lines, duplicates


def _located(problem: Problem, lines: dict[str, int]) -> Problem:
    """``problem`` with the line of its key, or of the nearest key above it that exists."""
    path = problem.path
    while path and path not in lines:
        parent = _LAST_STEP.sub("", path)
        path = parent if parent != path else ""  # a top-level key: nothing above it
    line = lines.get(path)
    return Problem(problem.path, problem.message, problem.mistake, line)
