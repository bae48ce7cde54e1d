"""The ``cpp`` backend: C++ kernels (OpenMP allowed) in source strings, built with
``torch.utils.cpp_extension.load_inline`` and run and timed on the CPU.

The verifier builds each extension itself before the check, in a sandbox of its own with a
time limit of its own, from the sources it read in the candidate's module
(:mod:`.extension`), and caches what it built; in the candidate's process ``load_inline``
then loads that library instead of compiling (what the candidate asks for must be what
was built), and each call of one of its functions counts as a kernel launch. The C++
itself passes the rules of :mod:`.cpp_rules`.

Imported inside sandboxes: stdlib only at module level (torch inside the hooks).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
from pathlib import Path
from typing import Any, ClassVar

from kernelflow.verification.backends.base import Backend, CandidateModule, LaunchCounter
from kernelflow.verification.backends.cpp_rules import cpp_findings
from kernelflow.verification.backends.extension import (
    LOAD_INLINE,
    ExtensionSpec,
    extension_specs,
    module_resolver,
    spec_from_call,
)
from kernelflow.verification.backends.extension_calls import ExtensionUses, extension_uses

__all__ = ["CPP", "PREBUILT_MANIFEST", "CppBackend", "ExtensionBackend"]

# In the candidate's work dir: the extensions the verifier built for it.
PREBUILT_MANIFEST = "extensions/manifest.json"
_BUILD_ONE = (
    'build it at module level: `ext = load_inline(name="my_ext", cpp_sources=SRC, '
    'functions=["my_forward"])` and call `ext.my_forward(x)` in forward'
)
_EXTENSION_ELSEWHERE = (
    "this candidate builds a C++/CUDA extension (load_inline), which this backend does not take",
    "verify it with --backend cpp (or cuda on a GPU), or write this backend's kernel instead",
)

DSL_NOTES = """\
## C++ on the CPU in brief (torch.utils.cpp_extension.load_inline)
- Put the C++ in a module-level string: `#include <torch/extension.h>`, and functions taking and returning `torch::Tensor`; build it once at module level: `ext = load_inline(name="my_ext", cpp_sources=SRC, functions=["my_forward"], extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])`, and call `ext.my_forward(x)` in `forward`.
- Give load_inline only literals and module-level strings (the verifier compiles what it reads; no build_directory, no include paths).
- Inside: `x = x.contiguous()`, allocate with `torch::empty_like(x)` / `torch::empty({n, m}, x.options())`, read and write through `x.data_ptr<float>()` with sizes from `x.size(i)`; the ATen ops themselves (`at::gelu`, `x.sum()`, `torch::matmul`) may not do the work.
- Parallelise the outer loop with `#pragma omp parallel for` (or `at::parallel_for`), keep the inner loop contiguous and simple so the compiler vectorises it (`-O3 -march=native`), fuse the whole computation into one pass over memory, block reductions and matmuls for the cache.
- No `static` or global mutable state, no threads of your own, no files: each call computes from its inputs.
"""  # noqa: E501  (prompt text: one bullet a line)


class ExtensionBackend(Backend):
    """A backend whose kernels are ``load_inline`` extensions (``cpp``; ``cuda`` adds CUDA
    sources): the gate's checks of the calls and the sources, the launch counting of the
    built functions."""

    glue_paths: ClassVar[tuple[str, ...]] = (LOAD_INLINE,)
    borrows: ClassVar[tuple[str, ...]] = ("triton",)
    # forward() must call its extension's functions: a Triton kernel beside them is judged
    # by the gate and watched by the guards, but is not the extension's launch.
    counts_borrowed_launches: ClassVar[bool] = False
    source_kinds: ClassVar[tuple[str, ...]] = ("cpp_sources",)
    # Where the verifier put the libraries it built for this check (the candidate's work
    # dir; set in the sandbox, whose process checks one candidate and ends).
    prebuilt: str = ""
    # The last module judged and its uses of its extensions (the gate asks for each node).
    _last_uses: tuple[ast.Module, ExtensionUses] | None = None

    def check_kernels(self, module: CandidateModule) -> None:
        """An extension built with ``load_inline`` from readable sources that pass the C++
        rules, one of whose functions a function of the module calls."""
        built, problems = extension_specs(module.tree, module.resolve)
        for node, problem, instead in problems:
            module.add("no_kernel", node, problem, instead)
        if not built and not problems:
            module.add(
                "no_kernel",
                module.tree,
                "no extension is built with load_inline",
                _BUILD_ONE,
            )
            return
        for node, spec in built:
            if spec.cuda_sources and "cuda_sources" not in self.source_kinds:
                module.add(
                    "no_kernel",
                    node,
                    f"backend {self.name!r} builds no CUDA sources",
                    "verify it with --backend cuda on a GPU, or write the kernel in "
                    "cpp_sources (C++ with OpenMP)",
                )
            for kind in self.source_kinds:
                for source in getattr(spec, kind):
                    lines = source.splitlines()
                    for rule, line, message, instead in cpp_findings(
                        source, task_uses_half=module.task_uses_half
                    ):
                        code = lines[line - 1].strip() if line <= len(lines) else ""
                        module.add(
                            rule, node, message, instead, found=code, place=f"{kind} line {line}"
                        )
        calls = self._uses(module).calls
        in_forward = {
            id(node)
            for fn, is_init in module.functions()
            if not is_init
            for node in ast.walk(fn)
            if id(node) in calls
        }
        if built and not in_forward:
            module.add(
                "no_kernel",
                module.tree,
                "no function of the extension is called by the module's forward",
                "call one of the functions load_inline's functions=[...] names from forward: "
                "`ext.my_forward(x)` or `self.ext.my_forward(x)`",
            )

    def foreign_kernel(self, tree: ast.Module, judge: Backend) -> tuple[int, str, str] | None:
        """The module's first ``load_inline`` call, if it makes one and ``judge`` takes no
        extensions."""
        if LOAD_INLINE in judge.glue_paths:
            return None
        resolve = module_resolver(tree)
        calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call))
        call = next((call for call in calls if resolve(call.func) == LOAD_INLINE), None)
        return (call.lineno, *_EXTENSION_ELSEWHERE) if call is not None else None

    def check_library_call(self, module: CandidateModule, node: ast.Call, name: str) -> bool:
        """A call of the extension's functions (``ext.fn(x)``, ``self.fn(x)``...) is the
        kernel: none of the PyTorch rules apply to its name."""
        return id(node) in self._uses(module).calls

    def holds_kernel(self, module: CandidateModule, node: ast.AST) -> bool:
        """A name or attribute bound to an extension or one of its functions."""
        return id(node) in self._uses(module).holders

    def _uses(self, module: CandidateModule) -> ExtensionUses:
        """How the module uses its extensions (worked out once per module)."""
        cached = self._last_uses
        if cached is not None and cached[0] is module.tree:
            return cached[1]
        built, _ = extension_specs(module.tree, module.resolve)
        uses = extension_uses(module.tree, built)
        self._last_uses = (module.tree, uses)
        return uses

    def use_prebuilt(self, directory: str) -> None:
        self.prebuilt = directory

    def start_runtime(self, device: str, launches: LaunchCounter) -> None:
        self.count_launches(launches)

    def count_launches(self, launches: LaunchCounter) -> None:
        """``load_inline`` loads what the verifier built instead of compiling; each call of
        one of the extension's functions is a launch."""
        import torch.utils.cpp_extension as cpp_extension

        built = _load_manifest(self.prebuilt)
        original = cpp_extension.load_inline
        signature = inspect.signature(original)

        def load_inline(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs).arguments
            spec = spec_from_call(bound)
            library = built.get(spec)
            if library is None:
                launches.refuse(
                    "extension",
                    f"load_inline({spec.name!r}) asks for an extension other than the one "
                    "the verifier built from the module's sources",
                )
            return _Extension(library, spec, launches)

        cpp_extension.load_inline = load_inline


