"""PyYAML's error about a file as one line in kernelflow's words: where (line and column
of the file) and what, without PyYAML's ``in "<unicode string>"`` and its line breaks."""

from __future__ import annotations

import re

import yaml


def yaml_problem(exc: yaml.YAMLError) -> str:
    """``line 4, column 1: expected ',' or ']', but got '<stream end>' (in the flow
    sequence that begins at line 2, column 13)`` for a parse error; PyYAML's text on one
    line for any other."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return " ".join(str(exc).split())
    mark = exc.problem_mark
    said = f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem or 'not YAML'}"
    if exc.context and exc.context_mark is not None:
        what = re.sub(r"^while (parsing|scanning) (an? )?", "", exc.context)
        begun = exc.context_mark
        said += f" (in the {what} that begins at line {begun.line + 1}, column {begun.column + 1})"
    return said
