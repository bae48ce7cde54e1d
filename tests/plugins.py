"""A plugin as a user ships one: modules and a distribution whose entry points name them,
in a folder of its own (a site), found through ``importlib.metadata`` as an installed
package is (docs/extending.md)."""

from __future__ import annotations

from pathlib import Path


def plugin_site(
    folder: Path, dist: str, group: str, entries: str, modules: dict[str, str] | None = None
) -> Path:
    """``folder`` holding ``modules`` (name → source) and the distribution ``dist`` whose
    entry points in ``group`` are ``entries`` (lines ``name = module:OBJECT``);
    ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in (modules or {}).items():
        (folder / f"{name}.py").write_text(source)
    info = folder / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{entries.strip()}\n")
    return folder
