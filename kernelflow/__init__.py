"""kernelflow: LLM agents that turn PyTorch operators into verified kernels, as an
event-sourced actor system (README.md). ``from kernelflow import Task`` runs one task
from Python (docs/workflows.md, "The Task API")."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Task"]


def __getattr__(name: str) -> Any:
    # Imported on first use, by name: every layer is a subpackage of this one, and
    # importing one (kernelflow.events, say) must not import the runtime, nor make a type
    # checker of that layer read it.
    if name == "Task":
        return importlib.import_module("kernelflow.task").Task
    raise AttributeError(f"module 'kernelflow' has no attribute {name!r}")
