"""The verifier's sandbox process stays light: started as ``python -I -m
kernelflow.verification.child``, it imports the sandbox, child and backends packages and
the stdlib (torch and triton where a check needs them), never the daemon's dependencies."""

from __future__ import annotations

import json
import subprocess
import sys

from kernelflow.verification.engine import CHILD_MODULE

DAEMON_ONLY = {"msgspec", "nats", "pykka", "yaml"}
# The namespace packages on the way (all empty), then the packages a sandbox may use.
PARENTS = {"kernelflow", "kernelflow.verification", "kernelflow.common"}
SANDBOX_PACKAGES = (
    CHILD_MODULE,
    "kernelflow.sandbox",
    "kernelflow.verification.backends",
    "kernelflow.common.plugins",  # the backends' plugin loader: stdlib only
    "kernelflow.common.suggest",  # its "did you mean": stdlib only
)


def in_sandbox_packages(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in SANDBOX_PACKAGES)


def test_the_sandbox_process_imports_nothing_of_the_daemon() -> None:
    code = (
        "import json, sys\n"
        f"import {CHILD_MODULE}.__main__\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    modules = json.loads(done.stdout)
    assert not [m for m in modules if m.split(".")[0] in DAEMON_ONLY]
    ours = {m for m in modules if m.split(".")[0] == "kernelflow"}
    assert sorted(m for m in ours - PARENTS if not in_sandbox_packages(m)) == []
    assert f"{CHILD_MODULE}.job" in ours and "kernelflow.verification.backends.cuda" in ours
    assert "torch" not in modules  # imported where a check needs it, not on import
