"""docs/extending.md's recipes stay true to the code: every ``## A new …`` section names
the files it touches on a ``Files:`` line (backticked repository paths; ``<name>`` stands
for the reader's) and where the new thing is registered on a ``Registered by:`` line
(```symbol` in `path``` pairs, and ``entry-point group `group```). Each concrete path must
exist, each placeholder path's folder too, each registration symbol must be defined in its
module, and each entry-point group must be one a registry of kernelflow loads."""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

EXTENDING = REPO / "docs" / "extending.md"
RECIPES = {
    # The five that issue 48 asked for (item 8)...
    "A new verifier backend (a kernel DSL)",
    "A new agent kind (a step function)",
    "A new agent written as a program (a BaseAgent)",
    "A new projection",
    "A new CLI command",
    "A new LLM provider",
    # ... and those the page had before.
    "A new event type",
    "A new routing rule",
    "A new search strategy",
}
FIELDS = ("Files:", "Registered by:")
PATH = re.compile(r"`([^`]+)`")
SYMBOL_IN = re.compile(r"`([A-Za-z_][\w.]*)` in `([^`]+)`")
GROUP = re.compile(r"entry-point group `([^`]+)`")


@dataclass(frozen=True)
class Recipe:
    title: str
    fields: dict[str, str]  # "Files:" / "Registered by:" -> the paragraph after the label


def recipes(text: str) -> list[Recipe]:
    """The page's ``## A new …`` sections and their labelled paragraphs (fenced blocks
    skipped; a paragraph ends at a blank line)."""
    found: list[Recipe] = []
    fenced = False
    paragraph: list[str] = []

    def close() -> None:
        if found and paragraph:
            joined = " ".join(line.strip() for line in paragraph)
            for label in FIELDS:
                if joined.startswith(label):
                    found[-1].fields[label] = joined.removeprefix(label).strip()
        paragraph.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            close()
        elif fenced:
            continue
        elif line.startswith("## "):
            close()
            title = line.removeprefix("## ").strip().replace("`", "")
            if title.startswith("A new "):
                found.append(Recipe(title, {}))
            else:
                found.append(Recipe("", {}))  # a section that is no recipe
        elif not line.strip():
            close()
        else:
            paragraph.append(line)
    close()
    return [r for r in found if r.title]


def defined_names(path: Path) -> set[str]:
    """What ``path`` defines: top-level functions, classes and assigned names, and
    ``Class.method`` for the methods of its classes."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def entry_point_groups(repo: Path) -> set[str]:
    """The groups kernelflow's registries load plugins from: the ``ENTRY_POINT_GROUP`` of
    each installed module that calls ``common/plugins.py``'s ``load_plugins``."""
    folders = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
    groups: set[str] = set()
    for path in sorted({p for folder in set(folders) for p in (repo / folder).rglob("*.py")}):
        text = path.read_text(encoding="utf-8")
        if "ENTRY_POINT_GROUP =" not in text or "load_plugins" not in text:
            continue
        for node in ast.parse(text).body:
            if (
                isinstance(node, ast.Assign)
                and any(
                    isinstance(t, ast.Name) and t.id == "ENTRY_POINT_GROUP" for t in node.targets
                )
                and isinstance(node.value, ast.Constant)
            ):
                groups.add(str(node.value.value))
    return groups


def problems(text: str, repo: Path, groups: set[str]) -> list[str]:
    """Every way the recipes of ``text`` disagree with the repository at ``repo``."""
    found: list[str] = []
    for recipe in recipes(text):
        where = f"{recipe.title!r}"
        files = recipe.fields.get("Files:")
        if not files:
            found.append(f"{where}: no Files: line")
        for cited in PATH.findall(files or ""):
            if "<" in cited:
                folder = repo / cited[: cited.index("<")].rpartition("/")[0]
                if not folder.is_dir():
                    found.append(f"{where}: {cited}: no folder {folder.relative_to(repo)}")
            elif not (repo / cited).exists():
                found.append(f"{where}: {cited}: no such file")
        registered = recipe.fields.get("Registered by:")
        if not registered:
            found.append(f"{where}: no Registered by: line")
            continue
        pairs = SYMBOL_IN.findall(registered)
        if not pairs:
            found.append(f"{where}: Registered by: names no `symbol` in `path`")
        for symbol, cited in pairs:
            module = repo / cited
            if not module.is_file():
                found.append(f"{where}: {cited}: no such file")
            elif symbol not in defined_names(module):
                found.append(f"{where}: {cited} defines no {symbol}")
        for group in GROUP.findall(registered):
            if group not in groups:
                found.append(f"{where}: no registry loads the entry-point group {group}")
    return found


def test_the_recipes_are_the_ones_promised() -> None:
    assert {r.title for r in recipes(EXTENDING.read_text(encoding="utf-8"))} == RECIPES


def test_every_recipe_names_files_and_a_registration_that_exist() -> None:
    groups = entry_point_groups(REPO)
    assert groups >= {"kernelflow.agents", "kernelflow.backends", "kernelflow.search"}
    assert problems(EXTENDING.read_text(encoding="utf-8"), REPO, groups) == []


FAKE = """
# Extending

## A new widget

Files: `kernelflow/cli/main.py`, `kernelflow/no_such_module.py`,
`kernelflow/cli/commands/<name>.py`, `nowhere/<name>.py`

Registered by: `COMMANDS` in `kernelflow/cli/main.py`; `WIDGETS` in `kernelflow/cli/main.py`;
entry-point group `kernelflow.widgets`

```
Files: `inside/a/fence.py`
```

## A new gadget

Some text, and no labelled lines.
"""


def test_the_checker_finds_what_a_recipe_gets_wrong() -> None:
    found = problems(FAKE, REPO, {"kernelflow.agents"})
    assert found == [
        "'A new widget': kernelflow/no_such_module.py: no such file",
        "'A new widget': nowhere/<name>.py: no folder nowhere",
        "'A new widget': kernelflow/cli/main.py defines no WIDGETS",
        "'A new widget': no registry loads the entry-point group kernelflow.widgets",
        "'A new gadget': no Files: line",
        "'A new gadget': no Registered by: line",
    ]


@pytest.mark.parametrize(
    ("symbol", "module"),
    [
        ("COMMANDS", "kernelflow/cli/main.py"),
        ("ProviderRouter._build", "llm/router.py"),
        ("register_backend", "verification/backends/registry.py"),
    ],
)
def test_registration_points_are_found_by_their_definition(symbol: str, module: str) -> None:
    assert symbol in defined_names(REPO / module)
