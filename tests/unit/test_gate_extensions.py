"""The static gate on ``load_inline`` extensions (the ``cuda`` and ``cpp`` backends) as the
world writes them: KernelBench's prompt template and the ways models fill it in, each next
to the attack its rule still stops.

Every kernel here is written for these tests, in the forms LLM-generated KernelBench CUDA
solutions take (bench/verifier_precision.py measures the gate on those themselves, beside
KernelBench's own checker). Each form was refused before the gate read extensions as
their authors write them."""

from __future__ import annotations

import textwrap

import pytest

from kernelflow.verification.backends.cuda import launched_kernels
from kernelflow.verification.backends.extension import wanted_extensions
from kernelflow.verification.backends.extension_flags import normalized_flags, refused_flag
from kernelflow.verification.gate import gate_findings

TASK = textwrap.dedent(
    """
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, a, b):
            return a + b

    def get_inputs():
        return [torch.randn(4096), torch.randn(4096)]

    def get_init_inputs():
        return []
    """
)

KERNEL = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void add_kernel(const float* a, const float* b, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b) {
    auto out = torch::empty_like(a);
    int n = a.numel();
    const int threads = 256;
    add_kernel<<<(n + threads - 1) / threads, threads>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""


def module(
    *,
    kernel: str = KERNEL,
    build: str = """
add_ext = load_inline(
    name="add_ext",
    cpp_sources="torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);",
    cuda_sources=add_source,
    functions=["add_cuda"],
    verbose=True,
    extra_cflags=[""],
    extra_ldflags=[""],
)
""",
    init: str = "self.add_ext = add_ext",
    forward: str = "return self.add_ext.add_cuda(a, b)",
) -> str:
    """A candidate in the shape of KernelBench's one-shot example: the source in a
    module string, built at module level, the extension kept on ``self``."""
    return (
        "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import "
        f'load_inline\n\nadd_source = r"""{kernel}"""\n'
        + textwrap.dedent(build)
        + "\n\nclass ModelNew(nn.Module):\n    def __init__(self) -> None:\n"
        + textwrap.indent(f"super().__init__()\n{textwrap.dedent(init)}\n", " " * 8)
        + "\n    def forward(self, a, b):\n"
        + textwrap.indent(textwrap.dedent(forward) + "\n", " " * 8)
    )


def findings(source: str, policy: str = "strict", backend: str = "cuda") -> list[str]:
    refused, _ = gate_findings(source, backend=backend, task_source=TASK, policy=policy)
    return [v.text() for v in refused]


def refused_rules(source: str, policy: str = "strict", backend: str = "cuda") -> set[str]:
    return {text.split(":", 1)[0] for text in findings(source, policy, backend)}


# --------------------------------------------------------------------------- precision


@pytest.mark.parametrize("policy", ["strict", "kernelbench"])
def test_kernelbench_s_one_shot_format_passes_under_both_policies(policy: str) -> None:
    # Template flags extra_cflags=[""], the extension stored on self in __init__ and
    # called through it: the file every KernelBench prompt shows a model.
    assert findings(module(), policy) == []


LEGIT_FORMS = {
    "function_on_self": {"init": "self.fn = add_ext.add_cuda", "forward": "return self.fn(a, b)"},
    "function_at_module_level": {
        "build": module.__kwdefaults__["build"] + "add_fn = add_ext.add_cuda\n",  # type: ignore[index]
        "init": "pass",
        "forward": "return add_fn(a, b)",
    },
    "extension_read_into_a_local": {"forward": "ext = self.add_ext\nreturn ext.add_cuda(a, b)"},
    "extension_kept_as_self_ops": {
        "init": "self.ops = add_ext",
        "forward": "return self.ops.add_cuda(a, b)",
    },
    "extension_called_at_module_level": {
        "init": "pass",
        "forward": "return add_ext.add_cuda(a, b)",
    },
    "own_pybind11_module": {
        "kernel": KERNEL
        + "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {\n"
        + '  m.def("add_cuda", &add_cuda, "a+b");\n}\n',
        "build": 'add_ext = load_inline(name="add_ext", cpp_sources="", cuda_sources=add_source)\n',
    },
    "templated_launch_in_a_dispatch_macro": {
        "kernel": KERNEL.replace(
            "__global__ void add_kernel(const float* a, const float* b, float* out, int n)",
            "template <typename scalar_t>\n__global__ void __launch_bounds__(256) "
            "add_kernel(const scalar_t* a, const scalar_t* b, scalar_t* out, int n)",
        ).replace(
            "    add_kernel<<<(n + threads - 1) / threads, threads>>>(\n"
            "        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);",
            '    AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "add", ([&] {\n'
            "        add_kernel<scalar_t><<<(n + threads - 1) / threads, threads>>>(\n"
            "            a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), "
            "out.data_ptr<scalar_t>(), n);\n    }));",
        )
    },
    "launch_through_a_macro": {
        "kernel": KERNEL.replace(
            "torch::Tensor add_cuda(",
            "#define LAUNCH_1D(K, n, ...) \\\n"
            "    K<<<((n) + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>"
            "(__VA_ARGS__)\n\n"
            "torch::Tensor add_cuda(",
        )
        .replace(
            "#include <cuda_runtime.h>",
            "#include <cuda_runtime.h>\n#include <ATen/cuda/CUDAContext.h>",
        )
        .replace(
            "    add_kernel<<<(n + threads - 1) / threads, threads>>>(\n"
            "        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);",
            "    LAUNCH_1D(add_kernel, n, a.data_ptr<float>(), b.data_ptr<float>(),\n"
            "              out.data_ptr<float>(), n);",
        )
    },
    "the_toolkit_s_and_the_c_library_s_headers": {
        "kernel": KERNEL.replace(
            "#include <cuda_runtime.h>",
            "#include <cuda.h>\n#include <cuda_runtime.h>\n#include <cuda_runtime_api.h>\n"
            "#include <device_launch_parameters.h>\n#include <math_constants.h>\n"
            "#include <cublas_v2.h>\n#include <stdio.h>\n#include <cstdlib>\n#include <cfloat>\n"
            "#include <c10/cuda/CUDAException.h>\n#include <cooperative_groups.h>\n"
            "#include <cub/block/block_reduce.cuh>",
        )
    },
    "ordinary_flag_strings": {
        "build": """
            add_ext = load_inline(
                name="add_ext",
                cpp_sources="torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);",
                cuda_sources=add_source,
                functions=["add_cuda"],
                extra_cflags=["-O3", " "],
                extra_cuda_cflags=["-O3 --use_fast_math", "-Xptxas", "-v", "-lineinfo",
                                   "--ptxas-options=-v", "-gencode", "arch=compute_80,code=sm_80",
                                   "-maxrregcount=64", "--expt-relaxed-constexpr", "-std=c++17"],
                extra_ldflags=["-lcublas", "-lcudart"],
            )
            """
    },
    "sources_built_in_init_and_as_f_strings": {
        "build": "BLOCK = 256\n"
        "DECL = 'torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);'\n",
        "init": """\
            src = f"#define BLOCK_SIZE {BLOCK}\\n" + add_source
            decl = "\\n".join(["#include <torch/extension.h>", DECL])
            self.add_ext = load_inline(
                name="add_ext_{}".format(BLOCK), cpp_sources=decl, cuda_sources=[src],
                functions=["add_cuda"], extra_cuda_cflags=["-O%d" % 3],
            )""",
    },
    "constants_and_macros_in_cpp": {
        "kernel": KERNEL.replace(
            "#include <cuda_runtime.h>",
            "#include <cuda_runtime.h>\n\n"
            '#define CHECK_CUDA(x) TORCH_CHECK(x.device().is_cuda(), #x " must be CUDA")\n'
            "#define CHECK_INPUT(x) CHECK_CUDA(x); \\\n    TORCH_CHECK(x.is_contiguous(), #x)\n"
            "constexpr int TILE = 16;\nstatic constexpr float SCALE = 1.0f;\n"
            "static const int WARPS = 8;\nconst float* const NOTHING = nullptr;\n"
            "namespace {\nconstexpr int kUnroll = 4;\n}\n",
        ).replace(
            "    int i = blockIdx.x",
            "    static __shared__ float tile[TILE];\n    int i = blockIdx.x",
        )
    },
    "tensor_options_and_no_include_paths": {
        "kernel": KERNEL.replace(
            "auto out = torch::empty_like(a);",
            "auto out = torch::empty({a.numel()}, torch::dtype(torch::kFloat32)"
            ".device(a.device()).layout(torch::kStrided).requires_grad(false));",
        ),
        "build": """
            add_ext = load_inline(
                name="add_ext",
                cpp_sources="torch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);",
                cuda_sources=add_source, functions=["add_cuda"], extra_include_paths=[],
                build_directory=None,
            )
            """,
    },
    "launched_with_cuda_launch_kernel": {
        "kernel": KERNEL.replace(
            "    add_kernel<<<(n + threads - 1) / threads, threads>>>(\n"
            "        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);",
            "    const float* pa = a.data_ptr<float>();\n"
            "    const float* pb = b.data_ptr<float>();\n"
            "    float* po = out.data_ptr<float>();\n    void* args[] = {&pa, &pb, &po, &n};\n"
            "    cudaLaunchKernel((const void*)add_kernel, dim3((n + 255) / 256), dim3(256), "
            "args, 0, 0);",
        )
    },
}


@pytest.mark.parametrize("form", sorted(LEGIT_FORMS))
@pytest.mark.parametrize("policy", ["strict", "kernelbench"])
def test_the_forms_models_write_pass(form: str, policy: str) -> None:
    assert findings(module(**LEGIT_FORMS[form]), policy) == []


def test_the_extension_read_from_f_strings_and_init_is_the_one_built() -> None:
    (spec,) = wanted_extensions(module(**LEGIT_FORMS["sources_built_in_init_and_as_f_strings"]))
    assert spec.name == "add_ext_256"
    assert spec.cuda_sources[0].startswith("#define BLOCK_SIZE 256\n\n#include <torch/extension.h>")
    assert spec.cpp_sources == (
        "#include <torch/extension.h>\ntorch::Tensor add_cuda(torch::Tensor a, torch::Tensor b);",
    )
    assert spec.extra_cuda_cflags == ("-O3",)


def test_the_extension_s_own_bindings_are_its_functions() -> None:
    (spec,) = wanted_extensions(module(**LEGIT_FORMS["own_pybind11_module"]))
    assert spec.functions == ()
    assert spec.exposed() == ("add_cuda",)


def test_empty_flags_are_no_flags_and_flag_strings_are_read_flag_by_flag() -> None:
    (spec,) = wanted_extensions(module())
    assert spec.extra_cflags == spec.extra_ldflags == ()
    assert normalized_flags(("-O3 --use_fast_math", "", " ")) == ("-O3", "--use_fast_math")


# --------------------------------------------------------------------------- containment


@pytest.mark.parametrize(
    "flags",
    [
        ["-I/etc"],
        ["-include", "/etc/passwd"],
        ["-L/tmp", "-lfoo"],
        ["-lpython3"],
        ["-Wl,-rpath,."],
        ["-Wp,-include,x.h"],
        ["-Xcompiler", "-include/etc/x"],
        ["-Xcompiler", "-B/tmp/evil"],
        ["--ptxas-options=--output-file=/tmp/x"],
        ["-fplugin=evil.so"],
        ["@flags.txt"],
        ["-ccbin", "/tmp/cc"],
        ["-o", "/tmp/x"],
    ],
)
def test_flags_that_reach_files_are_refused(flags: list[str]) -> None:
    assert refused_flag(normalized_flags(tuple(flags))) is not None
    source = module().replace('extra_cflags=[""]', f"extra_cflags={flags!r}")
    assert "no_kernel" in refused_rules(source)


def test_every_allowed_form_of_flags_passes_the_flag_rule() -> None:
    flags = LEGIT_FORMS["ordinary_flag_strings"]["build"]
    (spec,) = wanted_extensions(module(build=flags))
    assert refused_flag(spec.extra_cflags + spec.extra_cuda_cflags + spec.extra_ldflags) is None


@pytest.mark.parametrize(
    "parts",
    [
        # Put behind the name after it was bound: the name holds something else.
        {
            "init": "self.fn = add_ext.add_cuda\nself.fn = torch.add",
            "forward": "return self.fn(a, b)",
        },
        {
            "init": "self.add_ext = add_ext",
            "forward": "self.add_ext = torch\nreturn self.add_ext.add(a, b)",
        },
        # A name that may hold PyTorch's function as well.
        {
            "init": "self.fn = add_ext.add_cuda if a else torch.add",
            "forward": "return self.fn(a, b)",
        },
        # Called only while the module is built: forward launches nothing.
        {
            "init": "self.out = add_ext.add_cuda(torch.ones(4), torch.ones(4))",
            "forward": "return a + b",
        },
    ],
    ids=["rebound_function", "rebound_extension", "either_function", "called_in_init_only"],
)
def test_a_name_that_may_hold_anything_else_is_not_the_extension(parts: dict[str, str]) -> None:
    assert "no_kernel" in refused_rules(module(**parts).replace("if a else", "if True else"))


@pytest.mark.parametrize(
    ("edit", "rule"),
    [
        (("#include <cuda_runtime.h>", "#include <unistd.h>"), "forbidden_import"),
        (("#include <cuda_runtime.h>", "#include <dlfcn.h>"), "forbidden_import"),
        (("#include <cuda_runtime.h>", "#include <sys/mman.h>"), "forbidden_import"),
        (("#include <cuda_runtime.h>", "#include <fstream>"), "forbidden_import"),
        (("#include <cuda_runtime.h>", "#include <thread>"), "forbidden_import"),
        (("#include <cuda_runtime.h>", '#include "cached.h"'), "forbidden_import"),
        # Mutable state that outlives the call, whatever else is const about it.
        (
            (
                "torch::Tensor add_cuda(",
                "static const float* last = nullptr;\ntorch::Tensor add_cuda(",
            ),
            "caching",
        ),
        (
            (
                "    auto out = torch::empty_like(a);",
                "    static torch::Tensor out = torch::empty_like(a);",
            ),
            "caching",
        ),
        (("    auto out", "    thread_local int calls = 0;\n    auto out"), "caching"),
        (
            (
                "torch::Tensor add_cuda(",
                "__device__ float g_result[4096];\ntorch::Tensor add_cuda(",
            ),
            "caching",
        ),
        (
            (
                "torch::Tensor add_cuda(",
                "#define KEEP \\\n  float kept_sum;\nKEEP\ntorch::Tensor add_cuda(",
            ),
            "caching",
        ),
        # A library doing the kernel's work (a choice of the policy's: strict refuses).
        (
            (
                "    const int threads = 256;",
                "    cublasHandle_t h; cublasCreate(&h);\n"
                "    cublasSaxpy(h, n, nullptr, a.data_ptr<float>(), 1, "
                "out.data_ptr<float>(), 1);\n"
                "    const int threads = 256;",
            ),
            "torch_compute",
        ),
    ],
    ids=[
        "unistd",
        "dlfcn",
        "mman",
        "fstream",
        "thread",
        "quoted",
        "static_pointer",
        "static_tensor",
        "thread_local",
        "device_global",
        "state_in_a_macro",
        "cublas_compute",
    ],
)
def test_what_the_cuda_rules_still_refuse(edit: tuple[str, str], rule: str) -> None:
    assert edit[0] in KERNEL
    assert rule in refused_rules(module(kernel=KERNEL.replace(*edit)))


def test_a_name_the_gate_keeps_from_pytorch_is_refused_on_anything_but_an_extension() -> None:
    # `.ops` reaches torch.ops on PyTorch's objects; on the extension it is just a name.
    source = module(
        init="self.ops = add_ext\nself.lib = torch.nn.Module()",
        forward="self.lib.ops\nreturn self.ops.add_cuda(a, b)",
    )
    assert any("`.ops`" in text for text in findings(source))


def test_library_compute_is_a_warning_under_kernelbench() -> None:
    edit = (
        "    const int threads",
        "    cublasSgemm(h, op, op, 1, 1, 1, 0, 0, 1, 0, 1, 0, 0, 1);\n    const int threads",
    )
    refused, warned = gate_findings(
        module(kernel=KERNEL.replace(*edit)), backend="cuda", task_source=TASK, policy="kernelbench"
    )
    assert refused == []
    assert {v.rule for v in warned} == {"torch_compute"}


def test_a_kernel_never_launched_is_refused() -> None:
    # KernelBench's checker asks only for `__global__` somewhere: this computes with ATen.
    kernel = KERNEL.replace(
        "    add_kernel<<<(n + threads - 1) / threads, threads>>>(\n"
        "        a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);",
        "    out.copy_(a);",
    )
    assert "no_kernel" in refused_rules(module(kernel=kernel), "kernelbench")
    # A macro that never launches its argument launches nothing either.
    named = KERNEL.replace(
        "torch::Tensor add_cuda(", "#define NAME(K) #K\ntorch::Tensor add_cuda("
    ).replace("    add_kernel<<<", "    const char* k = NAME(add_kernel);\n    other<<<")
    assert launched_kernels(named, ["add_kernel"]) == set()


@pytest.mark.parametrize(
    "build",
    [
        # Read at run time: the verifier would build something else than what runs.
        'add_ext = load_inline(name="add_ext", cpp_sources=open("decl.h").read(), '
        'cuda_sources=add_source, functions=["add_cuda"])\n',
        'import os\nadd_ext = load_inline(name=os.environ["N"], cpp_sources="", '
        'cuda_sources=add_source, functions=["add_cuda"])\n',
        'add_ext = load_inline(name=f"add_{id(0)}", cpp_sources="", '
        'cuda_sources=add_source, functions=["add_cuda"])\n',
        'add_ext = load_inline(name="add_ext", cpp_sources="", cuda_sources=add_source, '
        'functions=["add_cuda"])\nadd_source = "#define float double"\n',
        'add_ext = load_inline(name="add_ext", cpp_sources="{0.__class__}".format(add_source), '
        'cuda_sources=add_source, functions=["add_cuda"])\n',
        'add_ext = load_inline(name="add_ext", cpp_sources="", cuda_sources=add_source, '
        'functions=["add_cuda"], extra_include_paths=["/etc"])\n',
    ],
    ids=[
        "file",
        "environment",
        "f_string_of_a_call",
        "bound_twice",
        "format_attribute",
        "include_paths",
    ],
)
def test_what_the_verifier_cannot_read_or_must_choose_is_refused(build: str) -> None:
    assert "no_kernel" in refused_rules(module(build=build))
    assert wanted_extensions(module(build=build)) == []


@pytest.mark.parametrize("backend", ["triton", "cupy"])
def test_an_extension_checked_as_another_backend_is_pointed_to_its_own(backend: str) -> None:
    refused, warned = gate_findings(module(), backend=backend, task_source=TASK)
    assert [v.rule for v in refused] == ["no_kernel"]
    assert "builds a C++/CUDA extension" in refused[0].message
    assert "--backend cpp (or cuda on a GPU)" in refused[0].advice
    assert warned == []


def test_a_build_wrapped_in_try_at_module_level_is_a_fallback() -> None:
    # The extension's build may fail on purpose, and forward fall back to PyTorch.
    build = module.__kwdefaults__["build"]  # type: ignore[index]
    guarded = "try:\n" + textwrap.indent(build.strip(), "    ") + "\nexcept Exception:\n"
    guarded += "    add_ext = None\n"
    source = module(build=guarded, init="pass", forward="return add_ext.add_cuda(a, b)")
    assert "exception_fallback" in refused_rules(source, "kernelbench")
