"""A new kernel DSL is one module plus one registration (docs/extending.md,
"A new verifier backend (a kernel DSL)"): ``toyk``, a pure-Python kernel language, and its
backend live in the one module below; an entry point registers it. Nothing of kernelflow
changes for it: the static gate judges its candidates by the shared rules and its hooks,
the sandbox starts its runtime and counts its launches, and the report carries its
version. A correct candidate passes, cheats are refused, and so is another backend's DSL
it does not borrow (Triton)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.verification.backends import registry
from kernelflow.verification.gate import gate_findings
from tests.child_jobs import RELU_TASK, run_child_job
from tests.plugins import plugin_site

# The whole backend: the DSL itself (a decorator and a launcher) and what kernelflow asks
# of it. Stdlib (and kernelflow's backend seam) at module level: the sandbox imports it.
TOYK = '''
"""toyk: kernels are scalar Python functions, launched over every element of a tensor."""

import ast
import contextlib

from kernelflow.verification.backends import Backend

_LAUNCHES = None  # the sandbox's launch counter, once the backend's runtime is started


class Kernel:
    def __init__(self, fn):
        self.fn = fn


def kernel(fn):
    """``@toyk.kernel``: ``fn`` maps one number to one number."""
    return Kernel(fn)


def launch(k, x):
    """A new tensor: ``k`` applied to every element of ``x``."""
    import torch

    if not isinstance(k, Kernel):
        raise TypeError("toyk.launch launches @toyk.kernel functions")
    counted = _LAUNCHES.launching() if _LAUNCHES is not None else contextlib.nullcontext()
    with counted:
        values = [float(k.fn(v)) for v in x.detach().reshape(-1).tolist()]
        return torch.tensor(values, dtype=x.dtype, device=x.device).reshape(x.shape)


class ToyBackend(Backend):
    name = "toyk"
    title = "toyk (pure-Python kernels)"
    dsl_notes = "## toyk in brief\\n- `@toyk.kernel` a scalar function, `toyk.launch(k, x)`."
    extra_imports = ("toyk",)
    launch_label = "toyk kernel"
    cpu_runs = "toyk in pure Python"

    def check_kernels(self, module):
        kernels = {
            fn.name
            for fn in ast.walk(module.tree)
            if isinstance(fn, ast.FunctionDef)
            and any(module.resolve(d) == "toyk.kernel" for d in fn.decorator_list)
        }
        launched = any(
            isinstance(call, ast.Call)
            and module.resolve(call.func) == "toyk.launch"
            and call.args
            and isinstance(call.args[0], ast.Name)
            and call.args[0].id in kernels
            for fn, is_init in module.functions()
            if not is_init
            for call in ast.walk(fn)
        )
        if not launched:
            module.add("no_kernel", module.tree, "no @toyk.kernel is launched (toyk.launch)")

    def check_library_call(self, module, node, name):
        if not name.startswith("toyk."):
            return False
        if name not in ("toyk.launch", "toyk.kernel"):
            module.add("torch_compute", node, f"`{name}` is not a toyk kernel or launch")
        return True

    def start_runtime(self, device, launches):
        global _LAUNCHES
        _LAUNCHES = launches

    def versions(self):
        return {"toyk": "0.1"}


BACKEND = ToyBackend()
'''

CORRECT = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import toyk


    @toyk.kernel
    def relu(v):
        return v if v > 0.0 else 0.0


    class ModelNew(nn.Module):
        def forward(self, x):
            return toyk.launch(relu, x)
    """
)
# The reference's own op in forward: refused before anything runs.
TORCH_OP = CORRECT.replace("return toyk.launch(relu, x)", "return torch.relu(x)")
# The op hidden in the kernel, which runs during the launch where no guard looks.
TORCH_IN_KERNEL = CORRECT.replace("return v if v > 0.0 else 0.0", "return torch.relu(v)")
# Another backend's DSL, which toyk does not borrow.
TRITON = CORRECT.replace("import toyk\n", "import toyk\nimport triton\n")
# Passes the gate (a launch is written), launches nothing: caught in the sandbox.
NO_LAUNCH = CORRECT.replace(
    "return toyk.launch(relu, x)",
    "if x.dim() > 8:\n            return toyk.launch(relu, x)\n        return x.new_zeros(x.shape)",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one module, and its one registration: an entry point in kernelflow.backends."""
    return plugin_site(
        tmp_path_factory.mktemp("site"),
        "toyk",
        "kernelflow.backends",
        "toyk = toyk:BACKEND",
        {"toyk": TOYK},
    )


@pytest.fixture
def installed(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The module installed where this process looks for plugins (found by its entry
    point, as the sandbox finds it)."""
    monkeypatch.syspath_prepend(str(site))
    registry._plugin_errors.cache_clear()
    yield
    registry._BACKENDS.pop("toyk", None)
    registry._plugin_errors.cache_clear()


def verify(source: str, work: Path, site: Path) -> dict[str, object]:
    """The verifier's two steps: the static gate, then (if it passes) the sandbox."""
    refusals, _ = gate_findings(source, backend="toyk", task_source=RELU_TASK)
    if refusals:
        return {"verdict": "rejected_static", "reasons": [v.text() for v in refusals]}
    return run_child_job(work, source, site, backend="toyk")


@pytest.mark.usefixtures("installed")
def test_a_correct_toyk_candidate_passes_gate_and_sandbox(tmp_path: Path, site: Path) -> None:
    result = verify(CORRECT, tmp_path, site)
    assert result["verdict"] == "pass", json.dumps(result)
    # The report says what judged it: the backend's own version and how it ran on the CPU.
    text = json.dumps(result)
    assert '"toyk": "0.1"' in text and "toyk in pure Python" in text, text


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("source", "rule"),
    [(TORCH_OP, "torch_compute"), (TORCH_IN_KERNEL, "callback"), (TRITON, "forbidden_import")],
    ids=["torch_op_in_forward", "torch_op_in_the_kernel", "triton_not_borrowed"],
)
def test_the_gate_refuses_toyk_cheats(source: str, rule: str, tmp_path: Path, site: Path) -> None:
    result = verify(source, tmp_path, site)
    assert result["verdict"] == "rejected_static", result
    assert any(str(r).startswith(rule) for r in result["reasons"]), result  # type: ignore[attr-defined]


@pytest.mark.usefixtures("installed")
def test_the_sandbox_counts_toyk_launches(tmp_path: Path, site: Path) -> None:
    result = verify(NO_LAUNCH, tmp_path, site)
    assert result["verdict"] == "rejected_runtime", result
    assert "forward() launched no toyk kernel" in str(result["reasons"])
