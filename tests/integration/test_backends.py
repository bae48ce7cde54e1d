"""The backend seam: a kernel DSL is one registered object. A tiny third backend, installed
as an entry-point plugin, is listed, accepted at submit (an unknown one is rejected), its
notes reach the prompt, and the static gate and the sandbox use its hooks."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.actors.conductor import Conductor
from kernelflow.actors.prompts import agent_messages
from kernelflow.actors.worker import Message
from kernelflow.events import subjects
from kernelflow.events.codec import decode_command, encode
from kernelflow.events.model import BACKEND_NAME_PATTERN, SubmitTask, TaskRejected, TaskSubmitted
from kernelflow.projections.task_state import fold
from kernelflow.verification.backends import (
    NAME_PATTERN,
    Backend,
    UnknownBackend,
    backend,
    backend_names,
    register_backend,
)
from kernelflow.verification.backends import registry as backend_registry
from kernelflow.verification.gate import check_candidate
from kernelflow.workflows.loader import load_workflow
from tests import plugins
from tests.child_jobs import RELU_TASK, run_child_job
from tests.conftest import EXAMPLES, KERNELFLOW
from tests.memory import running_bridge

RELU_SOLUTION = (EXAMPLES / "candidates" / "solutions" / "relu.py").read_text()
TINY_RELU = RELU_SOLUTION.replace("relu_kernel", "relu_tiny")

# A DSL that is Triton with rules of its own: kernels named `*_tiny`, numpy's float32 as
# the one glue of its library.
TINY_SOURCE = """
import ast

from kernelflow.verification.backends import Backend
from kernelflow.verification.backends.triton import count_triton_launches


class TinyBackend(Backend):
    name = "tiny"
    title = "Tiny-Triton"
    device_note = "Tiny kernels are checked wherever Triton runs."
    dsl_notes = "## Tiny in brief\\n- Name every kernel `<what>_tiny`."
    extra_imports = ("numpy",)
    borrows = ("triton",)  # its kernels are Triton's
    launch_label = "tiny kernel"

    def check_kernels(self, module):
        if not any(name.endswith("_tiny") for name in module.jit_kernels):
            module.add("no_kernel", module.tree, "no @triton.jit kernel named *_tiny")

    def check_library_call(self, module, node, name):
        if not name.startswith("numpy."):
            return False
        if name != "numpy.float32":
            module.add("torch_compute", node, f"`{name}` is numpy compute")
        return True

    def start_runtime(self, device, launches):
        count_triton_launches(launches)


BACKEND = TinyBackend()
"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A distribution whose ``kernelflow.backends`` entry point is the tiny backend."""
    return plugins.plugin_site(
        tmp_path_factory.mktemp("site"),
        "tiny-backend",
        "kernelflow.backends",
        "tiny = tiny_backend:BACKEND",
        {"tiny_backend": TINY_SOURCE},
    )


@pytest.fixture
def tiny(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """The tiny backend registered in this process for the length of a test."""
    monkeypatch.syspath_prepend(str(plugin_site))
    module = importlib.import_module("tiny_backend")
    registered = register_backend(module.BACKEND)
    yield registered
    del backend_registry._BACKENDS[registered.name]


def plugin_env(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site)}


# --------------------------------------------------------------------------- registry


def test_the_built_in_backends_are_registered_and_an_unknown_name_is_refused() -> None:
    assert {"triton", "cuda"} <= set(backend_names())
    assert backend("cuda").needs_gpu and not backend("triton").needs_gpu
    with pytest.raises(UnknownBackend, match=r"unknown backend 'cobol'; known: .*triton"):
        backend("cobol")


def test_a_backend_name_must_be_one_a_task_can_carry() -> None:
    for name in backend_names():
        command = decode_command(encode(SubmitTask(task_source="x", backend=name)))
        assert isinstance(command, SubmitTask) and command.backend == name
    assert NAME_PATTERN == BACKEND_NAME_PATTERN
    with pytest.raises(ValueError, match=re.escape(f"'Tiny DSL!' does not match {NAME_PATTERN}")):
        type("Shouty", (Backend,), {"name": "Tiny DSL!"})


def test_a_name_taken_by_another_backend_cannot_be_registered_again(tiny: Backend) -> None:
    assert register_backend(tiny) is tiny  # the same object: nothing changes
    with pytest.raises(ValueError, match="already registered"):
        register_backend(type(tiny)())


