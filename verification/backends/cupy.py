"""The ``cupy`` backend: CUDA C kernels in source strings, compiled and launched with CuPy
``RawModule``/``RawKernel`` on a GPU (the ``cupy`` extra); without one the verdict is
``unsupported``. (KernelBench's own CUDA format, ``load_inline`` with ``cuda_sources``, is
the ``cuda`` backend: :mod:`.cuda`.)

Imported inside sandboxes: stdlib only at module level (cupy and torch inside the hooks).
"""

from __future__ import annotations

import ast
from typing import Any

from kernelflow.verification.backends.base import Backend, CandidateModule, LaunchCounter

__all__ = ["CUPY", "CupyBackend"]

DSL_NOTES = """\
## CUDA C in brief (compiled with CuPy)
- Put the kernel source in a Python string with `extern "C" __global__ void name(...)`, compile it once in `__init__` with `cupy.RawModule(code=SRC)` and `get_function("name")` (or `cupy.RawKernel(SRC, "name")`).
- Launch with `kernel((blocks,), (threads,), (arg1, arg2, ...))`: pass tensors as pointers (`x.data_ptr()`), sizes wrapped in their C type (e.g. `cupy.int32(n)`; cupy is the one extra import allowed), and compute `blocks = (n + threads - 1) // threads`. Guard every access with `if (i < n)`.
- Use a grid-stride loop or enough blocks to cover any size; index multi-dimensional tensors with their strides or make them contiguous first.
- Reductions: one block per row with shared memory (`__shared__`) and `__syncthreads()`, or warp shuffles (`__shfl_down_sync`); accumulate in `float`, subtract the max before `expf` in softmax.
- Launch on the current PyTorch stream's device; allocate outputs with `torch.empty_like` / `torch.empty(..., device=x.device)`.
"""  # noqa: E501  (prompt text: one bullet a line)

# cupy.<name> a candidate may call outside __init__: zero-copy views of torch tensors,
# scalar types for kernel arguments, the raw-kernel classes. Anything else is CuPy's own
# compute (or memory tricks) standing in for the candidate's kernel.
CUPY_GLUE = {
    "RawKernel",
    "RawModule",
    "from_dlpack",
    "fromDlpack",
    "asarray",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "intp",
    "float16",
    "float32",
    "float64",
    "bool_",
    "dtype",
}
RAW_KERNEL_CLASSES = {"cupy.RawKernel", "cupy.RawModule"}


