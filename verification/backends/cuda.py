"""The ``cuda`` backend, in KernelBench's format: CUDA kernels in source strings, built with
``torch.utils.cpp_extension.load_inline`` (``cuda_sources`` with the ``__global__`` kernels
and their launches, ``cpp_sources`` with the declarations) and timed on a GPU. Built,
cached and loaded as the ``cpp`` backend's extensions are (:mod:`.cpp`); on a node with
no GPU the verdict is ``unsupported``, the node's fault. CuPy kernels are the ``cupy``
backend (:mod:`.cupy`).

Imported inside sandboxes: stdlib only at module level.
"""

from __future__ import annotations

import re
from typing import ClassVar

from kernelflow.verification.backends.base import CandidateModule
from kernelflow.verification.backends.cpp import ExtensionBackend
from kernelflow.verification.backends.cpp_rules import blank
from kernelflow.verification.backends.extension import extension_specs

__all__ = ["CUDA", "CudaBackend"]

DSL_NOTES = """\
## CUDA in brief (KernelBench's format: torch.utils.cpp_extension.load_inline)
- A module-level string of CUDA: `#include <torch/extension.h>`, a `__global__ void my_kernel(const float* x, float* y, int n)` with `int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) ...`, and a host function `torch::Tensor my_forward(torch::Tensor x)` that allocates the output (`torch::empty_like(x)`), launches `my_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n)` and returns it.
- A second string with the host function's declaration for `cpp_sources`; build once at module level: `ext = load_inline(name="my_ext", cpp_sources=DECL, cuda_sources=SRC, functions=["my_forward"], extra_cuda_cflags=["-O3"])`; call `ext.my_forward(x)` in forward.
- Give load_inline only literals and module-level strings; no build_directory, no include paths.
- Reductions: one block per row with `__shared__` memory and `__syncthreads()`, or warp shuffles; accumulate in `float`; launch on the current stream (`at::cuda::getCurrentCUDAStream()`).
- The ATen ops themselves (`at::gelu`, `x.sum()`, `torch::matmul`) may not do the work; no `static` or `__device__` global state.
"""  # noqa: E501  (prompt text: one bullet a line)

# A kernel's definition: __global__, qualifiers and __launch_bounds__ in any order, its name.
_GLOBAL_KERNEL = re.compile(
    r"\b__global__\s+(?:(?:static|inline|__forceinline__|__noinline__|extern\s*\"C\""
    r"|__launch_bounds__\s*\([^)]*\))\s*)*void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)"
)
# Template arguments, one level of nesting deep: <scalar_t>, <float, 4>, <T, Op<T>>.
_TEMPLATE = r"<(?:[^<>;{}()]|<[^<>;{}()]*>)*>"
_LAUNCH = r"\s*(?:" + _TEMPLATE + r")?\s*<<<"
# The runtime's launch calls, which name the kernel among their first arguments.
_LAUNCH_API = re.compile(r"\bcuda(?:LaunchKernel|LaunchCooperativeKernel|LaunchKernelEx)\b")
_MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", re.M)


def launched_kernels(source: str, kernels: list[str]) -> set[str]:
    """Those of ``kernels`` that ``source`` launches: ``k<<<...>>>``, ``k<T><<<...>>>``,
    ``cudaLaunchKernel((void*)k, ...)``, or through a macro whose body launches one of
    its parameters (``LAUNCH(k)`` with ``#define LAUNCH(K) K<<<grid, block>>>(...)``)."""
    launched = {k for k in kernels if re.search(rf"\b{re.escape(k)}{_LAUNCH}", source)}
    for call in _LAUNCH_API.finditer(source):
        arguments = source[call.end() : call.end() + 300].split(";")[0]
        launched |= {k for k in kernels if re.search(rf"\b{re.escape(k)}\b", arguments)}
    for macro in _MACRO.finditer(source):
        params = [p.strip() for p in macro.group(2).split(",")]
        body = macro.group(3)
        launching = [i for i, p in enumerate(params) if p and re.search(rf"\b{p}{_LAUNCH}", body)]
        if launching or any(re.search(rf"\b{re.escape(k)}{_LAUNCH}", body) for k in kernels):
            for use in re.finditer(rf"\b{macro.group(1)}\s*\(([^;]*)\)", source[macro.end() :]):
                given = [a.strip() for a in use.group(1).split(",")]
                for index in launching:
                    if index < len(given):
                        launched |= {k for k in kernels if re.match(rf"{k}\b", given[index])}
    return launched


class CudaBackend(ExtensionBackend):
    name = "cuda"
    title = "CUDA (KernelBench's format: torch.utils.cpp_extension.load_inline)"
    needs_gpu = True
    device_note = (
        "Kernels are built with load_inline and checked and timed on the GPU; without one "
        "the verifier answers 'unsupported', so write code that runs unchanged on a CUDA "
        "device."
    )
    dsl_notes = DSL_NOTES
    launch_label = "function of the load_inline extension"
    runtime_unavailable = "torch's CUDA extensions cannot be built or loaded here"
    # Its extensions are cpp's (.cpp, .cpp_rules, .extension*), with CUDA sources.
    borrows: ClassVar[tuple[str, ...]] = ("cpp", "triton")
    source_kinds: ClassVar[tuple[str, ...]] = ("cpp_sources", "cuda_sources")
    timed_on = frozenset({"cuda"})

    def check_kernels(self, module: CandidateModule) -> None:
        """What the ``cpp`` backend asks, and a ``__global__`` kernel the CUDA sources
        launch (``kernel<<<grid, block>>>(...)``)."""
        super().check_kernels(module)
        built, _ = extension_specs(module.tree, module.resolve)
        cuda = "\n".join(source for _, spec in built for source in spec.cuda_sources)
        kernels = _GLOBAL_KERNEL.findall(blank(cuda))
        if built and not kernels:
            module.add(
                "no_kernel",
                module.tree,
                "no `__global__` kernel in the CUDA sources",
                "write `__global__ void my_kernel(const float* x, float* out, int n)` in "
                "cuda_sources and launch it from the host function",
            )
        elif built and not launched_kernels(blank(cuda), kernels):
            module.add(
                "no_kernel",
                module.tree,
                "no `__global__` kernel is launched by the CUDA sources",
                "launch it from the extension's host function with the triple-chevron form: "
                "`my_kernel<<<blocks, threads>>>(x.data_ptr<float>(), out.data_ptr<float>(), "
                "n);` (blocks = (n + threads - 1) / threads)",
            )


CUDA = CudaBackend()
