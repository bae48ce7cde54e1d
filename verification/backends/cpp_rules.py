"""The rules for C++ and CUDA sources a candidate compiles with ``load_inline``:
the Python rules of :mod:`.gate` in their C++ form.

- ``torch_compute``: ATen/libtorch doing the work (``at::gelu``, ``torch::matmul``, a
  tensor's ``.sum()``): anything of ``at::``/``torch::`` but allocation, options, dtypes,
  shapes and data pointers, and ATen's thread pool (``at::parallel_for``).
- ``precision_downgrade``: half, bfloat16 or fp8 types and conversions, in a task that
  computes in full precision.
- ``caching``: state that outlives a call: ``static`` and ``thread_local`` variables,
  and variables at namespace scope that are not constants.
- ``forbidden_import``: only the headers of the language, torch's, OpenMP's and the CPU's
  and GPU's intrinsics may be included.
- ``file_io``: files, processes, the environment, sockets, dynamic loading.
- ``module_escape``: threads (``std::thread``: work escaping the timer; OpenMP is the way),
  inline assembly, token pasting (names the gate could not read), timers.

It reads the source as text with comments and literals blanked out, so a rule is not
fooled by a name in a string, nor passed by one.

Daemon side only.
"""

from __future__ import annotations

import re

__all__ = ["CppFinding", "blank", "cpp_findings"]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# (rule, line in the source, why, what to write instead): docs/verifier.md, "Feedback that
# teaches".
CppFinding = tuple[str, int, str, str]

