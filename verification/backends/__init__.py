"""Kernel backends (DSLs): what each asks of the prompt, the static gate and the sandbox,
as one registered object (:class:`Backend`, :mod:`.base`), which owns every rule and hook
of its DSL (the gate's walker and the sandbox's shared code know none). Built in:
``triton`` (:mod:`.triton`; its gate rules :mod:`.triton_gate`), ``cuda`` (:mod:`.cuda`),
``cupy`` (:mod:`.cupy`) and ``cpp`` (:mod:`.cpp`); more through :func:`register_backend`
or the ``kernelflow.backends`` entry-point group (:mod:`.registry`):

    [project.entry-points."kernelflow.backends"]
    mydsl = "my_package.mydsl:BACKEND"  # a Backend instance whose name is "mydsl"

Adding a DSL is one module (a ``Backend`` subclass and its instance) plus that
registration. The module is imported inside the verifier's sandbox: stdlib only at module
level. A sandbox finds a plugin backend by its entry point, so a plugin must be installed
where the verifier's interpreter runs.
"""

from kernelflow.verification.backends.base import (
    NAME_PATTERN,
    Backend,
    CandidateModule,
    LaunchCounter,
    dotted_name,
)
from kernelflow.verification.backends.registry import (
    DEFAULT_BACKEND,
    ENTRY_POINT_GROUP,
    UnknownBackend,
    backend,
    backend_names,
    plugin_errors,
    register_backend,
    registered,
)

__all__ = [
    "DEFAULT_BACKEND",
    "ENTRY_POINT_GROUP",
    "NAME_PATTERN",
    "Backend",
    "CandidateModule",
    "LaunchCounter",
    "UnknownBackend",
    "backend",
    "backend_names",
    "dotted_name",
    "plugin_errors",
    "register_backend",
    "registered",
]
