"""The versions a task starts with, recorded on its ``TaskSubmitted`` (``versions``), and
what differs from them today (docs/workflows.md, "Versions pinned on a task"): the
workflow's text (its SHA-256), the verifier's version, the strictness policy, the
toolchain of the process that accepted the task (torch, Triton, the C++ compiler) and the
LLM spec each of its agents answers with. ``kernelflow replay``, ``fork`` and ``reverify``
say what differs from the versions of the process they run in.

The toolchain is read without running anything (package metadata, and the compiler the
``c++`` on the PATH resolves to); each verification also records the environment of the
node that checked it (``VerificationReport.environment``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from kernelflow.common.redact import scrub
from kernelflow.events.model import TaskSubmitted
from kernelflow.verification.engine import VERIFIER_VERSION
from kernelflow.workflows.loader import WorkflowError, resolve_workflow

# The packages of the toolchain, by the name they are recorded under.
_PACKAGES = {"torch": "torch", "triton": "triton"}


@functools.cache  # what a process runs with does not change while it runs
def toolchain() -> dict[str, str]:
    """torch, Triton and the C++ compiler of this process ("none": not installed)."""
    found = {}
    for key, package in _PACKAGES.items():
        try:
            found[key] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            found[key] = "none"
    compiler = shutil.which("c++")
    found["compiler"] = os.path.realpath(compiler) if compiler else "none"
    return found


def workflow_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def llm_specs(provider: object | None, agents: Iterable[str]) -> dict[str, str]:
    """The LLM spec each agent answers with (``llm``: the one every agent shares, else
    ``llm.<agent>`` each), credentials scrubbed; nothing where there is no LLM."""
    config = getattr(provider, "config", None)
    for_agent = getattr(config, "for_agent", None)
    if for_agent is None:
        name = getattr(provider, "name", None)
        return {"llm": str(name)} if name else {}
    specs = {agent: scrub(str(for_agent(agent).provider or "none")) for agent in agents}
    if len(set(specs.values())) <= 1:
        return {"llm": next(iter(specs.values()), "none")}
    return {f"llm.{agent}": spec for agent, spec in sorted(specs.items())}


def pinned_versions(workflow_yaml: str, policy: str, llm: Mapping[str, str]) -> dict[str, str]:
    """What a task starting now in this process starts with."""
    return {
        "workflow_sha256": workflow_hash(workflow_yaml),
        "verifier": str(VERIFIER_VERSION),
        "policy": policy,
        **toolchain(),
        **llm,
    }


def versions_today(
    submitted: TaskSubmitted, workflow_dirs: Sequence[Path] = (), llm: str | None = None
) -> dict[str, str]:
    """The versions of this process to compare ``submitted``'s with: the verifier, the
    toolchain, the text of the workflow of that name found here today (none found: not
    compared), the LLM spec ``llm`` (None: not compared). The policy is the task's choice,
    not a version: it is not compared."""
    today = {"verifier": str(VERIFIER_VERSION), **toolchain()}
    try:
        _, text = resolve_workflow(submitted.workflow_name, workflow_dirs)
        today["workflow_sha256"] = workflow_hash(text)
    except (WorkflowError, OSError):
        pass
    if llm:
        today["llm"] = scrub(llm)
    return today


def differences(pinned: Mapping[str, str], today: Mapping[str, str]) -> list[str]:
    """``name: recorded → today`` for each version recorded that is otherwise today (a
    version today does not know, an LLM not configured here, is not compared)."""
    said = []
    for key, recorded in pinned.items():
        now = today.get(key)
        if now is None or now == recorded:
            continue
        if key == "workflow_sha256":
            said.append(f"workflow text: {recorded[:12]} → {now[:12]} (sha256)")
        else:
            said.append(f"{key}: {recorded} → {now}")
    return said