# Headers a source may include: those that declare what a kernel computes with (the
# language's and the C library's, torch's, OpenMP's, intrinsics, the CUDA toolkit's and its
# libraries'); not the system's interfaces to files, processes, threads, signals and the
# network (their calls are refused too, :data:`_ESCAPES`, but a header of them has no
# other use). A quoted include of a file of the candidate's own is never there to read.
_HEADERS = re.compile(
    r"^(torch/[\w/]+\.h|ATen/[\w/]+\.h|c10/[\w/]+\.h|pybind11/[\w/]+\.h|omp\.h"
    r"|(imm|x86|emm|pmm|tmm|smm|nmm|wmm|avx\w*|ia32)intrin\.h|arm_neon\.h|arm_sve\.h"
    r"|cuda(_runtime(_api)?|_fp16|_fp8|_bf16|_pipeline\w*|_awbarrier\w*|_texture_types"
    r"|_surface_types|_occupancy|_device_runtime_api)?\.h(pp)?|device_(launch_parameters"
    r"|functions|atomic_functions|types)\.h|math_(constants|functions)\.h|vector_(types"
    r"|functions)\.h|builtin_types\.h|driver_types\.h|host_defines\.h|cuComplex\.h"
    r"|sm_\d+_(intrinsics|atomic_functions)\.h|crt/[\w/]+\.h(pp)?|mma\.h|cooperative_groups"
    r"(/[\w]+)?(\.h)?|cub/[\w/.]+|thrust/[\w/.]+|cuda/[\w/.]+|cublas(_v2|Lt|_api)?\.h|cudnn\.h"
    r"|curand(_kernel)?\.h|cufft\.h|cusparse\.h|cusolverDn\.h|cutlass/[\w/.]+|cute/[\w/.]+"
    r"|(c)?(math|stdint|stddef|float|limits|string|assert|errno|stdio|stdlib|stdbool|inttypes"
    r"|ctype|wchar|stdarg|fenv|time)(\.h)?|algorithm|array|atomic|bit|bitset|cfenv|chrono"
    r"|climits|cmath|complex|cinttypes|cstdint|cstddef|cstring|cctype|functional"
    r"|initializer_list|iomanip|iterator|limits|list|memory|new|numbers|numeric|optional|queue"
    r"|random|ratio|span|stack|tuple|type_traits|typeinfo|utility|valarray|variant|vector"
    r"|cfloat|cassert|cerrno|exception|stdexcept|string|string_view|sstream|iostream|ostream"
    r"|istream|ios|map|unordered_map|set|unordered_set|deque)$"
)
# Of at:: / torch:: / c10::, what is not computing: allocation, options and dtypes, shapes,
# errors, dispatch macros' helpers, ATen's thread pool, CUDA streams of the current device.
_GLUE = _names(
    """Tensor TensorOptions ScalarType Scalar Device DeviceType IntArrayRef Layout dtype device
    layout requires_grad memory_format MemoryFormat pinned_memory
    empty empty_like empty_strided zeros zeros_like ones ones_like full full_like arange
    from_blob tensor parallel_for parallel_reduce get_num_threads get_thread_num
    in_parallel_region set_num_threads kCPU kCUDA kStrided kFloat kFloat32 kFloat64 kDouble
    kInt kInt32 kInt64 kLong kShort kInt16 kInt8 kChar kByte kUInt8 kBool indexing Slice None
    Ellipsis optional nullopt OptionalDeviceGuard DeviceGuard cuda getCurrentCUDAStream
    CUDAGuard OptionalCUDAGuard elementSize toString typeMetaToScalarType ArrayRef
    ExpandingArray irange check TORCH_CHECK Error Float Double Int Long Short Char Byte Bool
    TensorAccessor PackedTensorAccessor PackedTensorAccessor32 PackedTensorAccessor64
    RestrictPtrTraits DefaultPtrTraits accessor packed_accessor32 packed_accessor64"""
)
# Tensor methods that compute (the C++ spelling of PyTorch compute in forward).
_TENSOR_COMPUTE = _names(
    """abs add addmm amax amin argmax argmin baddbmm bmm ceil clamp clamp_ clamp_min
    clamp_max conv2d cos cumsum div div_ dot exp exp_ floor gelu index_select log log_softmax
    logsumexp masked_fill matmul max maximum mean min minimum mm mul mul_ mv neg norm pow
    prod reciprocal relu relu_ round rsqrt sigmoid sign silu sin softmax sort sqrt square
    std sub sub_ sum tanh topk var where"""
)
_LOW_PRECISION = re.compile(
    r"\b(at::Half|c10::Half|at::BFloat16|c10::BFloat16|__half2?|half2?|__nv_bfloat16\w*"
    r"|__nv_fp8\w*|k(Half|Float16|BFloat16|Float8\w*)|__float2half\w*|__float2bfloat16\w*"
    r"|__half2float|_Float16|float16_t|bfloat16_t)\b|\.half\s*\("
)
_ESCAPES = [
    (
        re.compile(r"\bstd\s*::\s*(thread|jthread|async)\b|\bpthread_\w+"),
        "module_escape",
        "threads escape the timer and the check",
        "parallelise with OpenMP (`#pragma omp parallel for`, -fopenmp in extra_cflags and "
        "extra_ldflags) or at::parallel_for",
    ),
    (
        re.compile(r"\b(asm|__asm__|__asm)\b"),
        "module_escape",
        "inline assembly is out of the gate's sight",
        "write C++ or CUDA; intrinsics (<immintrin.h>, __shfl_sync, __ldg ...) are fine",
    ),
    (
        re.compile(r"##"),
        "module_escape",
        "token pasting builds names the gate cannot read",
        "spell names out, or use a template parameter",
    ),
    (
        re.compile(r"\bstd\s*::\s*chrono\b|\bclock_gettime\b|\bgettimeofday\b|\brdtsc\b"),
        "module_escape",
        "timers: a kernel's work does not depend on the time",
        "leave timing to the verifier, which times forward() itself",
    ),
    (
        re.compile(
            r"\b(fopen|freopen|fread|fwrite|open|openat|creat|unlink|remove|rename|mmap"
            r"|system|popen|exec[lv]p?e?|fork|vfork|getenv|setenv|putenv|dlopen|dlsym"
            r"|socket|connect|bind|listen|accept|kill|ptrace|syscall)\s*\("
        ),
        "file_io",
        "files, processes, the environment and the network are out of a kernel's reach",
        "compute from the tensors passed in; take sizes and options as arguments",
    ),
    (
        re.compile(r"\bstd\s*::\s*(i|o)?fstream\b|\bFILE\s*\*"),
        "file_io",
        "files are out of a kernel's reach (no saved or precomputed results)",
        "compute from the tensors passed in, in every call; report with TORCH_CHECK",
    ),
]
_STATE = re.compile(r"\b(static|thread_local)\b")
# What a library of the toolkit computes in the kernel's place (its handles, descriptors
# and settings are glue): a choice of the policy's, as ATen's ops are.
_LIBRARY_COMPUTE = re.compile(
    r"\b(cublas(?!Create|Destroy|Set|Get|Status|Handle|Operation|Lt(Create|Destroy|Matrix"
    r"Layout(Create|Destroy)|MatmulDesc(Create|Destroy|SetAttribute)|MatmulPreference))\w*"
    r"|cudnn(?!Create|Destroy|Set|Get|Status|Handle)\w+|cufftExec\w*"
    r"|cusparse(?!Create|Destroy|Set|Get|Status|Handle)\w+"
    r"|cusolverDn(?!Create|Destroy|Set|Get|Status|Handle)\w+"
    r"|thrust\s*::\s*(sort|sort_by_key|stable_sort|reduce|reduce_by_key|inclusive_scan"
    r"|exclusive_scan|transform_reduce|inner_product)|cub\s*::\s*Device\w+\s*::\s*\w+)\s*\("
)
_TOP_DECLARATION = re.compile(
    r"^(?!const\b|constexpr\b|using\b|typedef\b|template\b"
    r"|struct\b|class\b|enum\b|namespace\b|extern\b|static_assert\b"
    r"|#)[\w:<>,\s\*&]+?\b\w+\s*(\[[^\]]*\])?\s*(=[^;]*)?;\s*$",
    re.S,
)


