"""kernelflow: LLM agents that turn PyTorch operators into verified kernels, as an
event-sourced actor system (README.md). ``from kernelflow import Task`` runs one task
from Python (docs/workflows.md, "The Task API"); the errors a user's own code may catch
are importable from here too."""

from __future__ import annotations

import importlib
from typing import Any

# Public names, by the module that defines them. Imported on first use, by name: every
# layer is a subpackage of this one, and importing one (kernelflow.events, say) must not
# import the runtime, nor make a type checker of that layer read it.
_PUBLIC = {
    "Task": "kernelflow.task",
    "WorkflowError": "kernelflow.workflows.loader",
    "TaskFileError": "kernelflow.verification.taskfile",
    "UnknownBackend": "kernelflow.verification.backends",
    "UnknownPolicy": "kernelflow.verification.policy",
    "UnknownReward": "kernelflow.projections.rewards",
    "SettingsError": "kernelflow.host.settings",
    "RewardClient": "kernelflow.rewards",
    "RewardRequest": "kernelflow.rewards",
    "RewardUnjudged": "kernelflow.rewards",
    "NoVerifierPool": "kernelflow.rewards",
    "RewardTimeout": "kernelflow.rewards",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