class CupyBackend(Backend):
    name = "cupy"
    title = "CUDA C (compiled with CuPy RawModule)"
    needs_gpu = True
    device_note = (
        "Kernels are compiled and checked on the GPU; without one the verifier answers "
        "'unsupported', so write code that runs unchanged on a CUDA device."
    )
    dsl_notes = DSL_NOTES
    extra_imports = ("cupy",)
    borrows = ("triton",)
    launch_label = "CUDA kernel (cupy.RawKernel)"
    runtime_unavailable = "CuPy cannot compile and launch CUDA kernels here"

    def check_kernels(self, module: CandidateModule) -> None:
        """A ``__global__`` kernel in a source string, compiled with ``cupy.RawKernel`` or
        ``cupy.RawModule(...).get_function``, and launched (called) inside a function."""
        has_global = any(
            isinstance(n, ast.Constant) and isinstance(n.value, str) and "__global__" in n.value
            for n in ast.walk(module.tree)
        )

        def makes_kernel(call: ast.AST) -> bool:
            if not isinstance(call, ast.Call):
                return False
            full = module.resolve(call.func) or ""
            return full == "cupy.RawKernel" or (
                isinstance(call.func, ast.Attribute) and call.func.attr == "get_function"
            )

        def handle(target: ast.AST) -> str | None:
            if isinstance(target, ast.Name):
                return target.id
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                return "self." + target.attr
            return None

        compiled = any(
            (module.resolve(n.func) or "") in RAW_KERNEL_CLASSES
            for n in ast.walk(module.tree)
            if isinstance(n, ast.Call)
        )
        kernels: set[str] = set()
        for node in ast.walk(module.tree):
            if isinstance(node, ast.Assign) and makes_kernel(node.value):
                kernels.update(h for t in node.targets if (h := handle(t)))
        launched = False
        for func, _ in module.functions():
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and (
                    makes_kernel(node.func) or handle(node.func) in kernels
                ):
                    launched = True
        problem = (
            "no `__global__` kernel in the CUDA source"
            if not has_global
            else "the kernel is not compiled with cupy.RawKernel or cupy.RawModule"
            if not compiled
            else "the compiled kernel is never launched by a function "
            "(kernel((blocks,), (threads,), (args...)))"
            if not launched
            else ""
        )
        if problem:
            module.add(
                "no_kernel",
                module.tree,
                problem,
                'compile a `__global__` kernel with cupy.RawKernel(SRC, "name") (or '
                "RawModule) and launch it in forward(): kernel((blocks,), (threads,), (args...))",
            )

    def check_library_call(self, module: CandidateModule, node: ast.Call, name: str) -> bool:
        """CuPy calls: views, dtypes and the raw-kernel classes only; no streams."""
        if not name.startswith("cupy."):
            return False
        parts = name.split(".")
        if parts[1] == "cuda":
            if parts[2:3] != ["Device"]:
                module.add(
                    "stream_trick",
                    node,
                    f"`{name}`: CuPy's streams, events and graphs move work out of the timed "
                    "stream",
                    "launch on the current stream; of cupy.cuda use only Device",
                )
        elif parts[1] not in CUPY_GLUE or len(parts) > 2:
            module.add(
                "torch_compute",
                node,
                f"`{name}` is CuPy library compute standing in for the kernel",
                "compute it in your RawKernel; of CuPy use cupy.from_dlpack / cupy.asarray "
                "views, dtypes and RawKernel/RawModule",
            )
        return True

    def count_launches(self, launches: LaunchCounter) -> None:
        import cupy

        _count_raw_kernel_launches(cupy, launches)

    def start_runtime(self, device: str, launches: LaunchCounter) -> None:
        """CuPy, counting raw-kernel launches (Triton's, which it borrows, are counted by
        Triton's backend); raises if CuPy is missing or sees no CUDA GPU."""
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            raise RuntimeError("CuPy sees no CUDA device")
        self.count_launches(launches)
        if device == "cuda":
            import torch

            # RawKernel launches go to CuPy's current stream: it must be torch's current
            # stream, so the kernel is ordered with the reference, the input copies and the
            # CUDA-event timer (the checks also synchronise the whole device after every
            # call). Both default to the legacy default stream (pointer 0); bind them if
            # torch's differs.
            ptr = torch.cuda.current_stream().cuda_stream
            if ptr != 0:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # ExternalStream is deprecated in CuPy 14
                    cupy.cuda.ExternalStream(ptr).use()


def _count_raw_kernel_launches(cupy: Any, launches: LaunchCounter) -> None:
    """Make ``cupy.RawKernel`` / ``cupy.RawModule`` count their launches: both names are
    replaced by subclasses before the candidate is imported (``isinstance`` still holds);
    kernels from ``RawModule.get_function`` come back wrapped."""
    if getattr(cupy.RawKernel, "_kf_counted", False):
        return

    class CountedRawKernel(cupy.RawKernel):
        _kf_counted = True

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with launches.launching():
                return super().__call__(*args, **kwargs)

    class CountedFunction:
        """A kernel of a RawModule: launches are counted, the rest is the kernel's."""

        def __init__(self, kernel: Any) -> None:
            self._kf_kernel = kernel

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            with launches.launching():
                return self._kf_kernel(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._kf_kernel, name)

    class CountedRawModule(cupy.RawModule):
        _kf_counted = True

        def get_function(self, name: str) -> Any:
            return CountedFunction(super().get_function(name))

    for klass, name in ((CountedRawKernel, "RawKernel"), (CountedRawModule, "RawModule")):
        klass.__name__ = klass.__qualname__ = name
        klass.__module__ = "cupy"
    cupy.RawKernel, cupy.RawModule = CountedRawKernel, CountedRawModule


CUPY = CupyBackend()
