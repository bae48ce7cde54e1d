"""The backend registry: the built-in backends, ``register_backend`` and entry-point
plugins.

A third-party package adds a backend by declaring an entry point in the group
``kernelflow.backends`` whose object is a :class:`~kernelflow.verification.backends.base.Backend`
instance named as the entry point. Plugins load the first time a name is asked for that
is not registered already, or the whole list is: a sandbox resolving a built-in backend
never scans the installed distributions.
"""

from __future__ import annotations

from functools import cache

from kernelflow.common.plugins import load_plugins, unknown_name
from kernelflow.verification.backends.base import Backend
from kernelflow.verification.backends.cpp import CPP
from kernelflow.verification.backends.cuda import CUDA
from kernelflow.verification.backends.cupy import CUPY
from kernelflow.verification.backends.triton import TRITON

__all__ = [
    "DEFAULT_BACKEND",
    "ENTRY_POINT_GROUP",
    "UnknownBackend",
    "backend",
    "backend_names",
    "plugin_errors",
    "register_backend",
    "registered",
]

ENTRY_POINT_GROUP = "kernelflow.backends"
DEFAULT_BACKEND = TRITON.name

_BACKENDS: dict[str, Backend] = {}


class UnknownBackend(ValueError):
    pass


def register_backend(backend: Backend) -> Backend:
    """Make ``backend`` available to tasks under its ``name``."""
    known = _BACKENDS.get(backend.name)
    if known is not None and known is not backend:
        raise ValueError(f"backend {backend.name!r} is already registered by {known!r}")
    _BACKENDS[backend.name] = backend
    return backend


@cache
def _plugin_errors() -> tuple[str, ...]:
    """Load the entry-point backends once."""

    def problem(name: str, obj: object) -> str | None:
        if not isinstance(obj, Backend):
            return "is not a Backend instance"
        if obj.name != name:
            return f"is a backend named {obj.name!r}"
        return None

    def register(name: str, obj: object) -> None:
        if name not in _BACKENDS:
            register_backend(obj)  # type: ignore[arg-type]

    return load_plugins(ENTRY_POINT_GROUP, problem, register)


def backend_names() -> list[str]:
    """Every backend a task may name (built-ins, registered, plugins), sorted."""
    _plugin_errors()
    return sorted(_BACKENDS)


def registered() -> list[Backend]:
    """The backends registered so far, in their order: the built-ins and
    ``register_backend``'s, not the entry-point plugins (none is looked for)."""
    return list(_BACKENDS.values())


def plugin_errors() -> list[str]:
    return list(_plugin_errors())


def backend(name: str) -> Backend:
    """The backend called ``name``; raises :class:`UnknownBackend` (a ValueError) with the
    known names if there is none."""
    found = _BACKENDS.get(name)
    if found is not None:
        return found
    problems = _plugin_errors()
    if name in _BACKENDS:
        return _BACKENDS[name]
    raise UnknownBackend(unknown_name("backend", name, _BACKENDS, problems))


register_backend(TRITON)
register_backend(CUDA)
register_backend(CUPY)
register_backend(CPP)
