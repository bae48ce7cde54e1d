"""The feedback set (docs/verifier.md, "Feedback that teaches"): for each rule of the
static gate, candidates with the mistakes coder models make, the rule that must refuse
each, and words its message must hold. Written for kernelflow on the ReLU task
(examples/tasks/relu.py); each candidate is a correct one with one mistake put in.

tests/unit/test_gate_feedback.py holds the gate to it; bench/feedback_quality.py repairs
the candidates with what the messages say.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CASES", "Case"]

# A correct Triton ReLU candidate; each case changes one of its lines.
TRITON = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.maximum(x, 0.0)
    tl.store(out_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        n = x.numel()
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
        relu_kernel[grid](x, out, n, BLOCK=1024)
        return out
"""

# A correct C++ ReLU candidate (backend cpp); each case changes one of its lines.
CPP = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>

torch::Tensor relu_forward(torch::Tensor x) {
    torch::Tensor input = x.contiguous();
    torch::Tensor out = torch::empty_like(input);
    const float* src = input.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    const int64_t n = input.numel();
    for (int64_t i = 0; i < n; ++i) {
        dst[i] = src[i] > 0.0f ? src[i] : 0.0f;
    }
    return out;
}
"""

ext = load_inline(
    name="relu_ext", cpp_sources=SOURCE, functions=["relu_forward"], extra_cflags=["-O3"]
)


class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ext.relu_forward(x)
'''


@dataclass(frozen=True)
class Case:
    """One mistake: ``name``; the ``rule`` refusing it first; the candidate (``base``
    with ``old`` replaced by ``new``); words the first finding's text must hold
    (``says``); the backend; whether its advice is a literal ``replace `X` with `Y```
    that repairs it (``repairable``)."""

    name: str
    rule: str
    old: str
    new: str
    says: tuple[str, ...] = ()
    backend: str = "triton"
    repairable: bool = False
    base: str = field(default=TRITON, repr=False)

    @property
    def source(self) -> str:
        if self.old not in self.base:
            raise ValueError(f"case {self.name}: {self.old!r} is not in its base")
        return self.base.replace(self.old, self.new, 1)


_Y = "y = tl.maximum(x, 0.0)"
_GRID = 'grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)'
_STORE = "tl.store(out_ptr + offs, y, mask=mask)"
_FORWARD_OUT = "out = torch.empty_like(x)"
_RETURN = "return ext.relu_forward(x)"
_FUNCTION = "    return out;\n}"

CASES = [
    # Names the installed Triton does not have (module_escape): what models write most.
    Case(
        "tl.tanh",
        "module_escape",
        _Y,
        "y = tl.tanh(x)",
        ("`tl.tanh` does not exist in the installed Triton", "tl.extra.cuda.libdevice.tanh"),
        repairable=True,
    ),
    Case(
        "tl.math.tanh",
        "module_escape",
        _Y,
        "y = tl.math.tanh(x)",
        ("`tl.math.tanh` does not exist", "replace `tl.math.tanh(x)` with"),
        repairable=True,
    ),
    Case(
        "tl.libdevice.erf",
        "module_escape",
        _Y,
        "y = tl.libdevice.erf(x)",
        ("does not exist", "replace `tl.libdevice.erf` with `tl.erf`"),
        repairable=True,
    ),
    Case(
        "tl.nn.relu",
        "module_escape",
        _Y,
        "y = tl.nn.relu(x)",
        ("`tl.nn.relu` does not exist", "with `tl.maximum(x, 0.0)`"),
        repairable=True,
    ),
    Case(
        "tl.softplus",
        "module_escape",
        _Y,
        "y = tl.softplus(x)",
        ("`tl.softplus` does not exist", "tl.log(1 + tl.exp(x))"),
        repairable=True,
    ),
    Case(
        "tl.math.gelu",
        "module_escape",
        _Y,
        "y = tl.math.gelu(x)",
        ("`tl.math.gelu` does not exist", "tl.erf("),
        repairable=True,
    ),
    Case(
        "tl.isnan",
        "module_escape",
        _Y,
        "y = tl.where(tl.isnan(x), 0.0, tl.maximum(x, 0.0))",
        ("`tl.isnan` does not exist", "with `x != x`"),
        repairable=True,
    ),
    Case(
        "tl.math.add",
        "module_escape",
        _Y,
        "y = tl.math.add(tl.maximum(x, 0.0), 0.0)",
        ("`tl.math.add` does not exist", "replace `tl.math.add` with `tl.add`"),
        repairable=True,
    ),
    Case(
        "import-tanh",
        "module_escape",
        "import triton.language as tl\n",
        "import triton.language as tl\nfrom triton.language.math import tanh\n",
        ("`tl.math.tanh` does not exist", "drop the import and write `2 * tl.sigmoid(2 * x) - 1`"),
    ),
    Case(
        "import-tl.libdevice",
        "module_escape",
        "import triton.language as tl\n",
        "import triton.language as tl\nimport triton.language.libdevice as libdevice\n",
        (
            "`tl.libdevice` does not exist",
            "replace `triton.language.libdevice` with `triton.language.extra.libdevice`",
        ),
        repairable=True,
    ),
    Case(
        "tl.pi",
        "module_escape",
        _Y,
        "y = tl.maximum(x, 0.0) + 0.0 * tl.pi",
        ("`tl.pi` does not exist", "replace `tl.pi` with `3.141592653589793`"),
        repairable=True,
    ),
    Case(
        "tl.numel",
        "module_escape",
        "mask = offs < n",
        "mask = offs < tl.numel(x_ptr)",
        ("`tl.numel` does not exist", "pass the element count as a kernel argument"),
    ),
    Case(
        "triton.runtime",
        "module_escape",
        _FORWARD_OUT,
        "out = torch.empty_like(x)\n        triton.runtime.driver.active.get_current_device()",
        ("not among the names a candidate may use",),
    ),
    Case(
        "backward-torch",
        "module_escape",
        "class ModelNew(nn.Module):",
        "class Relu(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad):\n"
        "        return grad * torch.heaviside(grad, grad)\n\n\n"
        "class ModelNew(nn.Module):",
        ("backward of a custom autograd function", "leave backward out"),
    ),
    # Host code.
    Case(
        "tl.cdiv-in-grid",
        "callback",
        _GRID,
        'grid = lambda meta: (tl.cdiv(n, meta["BLOCK"]),)',
        ("tl.cdiv is a device function", "replace `tl.cdiv` with `triton.cdiv`"),
        repairable=True,
    ),
    Case(
        "grid-calls-torch",
        "callback",
        _GRID,
        'grid = lambda meta: (int(torch.sum(torch.ones(n))) // meta["BLOCK"] + 1,)',
        ("may only compute launch sizes", "triton.cdiv(n"),
    ),
    Case(
        "torch-in-forward",
        "torch_compute",
        "return out\n",
        "return torch.relu(out)\n",
        ("PyTorch compute standing in for the kernel", "compute it in your kernel"),
    ),
    Case(
        "try-fallback",
        "exception_fallback",
        "        relu_kernel[grid](x, out, n, BLOCK=1024)\n",
        "        try:\n            relu_kernel[grid](x, out, n, BLOCK=1024)\n"
        "        except Exception:\n            out = x.clamp(min=0)\n",
        ("try/except", "remove the try/except"),
    ),
    Case(
        "getattr",
        "introspection",
        "n = x.numel()",
        'n = getattr(x, "numel")()',
        ("looks attributes up", """replace `getattr(x, "numel")` with `x.numel`"""),
        repairable=True,
    ),
    Case(
        "import-numpy",
        "forbidden_import",
        "import torch.nn as nn\n",
        "import torch.nn as nn\nimport numpy as np\n",
        ("import of 'numpy' is not allowed", "import only torch"),
    ),
    Case(
        "cuda-stream",
        "stream_trick",
        _FORWARD_OUT,
        "out = torch.empty_like(x)\n        stream = torch.cuda.Stream()",
        ("streams, events and graphs", "launch on the current stream"),
    ),
    Case(
        "torch-save",
        "file_io",
        "        return out\n",
        '        torch.save(out, "out.pt")\n        return out\n',
        ("reads or writes files", "compute everything from the inputs"),
    ),
    Case(
        "patch-torch",
        "monkey_patch",
        "        super().__init__()\n",
        "        super().__init__()\n        torch.relu = self.forward\n",
        ("patches a module", "set attributes on self in __init__"),
    ),
    Case(
        "cache-result",
        "caching",
        "        return out\n",
        "        self.last = out\n        return out\n",
        ("writing into `self`", "compute the result from the inputs in every call"),
    ),
    Case(
        "module-level-call",
        "module_code",
        "class ModelNew(nn.Module):",
        "torch.manual_seed(0)\n\n\nclass ModelNew(nn.Module):",
        ("module-level calls run once", "put calls inside functions"),
    ),
    Case(
        "inherit-model",
        "reference_use",
        "class ModelNew(nn.Module):",
        "class ModelNew(Model):",
        ("must not inherit from Model", "replace `ModelNew(Model)` with `ModelNew(nn.Module)`"),
        repairable=True,
    ),
    Case(
        "tl.dot-tf32",
        "precision_downgrade",
        _Y,
        "y = tl.sum(tl.dot(x[:, None], x[None, :]), axis=1)",
        ("tf32", "input_precision='ieee')`"),
        repairable=True,
    ),
    Case(
        "half",
        "precision_downgrade",
        "n = x.numel()",
        "x = x.half()\n        n = x.numel()",
        ("full precision", "replace `x.half()` with `x.float()`"),
        repairable=True,
    ),
    # Kernel bodies.
    Case(
        "item-write",
        "kernel_body",
        _STORE,
        "out_ptr[offs] = y",
        ("a kernel writes memory only through pointers", "`tl.store(out_ptr + offs, ...)`"),
        repairable=True,
    ),
    Case(
        "pointer-index",
        "kernel_body",
        "x = tl.load(x_ptr + offs, mask=mask)",
        "x = x_ptr[offs]",
        ("indexing `x_ptr`", "replace `x_ptr[offs]` with `tl.load(x_ptr + offs)`"),
        repairable=True,
    ),
    Case(
        "nested-def",
        "kernel_body",
        _Y,
        "def act(v):\n        return tl.maximum(v, 0.0)\n    y = act(x)",
        ("`def act`", "define it at module level as its own @triton.jit function"),
    ),
    Case(
        "lambda-in-kernel",
        "kernel_body",
        _Y,
        "act = lambda v: tl.maximum(v, 0.0)\n    y = act(x)",
        ("a lambda", "module level as its own @triton.jit function"),
    ),
    Case(
        "torch-in-kernel",
        "kernel_body",
        _Y,
        "y = torch.maximum(x, 0.0)",
        ("in a @triton.jit kernel", "replace `torch.maximum` with `tl.maximum`"),
        repairable=True,
    ),
    Case(
        "no-store",
        "no_kernel",
        _STORE,
        "y = y + 0",
        ("no @triton.jit kernel writes its result", "tl.store(out_ptr + offsets"),
    ),
    # C++ sources (backend cpp): headers, threads, ATen compute, state, files, flags.
    Case(
        "include-thread",
        "forbidden_import",
        "#include <torch/extension.h>\n",
        "#include <torch/extension.h>\n#include <pthread.h>\n",
        ("#include <pthread.h> is not allowed", "include only <torch/extension.h>"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "std-thread",
        "module_escape",
        _FUNCTION,
        "    std::thread([]{}).join();\n    return out;\n}",
        ("threads escape the timer", "#pragma omp parallel for"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "aten-relu",
        "torch_compute",
        _FUNCTION,
        "    return at::relu(input);\n}",
        ("ATen computing in the kernel's place", "compute it in your own loop"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "static-cache",
        "caching",
        "    torch::Tensor input = x.contiguous();",
        "    static torch::Tensor cached;\n    torch::Tensor input = x.contiguous();",
        ("state outlives the call", "use a local variable"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "fopen",
        "file_io",
        _FUNCTION,
        '    fopen("/tmp/out", "w");\n    return out;\n}',
        ("out of a kernel's reach", "compute from the tensors passed in"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "include-path-flag",
        "no_kernel",
        'extra_cflags=["-O3"]',
        'extra_cflags=["-O3", "-I/tmp/include"]',
        ("compiler flag '-I/tmp/include' is not allowed", "-O3, -march=native, -fopenmp"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "half-in-cpp",
        "precision_downgrade",
        _FUNCTION,
        "    at::Half h = 0;\n    return out;\n}",
        ("full precision", "compute in float"),
        backend="cpp",
        base=CPP,
    ),
    Case(
        "no-extension-call",
        "no_kernel",
        _RETURN,
        "return x",
        ("no function of the extension is called", "ext.my_forward(x)"),
        backend="cpp",
        base=CPP,
    ),
]