def cpp_findings(source: str, *, task_uses_half: bool = False) -> list[CppFinding]:
    """The rules ``source`` (one C++ or CUDA source of an extension) breaks."""
    text = blank(source)
    found: list[CppFinding] = []

    def add(rule: str, offset: int, message: str, instead: str) -> None:
        found.append((rule, text.count("\n", 0, offset) + 1, message, instead))

    for match in re.finditer(r"^[ \t]*#[ \t]*include[ \t]*[<\"]", text, re.M):
        named = re.match(r"[^>\"\n]*", source[match.end() :])
        header = named.group(0).strip() if named else ""
        if not _HEADERS.match(header):
            add(
                "forbidden_import",
                match.start(),
                f"#include <{header}> is not allowed: the system's files, processes, threads "
                "and network (and files of the candidate's own) are out of the gate's sight",
                "include only <torch/extension.h>, ATen/c10 headers, the C and C++ standard "
                "library (<cmath>, <vector> ...), <omp.h>, intrinsics (<immintrin.h>) and the "
                "CUDA toolkit's (<cuda_runtime.h>, <cuda_fp16.h>, cub, cutlass)",
            )
    for match in re.finditer(r"\b(at|torch|c10)\s*::\s*(?:\w+\s*::\s*)*(\w+)", text):
        name = match.group(2)
        if name not in _GLUE and not name.startswith("k") and not name.isupper():
            add(
                "torch_compute",
                match.start(),
                f"`{match.group(0)}`: ATen computing in the kernel's place",
                "compute it in your own loop or kernel; of ATen keep allocation "
                "(torch::empty), shapes, options and data pointers (x.data_ptr<float>())",
            )
    for match in _LIBRARY_COMPUTE.finditer(text):
        add(
            "torch_compute",
            match.start(),
            f"`{match.group(1)}(...)`: a library computing in the kernel's place",
            "write the computation as your own __global__ kernel (its handles and settings "
            "may stay)",
        )
    for match in re.finditer(r"\.\s*(\w+)\s*\(", text):
        if match.group(1) in _TENSOR_COMPUTE:
            add(
                "torch_compute",
                match.start(),
                f"`.{match.group(1)}(...)` computes with ATen instead of the kernel",
                "loop over the data yourself (x.data_ptr<float>(), x.numel()) in the "
                "extension's function or kernel",
            )
    if not task_uses_half:
        for match in _LOW_PRECISION.finditer(text):
            add(
                "precision_downgrade",
                match.start(),
                f"`{match.group(0).strip()}`: the task computes in full precision",
                "compute in float (and accumulate in float); no fp16/bf16/fp8 types",
            )
    for pattern, rule, message, instead in _ESCAPES:
        for match in pattern.finditer(text):
            add(rule, match.start(), message, instead)
    for match in _STATE.finditer(text):
        if not _declares_constant_or_function(text, match.start()):
            add(
                "caching",
                match.start(),
                f"`{match.group(1)}` state outlives the call (result caching)",
                "use a local variable, a `const`/`constexpr` constant, or __shared__ memory; "
                "keep state in the module's __init__",
            )
    expanded = _macros_expanded(text)  # line for line, not offset for offset
    for offset, statement in _namespace_scope_statements(expanded):
        stripped = statement.strip()
        head = stripped.split("=")[0]
        if not _TOP_DECLARATION.match(stripped) or "(" in head or _constant(head):
            continue
        line = expanded.count("\n", 0, offset + len(statement) - len(statement.lstrip())) + 1
        if re.search(r"\b__(constant|device)__\b", head):
            message = (
                "GPU memory at namespace scope (__constant__, __device__) outlives the call: "
                "what one call copies into it another reads (a result cache)"
            )
            instead = "pass shapes and strides as kernel arguments (a struct by value)"
        else:
            message = "a variable at namespace scope outlives the call (result caching)"
            instead = "make it const (or constexpr), or keep state in the module's __init__"
        found.append(("caching", line, message, instead))
    return sorted(set(found), key=lambda f: (f[1], f[0]))


