"""The ``triton`` backend: ``@triton.jit`` kernels, checked on the GPU when there is one
and in Triton's interpreter (``TRITON_INTERPRET=1``) on the CPU otherwise.

Imported inside sandboxes: stdlib only at module level (triton inside the hooks).
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelflow.verification.backends.base import Backend, CandidateModule, LaunchCounter

if TYPE_CHECKING:
    from kernelflow.verification.backends.language import KernelLanguage

__all__ = ["TRITON", "TritonBackend", "count_triton_launches"]

# What the sandbox probe compiles on a GPU, loaded from a file like a candidate (compiled
# Triton resolves the kernel's globals, tl, in its module, and needs its source).
PROBE_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)
"""

DSL_NOTES = """\
## Triton in brief
- A kernel is a function decorated with `@triton.jit`; block sizes are `tl.constexpr` parameters. Launch it as `kernel[grid](args..., BLOCK_SIZE=...)` with `grid = (triton.cdiv(n, BLOCK_SIZE),)` (or a 2-D/3-D tuple, or a lambda of `meta`).
- Inside: `pid = tl.program_id(axis=0)`, `offs = pid * BLOCK + tl.arange(0, BLOCK)` (BLOCK a power of two), `mask = offs < n`, `tl.load(ptr + offs, mask=mask, other=0.0)`, `tl.store(ptr + offs, val, mask=mask)`. Pass tensors directly (they become pointers) and pass strides (`x.stride(0)`) for multi-dimensional indexing instead of assuming contiguity, or call `.contiguous()` first.
- Reductions: `tl.sum`, `tl.max`, `tl.min` along an axis of a block; use `other=-float("inf")` for masked lanes of a max, and subtract the row max before `tl.exp` in softmax. Rows longer than one block need a loop over column blocks.
- Math: `tl.exp`, `tl.log`, `tl.sqrt`, `tl.maximum`, `tl.where`, `tl.dot` (inputs of at least 16x16, accumulate in fp32); `x.to(tl.float32)` to convert. Accumulate in fp32 and cast back to the output dtype on store.
- Allocate outputs in `forward` with `torch.empty(..., device=x.device, dtype=x.dtype)`.
- A `@triton.jit` body uses only `triton.language` (and `math`), its arguments, module constants and other kernels; pass `input_precision="ieee"` to `tl.dot` on fp32 (its default is tf32 on GPUs).
"""  # noqa: E501  (prompt text: one bullet a line)


class TritonBackend(Backend):
    name = "triton"
    title = "Triton"
    device_note = (
        "Kernels are checked on the GPU when one is present, otherwise with "
        "TRITON_INTERPRET=1 on the CPU: use only features the interpreter supports "
        "(no bf16) and launch on the inputs' device."
    )
    dsl_notes = DSL_NOTES
    launch_label = "Triton kernel"
    cpu_runs = "Triton in its interpreter"

    def kernel_language(self) -> KernelLanguage:
        from kernelflow.verification.backends.triton_gate import TRITON_LANGUAGE

        return TRITON_LANGUAGE

    def check_kernels(self, module: CandidateModule) -> None:
        """A ``@triton.jit`` kernel that stores (``tl.store``/``tl.atomic_*``), launched
        by the module as ``kernel[grid](...)``."""
        storing = {
            name
            for name, fn in module.jit_kernels.items()
            if any(
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute)
                and (n.func.attr == "store" or n.func.attr.startswith("atomic_"))
                for n in ast.walk(fn)
            )
        }
        if not module.jit_kernels:
            module.add(
                "no_kernel",
                module.tree,
                "no @triton.jit kernel is defined",
                "define a module-level `@triton.jit` function that loads with tl.load, "
                "computes, stores with tl.store, and launch it from forward as "
                "`kernel[grid](...)`",
            )
        elif not storing:
            module.add(
                "no_kernel",
                module.tree,
                "no @triton.jit kernel writes its result",
                "end the kernel with `tl.store(out_ptr + offsets, result, mask=offsets < n)`",
            )
        elif not storing & module.launched:
            module.add(
                "no_kernel",
                module.tree,
                "no storing @triton.jit kernel is launched by the module",
                "launch it from forward: `kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=1024)`",
            )

    def preload(self) -> None:
        import triton
        import triton.language

        with contextlib.suppress(ImportError):
            import triton.runtime.interpreter
        with contextlib.suppress(ImportError):
            # A launch specialises its arguments, which imports Gluon's language module on
            # first use: in every forked sandbox, 12 % of a Triton check on the CPU.
            import triton.experimental.gluon.language
        del triton

    def check_runtime(
        self, device: str, compile_here: bool, load: Callable[[Path, str], Any]
    ) -> None:
        """Import triton; on CUDA inside the read-only file system, compile and run a
        kernel (compiling writes Triton's cache and temp files: that must still work)."""
        import triton  # noqa: F401  (importing is the check)

        if device == "cuda" and compile_here:
            import torch

            x = torch.ones(1024, device="cuda")
            path = Path.cwd() / "probe_kernel.py"
            path.write_text(PROBE_KERNEL)
            kernel = load(path, "kf_probe_kernel").probe_kernel
            kernel[(1,)](x, x.numel(), BLOCK=1024)
            torch.cuda.synchronize()
            assert float(x.sum()) == 2048.0

    def versions(self) -> dict[str, str]:
        try:
            import triton
        except ImportError:
            return {}
        return {"triton": triton.__version__}

    def count_launches(self, launches: LaunchCounter) -> None:
        count_triton_launches(launches)

    def start_runtime(self, device: str, launches: LaunchCounter) -> None:
        self.count_launches(launches)
        if device == "cpu":
            autotune_in_the_interpreter()


