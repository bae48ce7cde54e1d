"""Running a git revision's kernelflow beside this checkout's, for a bench's "before"
column measured in the same run (bench/verifier_precision.py --baseline,
bench/feedback_quality.py): the revision's tree, exported with ``git archive`` into a
temporary folder and laid out as the installed ``kernelflow`` package (each layer folder
of its pyproject's ``package-dir`` under ``kernelflow.``), runs a script in a process of
its own that imports it and nothing of this checkout.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

__all__ = ["run_at_revision"]

ROOT = Path(__file__).resolve().parent.parent


def run_at_revision(ref: str, script: str, stdin: str) -> str:
    """The standard output of ``python -c script`` (given ``stdin``) run against REF's
    kernelflow; raises CalledProcessError when the script fails."""
    with tempfile.TemporaryDirectory(prefix="kf-revision-") as tmp:
        tree = Path(tmp, "tree")
        tree.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        layout = Path(tmp, "layout")
        package_dirs = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"][
            "package-dir"
        ]
        for package, folder in sorted(package_dirs.items()):
            target = layout.joinpath(*package.split("."))
            if package == "kernelflow":
                target.mkdir(parents=True)
                for item in (tree / folder).iterdir():
                    target.joinpath(item.name).symlink_to(item)
            else:
                target.symlink_to(tree / folder)
        return subprocess.run(
            [sys.executable, "-c", script],
            input=stdin,
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": str(layout), "PATH": "/usr/bin:/bin"},
            cwd=tmp,  # not this checkout: `-c` puts the working directory first on the path
        ).stdout