def test_a_plugin_backend_is_listed_through_its_entry_point(plugin_site: Path) -> None:
    probe = (
        "import json\n"
        "from kernelflow.verification.backends import backend, backend_names, plugin_errors\n"
        "print(json.dumps([backend_names(), backend('tiny').title, plugin_errors()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=plugin_env(plugin_site),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    names, title, errors = json.loads(out.stdout)
    assert {"tiny", "triton", "cuda"} <= set(names) and title == "Tiny-Triton" and errors == []
    # The CLI offers it: `agents` lists it and `run`/`verify` take it as --backend.
    env = plugin_env(plugin_site)
    listed = subprocess.run(
        [*KERNELFLOW, "agents", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(listed.stdout)["backends"]["tiny"]["title"] == "Tiny-Triton"
    helped = subprocess.run(
        [*KERNELFLOW, "verify", "--help"], env=env, capture_output=True, text=True, timeout=60
    )
    assert "{cpp,cuda,cupy,tiny,triton}" in helped.stdout


# --------------------------------------------------------------------------- submit


def submit_message(command: SubmitTask, stream_seq: int) -> Message:
    return Message(
        source="command",
        subject=subjects.SUBMIT,
        data=encode(command),
        headers={},
        stream_seq=stream_seq,
        deliveries=1,
    )


def test_the_conductor_accepts_a_registered_backend_and_rejects_an_unknown_one(
    tiny: Backend,
) -> None:
    with running_bridge() as bridge:  # the conductor handed the commands: the memory log
        conductor = Conductor(bridge, llm=None)
        first: dict[str, object] = {}
        for name in ("tiny", "cobol"):
            task_id = f"backend-{name}-{uuid.uuid4().hex[:8]}"
            command = SubmitTask(task_id=task_id, task_source=RELU_TASK, backend=name)
            assert conductor.handle(submit_message(command, stream_seq=1)) == "ack"
            first[name] = bridge.call(bridge.log.read_task(task_id)).events[0]
    accepted, rejected = first["tiny"], first["cobol"]
    assert isinstance(accepted, TaskSubmitted) and accepted.backend == "tiny"
    assert isinstance(rejected, TaskRejected)
    assert rejected.reason.startswith("unknown backend 'cobol'; known: ")
    assert "tiny" in rejected.reason


# --------------------------------------------------------------------------- prompt, gate


def test_the_backend_notes_reach_the_prompt(
    tiny: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow, workflow_yaml = load_workflow("default")
    submitted = TaskSubmitted(
        task_id="t1",
        seq=1,
        task_name="relu",
        task_source=RELU_TASK,
        workflow_name="default",
        workflow_yaml=workflow_yaml,
        backend="tiny",
        group_id="g",
    )

    def system_prompt() -> str:
        return agent_messages(fold("t1", [submitted]), workflow, "coder")[0].content

    system = system_prompt()
    assert "verified Tiny-Triton kernels" in system
    assert "Name every kernel `<what>_tiny`." in system
    assert ", numpy" in system  # its extra import, in the list of allowed ones
    assert "@triton.jit" not in system  # Triton's own notes are Triton's
    (tmp_path / "dsl_tiny.txt").write_text("House notes on Tiny.\n")
    monkeypatch.setenv("KF_PROMPTS_DIR", str(tmp_path))
    overridden = system_prompt()
    assert "House notes on Tiny." in overridden and "<what>_tiny" not in overridden


def test_the_gate_applies_the_backends_rules(tiny: Backend) -> None:
    def rules(source: str, name: str = "tiny") -> list[str]:
        return [v.rule for v in check_candidate(source, backend=name, task_source=RELU_TASK)]

    assert rules(TINY_RELU) == []
    assert rules(RELU_SOLUTION) == ["no_kernel"]  # not named the tiny way
    with_numpy = TINY_RELU.replace("import torch\n", "import numpy\nimport torch\n", 1)
    glue = with_numpy.replace("        x = x.contiguous()\n", "        numpy.float32(1)\n")
    compute = with_numpy.replace("        x = x.contiguous()\n", "        numpy.sum(1)\n")
    assert rules(glue) == []
    assert rules(compute) == ["torch_compute"]
    assert "forbidden_import" in rules(glue, "triton")  # numpy is tiny's, not Triton's


# --------------------------------------------------------------------------- sandbox


def test_the_sandbox_readies_the_backends_runtime_and_checks_its_launches(
    tmp_path: Path, plugin_site: Path
) -> None:
    passed = run_child_job(tmp_path / "a", TINY_RELU, plugin_site, backend="tiny")
    assert passed["verdict"] == "pass", json.dumps(passed)  # its launches were counted
    lazy = textwrap.dedent(
        """
        import torch
        import torch.nn as nn


        class ModelNew(nn.Module):
            def forward(self, x):
                return torch.zeros_like(x)
        """
    )
    refused = run_child_job(tmp_path / "b", lazy, plugin_site, backend="tiny")
    assert refused["verdict"] == "rejected_runtime", refused
    assert "forward() launched no tiny kernel" in str(refused["reasons"])
