"""Loading what a check runs and handling the values it passes around: a task or candidate
module imported from its file, seeding, inputs moved to the device and copied, nested
outputs walked leaf by leaf.

Child side: stdlib at module level; torch and numpy are imported where they are used.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

__all__ = ["clone", "flatten", "load_module", "seed_all", "structure", "to_device"]


def load_module(path: Path, name: str) -> Any:
    """Import a module from a file under a unique name.

    Registered in ``sys.modules`` before execution: dataclasses, pickling and Triton's
    source lookup (``inspect.getsource`` for ``@triton.jit``) expect a real module.
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path.name}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    try:
        import numpy as np

        np.random.seed(seed % (2**32))
    except ImportError:  # numpy is optional for the check itself
        pass


def to_device(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list | tuple):
        return type(value)(to_device(v, device) for v in value)
    return value


def clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list | tuple):
        return type(value)(clone(v) for v in value)
    return value


def flatten(value: Any, path: str) -> list[tuple[str, Any]]:
    """Leaves of an output: tensors, or tuples/lists of them (nested), with a path name."""
    if isinstance(value, list | tuple):
        out: list[tuple[str, Any]] = []
        for i, v in enumerate(value):
            out.extend(flatten(v, f"{path}[{i}]"))
        return out
    return [(path, value)]


def structure(value: Any) -> str:
    if isinstance(value, list | tuple):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
