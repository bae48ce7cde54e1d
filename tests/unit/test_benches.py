"""The benches stay in step with the code they measure: a stand-in that overrides a
method of kernelflow's takes what the method is called with (``make bench`` is no test
run, and a bench whose stand-in no longer fits measures a crash loop, not kernelflow)."""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

import pytest

from kernelflow.actors.verifier import Verifier

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)  # defines; main() runs only as a script
    return module


@pytest.mark.parametrize(("bench", "stand_in"), [("conductor_overhead", "NoopVerifier")])
def test_a_benchs_verifier_takes_what_the_verifier_actor_passes(bench: str, stand_in: str) -> None:
    cls = getattr(bench_module(bench), stand_in)
    assert issubclass(cls, Verifier)
    wanted = list(inspect.signature(Verifier.check).parameters)
    assert list(inspect.signature(cls.check).parameters) == wanted
