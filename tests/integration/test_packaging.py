"""The wheel a user installs: one top-level package, typed, with its data, and it works from
anywhere (not only from a checkout's root, where the layers' folders happen to be importable)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO

# What pip builds the wheel from: the project files and every folder pyproject's
# package-dir names (one per layer).
PACKAGE_DIRS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
SOURCES = ("pyproject.toml", "README.md", *sorted(set(PACKAGE_DIRS["package-dir"].values())))

KERNELFLOW_VERIFY = (
    sys.executable,
    *("-m", "kernelflow", "verify"),
    *("--task", str(EXAMPLES / "tasks" / "relu.py")),
    *("--candidate", str(EXAMPLES / "candidates" / "solutions" / "relu.py")),
)
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip wheel .`` of a copy of the sources (building writes build/ and egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [*PIP_WHEEL, "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("kernelflow-*.whl")
    return built


def test_the_wheel_installs_one_top_level_package_typed_and_complete(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "kernelflow",
        wheel.name.split("-py")[0] + ".dist-info",
    }
    assert "kernelflow/py.typed" in names
    for folder in ("events", "actors", "projections", "workflows"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".py", ".yaml", ".txt") and "__pycache__" not in path.parts:
                relative = path.relative_to(REPO / folder).as_posix()
                assert f"kernelflow/{folder}/{relative}" in names
    assert "kernelflow/cli/main.py" in names


def test_the_installed_wheel_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    """Unpacked (a pure-Python wheel's install) ahead of the checkout's editable install,
    run from an unrelated directory: workflows, prompts and the sandbox come from the wheel."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
    env["PYTHONPATH"] = str(site)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    where = run(
        "-c",
        "import kernelflow.events.model, kernelflow.actors.prompts as p; "
        "print(kernelflow.events.model.__file__); print(p.__file__)",
    )
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(site)) for line in where.stdout.split())
    shown = run("-m", "kernelflow", "workflow", "show", "default")
    assert shown.returncode == 0, shown.stderr
    assert "designer" in shown.stdout
    checked = run(*KERNELFLOW_VERIFY[1:])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_sandbox_runs_the_verifier_of_the_kernelflow_that_started_it(
    wheel: Path, tmp_path: Path
) -> None:
    """The sandbox is an isolated interpreter (``python -I``: no PYTHONPATH), yet it runs
    the copy of kernelflow its daemon runs, not whichever one that interpreter's
    site-packages hold: a wheel whose verifier child is broken fails to verify even though
    the checkout's editable install would have passed."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    child = site / "kernelflow" / "verification" / "child" / "__main__.py"
    future = "from __future__ import annotations\n"
    broken = future + 'raise SystemExit("this wheel\'s verifier child ran")\n'
    child.write_text(child.read_text().replace(future, broken))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_")}
    env["PYTHONPATH"] = str(site)
    checked = subprocess.run(
        [*KERNELFLOW_VERIFY, "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "this wheel's verifier child ran" in checked.stdout
