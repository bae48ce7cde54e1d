"""Parsing Python from many threads at once (actors.syntax)."""

from __future__ import annotations

import ast
import threading
import time

import pytest

from kernelflow.common.syntax import parse_expression, parse_module


def test_parses_from_many_threads_never_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPython 3.11 a tree built while another thread builds one can fail a valid
    parse ("AST constructor recursion depth mismatch"), so parses take turns. Each parse
    here pauses halfway, as a thread switch would; none may start meanwhile."""
    real_parse = ast.parse
    running: list[int] = []
    most_at_once = [0]

    def pausing_parse(*args, **kwargs):  # type: ignore[no-untyped-def]
        running.append(1)
        most_at_once[0] = max(most_at_once[0], len(running))
        time.sleep(0.02)
        try:
            return real_parse(*args, **kwargs)
        finally:
            running.pop()

    monkeypatch.setattr(ast, "parse", pausing_parse)
    trees: list[ast.AST] = []
    threads = [
        threading.Thread(target=lambda: trees.append(parse_module("x = [a for a in b]\n")))
        for _ in range(4)
    ] + [
        threading.Thread(target=lambda: trees.append(parse_expression("f(a, b=2)")))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most_at_once[0] == 1
    assert sorted(type(tree).__name__ for tree in trees) == ["Expression"] * 4 + ["Module"] * 4