def blank(source: str) -> str:
    """``source`` with comments and string and character literals replaced by spaces
    (newlines kept, so offsets and lines stay)."""
    pattern = re.compile(
        r'//[^\n]*|/\*.*?\*/|R"(?P<d>[^(]*)\(.*?\)(?P=d)"|"(\\.|[^"\\\n])*"|\'(\\.|[^\'\\\n])*\'',
        re.S,
    )

    def spaces(match: re.Match[str]) -> str:
        keep = match.group(0)
        if keep.startswith(('"', "'", 'R"')) and not keep.startswith("//"):
            return keep[0] + re.sub(r"[^\n]", " ", keep[1:-1]) + keep[-1]
        return re.sub(r"[^\n]", " ", keep)

    return pattern.sub(spaces, source)


def _declares_constant_or_function(text: str, start: int) -> bool:
    """Whether the declaration ``static`` or ``thread_local`` at ``start`` belongs to
    declares a function (a parameter list before any ``=``, ``;``, ``{``), a constant
    (``constexpr``; ``const`` on the variable itself, not only on what a pointer points
    to) or memory of one launch (``__shared__``)."""
    begin = max(text.rfind(c, 0, start) for c in ";{}\n") + 1
    rest = text[begin:]
    stop = min((i for i in (rest.find(c) for c in "=;{[") if i >= 0), default=len(rest))
    head = rest[:stop]
    return "(" in head or "__shared__" in head or _constant(head)


def _constant(head: str) -> bool:
    """Whether a declaration's head (up to its initialiser) declares a constant:
    ``constexpr``, or ``const`` on the variable itself (after the last ``*``)."""
    if re.search(r"\bconstexpr\b", head):
        return True
    return bool(re.search(r"\bconst\b", head.rsplit("*", 1)[-1]))


_DEFINE = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)(\([^)]*\))?((?:[^\n]*\\\n)*[^\n]*)", re.M)


def _macros_expanded(text: str) -> str:
    """``text`` as the compiler reads it at namespace scope: preprocessor lines blanked,
    each use of one of its macros replaced by the macro's body (macros in macros too, a
    few levels deep), on the line of the use (so a declaration a macro hides is seen, on
    the line that makes it)."""
    macros = {
        m.group(1): (m.group(2) is not None, m.group(3).replace("\\\n", " "))
        for m in _DEFINE.finditer(text)
    }
    out = _directives_blanked(text)
    if not macros:
        return out
    use = re.compile(r"\b(" + "|".join(map(re.escape, macros)) + r")\b")
    for _ in range(8):
        parts: list[str] = []
        position = 0
        for match in use.finditer(out):
            if match.start() < position:
                continue
            takes_arguments, body = macros[match.group(1)]
            end = match.end()
            if takes_arguments:
                end = _arguments_end(out, match.end())
                if end < 0:
                    continue
            parts += [
                out[position : match.start()],
                body,
                "\n" * out.count("\n", match.start(), end),
            ]
            position = end
        if not parts:
            break
        out = "".join(parts) + out[position:]
    return out


def _arguments_end(text: str, start: int) -> int:
    """Where the parenthesised arguments after ``start`` end (-1: none follow)."""
    opening = re.match(r"\s*\(", text[start:])
    if opening is None:
        return -1
    depth = 0
    for index in range(start + opening.end() - 1, len(text)):
        depth += {"(": 1, ")": -1}.get(text[index], 0)
        if depth == 0:
            return index + 1
    return -1


def _directives_blanked(text: str) -> str:
    """``text`` with its preprocessor lines (and their continuations) blanked."""

    def spaces(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", spaces, text, flags=re.M)


def _namespace_scope_statements(text: str) -> list[tuple[int, str]]:
    """The statements at namespace scope (outside functions, classes and initialisers;
    inside ``namespace`` blocks too), with their offsets."""
    statements: list[tuple[int, str]] = []
    depth = 0  # braces other than a namespace's
    namespaces: list[int] = []  # the depth each open namespace block started at
    start = 0
    for index, char in enumerate(text):
        if char == "{":
            head = text[start:index]
            if depth == 0 and re.search(r"\bnamespace\b[\w\s:]*$", head):
                namespaces.append(depth)
                start = index + 1
            else:
                depth += 1
        elif char == "}":
            if depth == 0 and namespaces:
                namespaces.pop()
                start = index + 1
            else:
                depth = max(0, depth - 1)
                if depth == 0:
                    start = index + 1
        elif char == ";" and depth == 0:
            statements.append((start, text[start : index + 1]))
            start = index + 1
    return statements
