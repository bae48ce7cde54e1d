"""Parsing Python source into an AST, safely from any thread.

CPython 3.11 keeps the recursion counter of its AST constructor in per-interpreter state,
so two threads building trees at once (one paused mid-tree, e.g. by a garbage collection
that runs Python code) can corrupt it and fail a valid parse with ``SystemError: AST
constructor recursion depth mismatch`` (python/cpython#106905). A daemon's actors parse
agent replies, tool expressions, task files and candidates on their own threads, so
every parse in the daemon goes through here, one at a time (a parse takes microseconds
to milliseconds).
"""

from __future__ import annotations

import ast
import threading

_ONE_AT_A_TIME = threading.Lock()


def parse_module(source: str, filename: str = "<unknown>") -> ast.Module:
    with _ONE_AT_A_TIME:
        return ast.parse(source, filename=filename)


def parse_expression(source: str) -> ast.Expression:
    with _ONE_AT_A_TIME:
        return ast.parse(source, mode="eval")
