"""Every Python example of README.md and docs/*.md runs as it is printed: each in a
process of its own, in a folder of its own that holds the repository's ``examples/``, with
the installed CLI's environment (a data dir of its own, so the embedded NATS; the scripted
model as ``KF_LLM``), as a user pastes it into a file next to a checkout.

An example that cannot run here says so in the doc, on the line before it:

- ``<!-- not run: WHY -->`` (a GPU, a model's server, a fragment of a larger program);
- ``<!-- run by: tests/FILE.py::TEST -->``: a test of its own runs it, with what it needs
  (a daemon, say); that test must exist.

Those are counted: a new one is a choice made here, in ``NOT_RUN``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO, cli_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# How many examples each doc marks as not run here (or run by another test).
NOT_RUN = {
    "README.md": 1,
    "docs/datasets.md": 1,
    "docs/security.md": 1,
    "docs/verl.md": 3,
    "docs/workflows.md": 1,
}
_MARK = re.compile(r"<!-- (not run|run by): (.+?) -->")


@dataclass(frozen=True)
class Example:
    doc: str  # relative to the repository
    line: int  # of its opening fence
    code: str
    mark: tuple[str, str] | None  # ("not run", why) or ("run by", test)

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            if lines[i].strip() != "```python":
                i += 1
                continue
            start = i
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            before = start - 1
            while before >= 0 and not lines[before].strip():
                before -= 1
            marked = _MARK.fullmatch(lines[before].strip()) if before >= 0 else None
            found.append(
                Example(
                    str(path.relative_to(REPO)),
                    start + 1,
                    "\n".join(lines[start + 1 : end]) + "\n",
                    (marked[1], marked[2]) if marked else None,
                )
            )
            i = end + 1
    return found


EXAMPLES_FOUND = examples()
RUN_HERE = [e for e in EXAMPLES_FOUND if e.mark is None]


def test_the_examples_not_run_here_are_the_ones_counted_and_say_why() -> None:
    counted: dict[str, int] = {}
    for example in EXAMPLES_FOUND:
        if example.mark is None:
            continue
        counted[example.doc] = counted.get(example.doc, 0) + 1
        kind, what = example.mark
        if kind == "run by":
            file, _, test = what.partition("::")
            assert f"def {test}(" in (REPO / file).read_text(), f"{example}: no {what}"
        else:
            assert len(what.split()) >= 2, f"{example}: say why it is not run"
    assert counted == NOT_RUN
    assert len(RUN_HERE) >= 5  # the rest run below


@pytest.mark.parametrize("example", RUN_HERE, ids=str)
def test_a_documented_example_runs_as_printed(example: Example, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(EXAMPLES)
    bin_dir = str(Path(sys.executable).parent)  # where `kernelflow` and `python` are
    env = cli_env(
        KF_DATA_DIR=str(tmp_path / "data"),
        KF_LLM=f"scripted:{EXAMPLES / 'scripted' / 'relu.yaml'}",
        PATH=f"{bin_dir}:{os.environ['PATH']}",
    )
    script = tmp_path / "example.py"
    script.write_text(example.code, encoding="utf-8")
    ran = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert ran.returncode == 0, f"{example}:\n{ran.stdout}\n{ran.stderr}"
    assert "Traceback" not in ran.stderr, ran.stderr
