"""Source comments cite what a reader of the repository can open: the pages under docs/.

kernelflow was specified from documents that are not in the repository; a comment that
cites them ("seed 001", "DESIGN §7") points nowhere. So no installed module may, and every
``docs/<page>.md`` a comment names must exist, with the section it names (``docs/agents.md,
"Kinds"``) one of that page's headings.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.conftest import REPO

# The folders that install as kernelflow's packages: pyproject's package-dir.
PACKAGE_DIR = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]
LAYERS = sorted(set(PACKAGE_DIR.values()))
SOURCE_SUFFIXES = {".py", ".yaml", ".yml", ".txt", ".toml"}
# Unreachable references: the specification documents outside the repository.
UNREACHABLE = ("seed 00", "DESIGN §")
CITATION = re.compile(r'docs/([A-Za-z0-9_.-]+\.md)(?:,\s*"([^"\n]+)")?')


def _sources(*folders: str) -> list[Path]:
    return sorted(
        path
        for folder in folders
        for path in (REPO / folder).rglob("*")
        if path.suffix in SOURCE_SUFFIXES and path.is_file() and "__pycache__" not in path.parts
    )


def _headings(page: Path) -> set[str]:
    """The page's headings, without their #s and backticks (fenced blocks skipped)."""
    headings: set[str] = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            headings.add(line.lstrip("#").strip().replace("`", ""))
    return headings


def test_the_layers_are_not_empty() -> None:
    assert "workflows" in LAYERS and "kernelflow" in LAYERS
    assert len(_sources(*LAYERS)) > 100


def test_no_installed_module_cites_documents_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in _sources(*LAYERS)
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(ref in line for ref in UNREACHABLE)
    ]
    assert not found, "cite docs/ instead:\n" + "\n".join(found)


@pytest.mark.parametrize("folders", [LAYERS, ["examples", "tests"]], ids=["layers", "others"])
def test_every_cited_docs_page_and_section_exists(folders: list[str]) -> None:
    missing = []
    for path in _sources(*folders):
        for match in CITATION.finditer(path.read_text(encoding="utf-8")):
            page, section = REPO / "docs" / match.group(1), match.group(2)
            where = f"{path.relative_to(REPO)}: {match.group(0)}"
            if not page.is_file():
                missing.append(f"{where}: no such page")
            elif section is not None and not any(
                h == section or h.startswith(f"{section}:") for h in _headings(page)
            ):
                missing.append(f"{where}: no such section in {match.group(1)}")
    assert not missing, "\n".join(missing)