# What a launch may hand a kernel, whatever its parameter: numbers, strings, dtypes,
# None, kernels (for tl.reduce and the like), and tuples of those; tensors too, where the
# parameter is not a tl.constexpr (Triton passes them as pointers). Anything else (a list
# or dict of tensors, a tensor as a constexpr) reaches the kernel's body as the host's own
# object: in the CPU interpreter, PyTorch computing inside the launch where no guard looks.
_PLAIN = (int, float, bool, str, type(None))


def refused_argument(value: Any, constexpr: bool) -> str | None:
    """Why a launch may not pass ``value`` (None when it may)."""
    import torch

    if isinstance(value, tuple):
        return next((w for v in value if (w := refused_argument(v, constexpr))), None)
    if isinstance(value, torch.Tensor):
        return "a tensor passed as a tl.constexpr" if constexpr else None
    dtypes: tuple[type, ...] = (torch.dtype,)
    try:
        import triton.language as tl

        dtypes = (torch.dtype, tl.dtype, tl.constexpr)
    except ImportError:
        pass
    kernel = type(value).__module__.startswith("triton.runtime")
    if isinstance(value, _PLAIN + dtypes) or kernel:
        return None
    return f"a {type(value).__name__} (a kernel takes tensors, numbers, dtypes and tuples)"


def check_arguments(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """Why a launch of ``kernel`` with these arguments is refused (None: it is not)."""
    import inspect

    fn = getattr(kernel, "fn", None)
    names = list(getattr(kernel, "arg_names", ()) or ())
    try:
        signature = inspect.signature(fn) if fn is not None else None
    except (TypeError, ValueError):
        signature = None
    # The kernel's own parameters (launch options such as num_warps are Triton's).
    given = {**dict(zip(names, args, strict=False)), **kwargs}
    given = {name: value for name, value in given.items() if name in names}
    for name, value in given.items():
        parameter = signature.parameters.get(name) if signature is not None else None
        annotation = parameter.annotation if parameter is not None else None
        constexpr = "constexpr" in str(getattr(annotation, "__name__", annotation))
        why = refused_argument(value, constexpr)
        if why is not None:
            return f"launching {getattr(fn, '__name__', 'a kernel')} with {name}={why}"
    return None


def count_triton_launches(launches: LaunchCounter) -> None:
    """Make every Triton kernel launch, compiled or interpreted, go through ``launches``,
    its arguments checked first (``check_arguments``)."""
    classes: list[Any] = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except ImportError:
        return
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    for klass in classes:
        original = klass.run
        if getattr(original, "_kf_counted", False):
            continue

        def run(self: Any, *args: Any, _orig: Any = original, **kwargs: Any) -> Any:
            why = check_arguments(self, args, kwargs)
            if why is not None:
                launches.refuse("kernel_arguments", why)
            with launches.launching():
                return _orig(self, *args, **kwargs)

        run._kf_counted = True  # type: ignore[attr-defined]
        klass.run = run


def autotune_in_the_interpreter() -> None:
    """Let ``@triton.autotune`` run in Triton's CPU interpreter, which has no driver to
    benchmark with ("0 active drivers": a limit of the verifier, not the candidate's
    fault). Each config still runs once, so every one of them is checked; timings mean
    nothing there, so the first config is kept."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return

    def run_once(kernel_call: Any, quantiles: Any = None) -> list[float]:
        kernel_call()
        return [0.0, 0.0, 0.0]

    Autotuner.do_bench = property(lambda self: run_once)


TRITON = TritonBackend()