class CppBackend(ExtensionBackend):
    name = "cpp"
    title = "C++ (torch.utils.cpp_extension.load_inline, OpenMP) on the CPU"
    device_note = (
        "Kernels are C++ built with load_inline and run and timed on the CPU (OpenMP for "
        "threads); the speedup is measured against eager PyTorch on the same threads."
    )
    dsl_notes = DSL_NOTES
    launch_label = "function of the load_inline extension"
    runtime_unavailable = "torch's C++ extensions cannot be loaded here"
    timed_on = frozenset({"cpu"})


class _Extension:
    """What ``load_inline`` gives the candidate: the built module's functions, each call
    counted as a kernel launch."""

    def __init__(self, library: str, spec: ExtensionSpec, launches: LaunchCounter) -> None:
        module_name = Path(library).name.split(".")[0]
        found = importlib.util.spec_from_file_location(module_name, library)
        if found is None or found.loader is None:
            raise ImportError(f"cannot load the built extension {library}")
        module = importlib.util.module_from_spec(found)
        found.loader.exec_module(module)
        for function in spec.exposed():
            setattr(self, function, _counted(getattr(module, function), launches))


def _counted(function: Any, launches: LaunchCounter) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        with launches.launching():
            return function(*args, **kwargs)

    return call


def _load_manifest(directory: str) -> dict[ExtensionSpec, str]:
    """The extensions built for this candidate: spec -> path of its library."""
    path = Path(directory, PREBUILT_MANIFEST) if directory else None
    if path is None or not path.exists():
        return {}
    entries = json.loads(path.read_text())
    return {
        ExtensionSpec.from_json(entry["spec"]): str(path.parent / entry["library"])
        for entry in entries
    }


CPP = CppBackend()
