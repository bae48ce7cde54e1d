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
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from kernelflow.workflows.model import VERIFIER, Workflow
from kernelflow.workflows.validate import Problem, check_document
from kernelflow.workflows.validate import is_agent_name as is_agent_name  # for the daemon

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


def available_workflows() -> list[str]:
    return sorted(_predefined())


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


def resolve_workflow(name_or_path: str) -> tuple[str, str]:
    """Return ``(name, yaml_text)`` for a predefined workflow name or a YAML file path."""
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.is_file():
        try:
            return path.stem, path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkflowError(f"{name_or_path}: cannot read workflow file: {exc}") from exc
    if name_or_path in _predefined():
        return name_or_path, _predefined()[name_or_path]
    raise WorkflowError(
        f"unknown workflow {name_or_path!r}; available: {', '.join(available_workflows())} "
        "(or give the path of a .yaml file)"
    )


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


def load_workflow(name_or_path: str) -> tuple[Workflow, str]:
    name, text = resolve_workflow(name_or_path)
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
    try:
        doc, lines, duplicates = _read_yaml(text)
    except yaml.YAMLError as exc:
        raise WorkflowError(f"{source}: not valid YAML: {exc}") from exc
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
