"""The static gate for C++ and CUDA sources a candidate compiles with ``load_inline``:
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

__all__ = ["CppFinding", "cpp_findings"]


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


CppFinding = tuple[str, int, str]  # (rule, line in the source, message)

# Headers a source may include: the language's, torch's, OpenMP's, intrinsics, CUDA's.
_HEADERS = re.compile(
    r"^(torch/(extension|torch|all)\.h|ATen/[\w/]+\.h|c10/[\w/]+\.h|pybind11/[\w/]+\.h|omp\.h"
    r"|(imm|x86|emm|pmm|tmm|smm|nmm|wmm|avx\w*)intrin\.h|arm_neon\.h|cuda(_runtime(_api)?)?\.h"
    r"|cuda_fp16\.h|cuda_bf16\.h|cooperative_groups(/[\w]+)?(\.h)?|mma\.h|cub/[\w/.]+"
    r"|(c)?(math|stdint|stddef|float|limits|string|assert|errno)(\.h)?|algorithm|array|atomic"
    r"|bitset|climits|cmath|complex|cstdint|cstddef|cstring|functional|initializer_list"
    r"|iterator|limits|memory|numeric|optional|tuple|type_traits|utility|vector|cfloat"
    r"|cassert|stdexcept|string|string_view|sstream|iostream|map|unordered_map|set|deque)$"
)
# Of at:: / torch:: / c10::, what is not computing: allocation, options and dtypes, shapes,
# errors, dispatch macros' helpers, ATen's thread pool, CUDA streams of the current device.
_GLUE = _names(
    """Tensor TensorOptions ScalarType Scalar Device DeviceType IntArrayRef Layout
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
        "threads escape the timer and the check: parallelise with OpenMP or at::parallel_for",
    ),
    (
        re.compile(r"\b(asm|__asm__|__asm)\b"),
        "module_escape",
        "inline assembly is out of the gate's sight: write C++ (intrinsics are fine)",
    ),
    (re.compile(r"##"), "module_escape", "token pasting builds names the gate cannot read"),
    (
        re.compile(r"\bstd\s*::\s*chrono\b|\bclock_gettime\b|\bgettimeofday\b|\brdtsc\b"),
        "module_escape",
        "timers: a kernel's work does not depend on the time",
    ),
    (
        re.compile(
            r"\b(fopen|freopen|fread|fwrite|open|openat|creat|unlink|remove|rename|mmap"
            r"|system|popen|exec[lv]p?e?|fork|vfork|getenv|setenv|putenv|dlopen|dlsym"
            r"|socket|connect|bind|listen|accept|kill|ptrace|syscall)\s*\("
        ),
        "file_io",
        "files, processes, the environment and the network are out of a kernel's reach",
    ),
    (
        re.compile(r"\bstd\s*::\s*(i|o)?fstream\b|\bFILE\s*\*"),
        "file_io",
        "files are out of a kernel's reach (no saved or precomputed results)",
    ),
]
_STATE = re.compile(r"\b(static|thread_local)\b(?!\s+(inline|constexpr|const|__)\b)")
_TOP_DECLARATION = re.compile(
    r"^\s*(?!const\b|constexpr\b|using\b|typedef\b|template\b"
    r"|struct\b|class\b|enum\b|namespace\b|extern\b|static_assert\b"
    r"|#)[\w:<>,\s\*&]+?\b\w+\s*(\[[^\]]*\])?\s*(=[^;]*)?;\s*$",
    re.S,
)


def cpp_findings(source: str, *, task_uses_half: bool = False) -> list[CppFinding]:
    """The rules ``source`` (one C++ or CUDA source of an extension) breaks."""
    text = _blank(source)
    found: list[CppFinding] = []

    def add(rule: str, offset: int, message: str) -> None:
        found.append((rule, text.count("\n", 0, offset) + 1, message))

    for match in re.finditer(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", source, re.M):
        if not _HEADERS.match(match.group(1).strip()):
            add(
                "forbidden_import",
                match.start(),
                f"#include <{match.group(1)}> is not allowed "
                "(the language's, torch's, OpenMP's and intrinsics headers are)",
            )
    for match in re.finditer(r"\b(at|torch|c10)\s*::\s*(?:\w+\s*::\s*)*(\w+)", text):
        name = match.group(2)
        if name not in _GLUE and not name.startswith("k") and not name.isupper():
            add(
                "torch_compute",
                match.start(),
                f"`{match.group(0)}`: ATen computing in the "
                "kernel's place (allocation, shapes and data pointers are glue)",
            )
    for match in re.finditer(r"\.\s*(\w+)\s*\(", text):
        if match.group(1) in _TENSOR_COMPUTE:
            add(
                "torch_compute",
                match.start(),
                f"`.{match.group(1)}(...)` computes with ATen instead of the kernel",
            )
    if not task_uses_half:
        for match in _LOW_PRECISION.finditer(text):
            add(
                "precision_downgrade",
                match.start(),
                f"`{match.group(0).strip()}`: the task "
                "computes in full precision; do not downgrade to fp16/bf16/fp8",
            )
    for pattern, rule, message in _ESCAPES:
        for match in pattern.finditer(text):
            add(rule, match.start(), message)
    for match in _STATE.finditer(text):
        if not _declares_function(text, match.end()):
            add(
                "caching",
                match.start(),
                f"`{match.group(1)}` state outlives the call "
                "(result caching): keep state in the module's __init__",
            )
    for offset, statement in _namespace_scope_statements(text):
        if _TOP_DECLARATION.match(statement) and "(" not in statement.split("=")[0]:
            add(
                "caching",
                offset,
                "a variable at namespace scope outlives the call (result "
                "caching): make it const, or keep state in the module's __init__",
            )
    return sorted(set(found), key=lambda f: (f[1], f[0]))


def _blank(source: str) -> str:
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


def _declares_function(text: str, start: int) -> bool:
    """Whether the declaration after ``static`` at ``start`` is a function (a parameter
    list before any ``=``, ``;`` or ``{``)."""
    rest = text[start:]
    stop = min((i for i in (rest.find(c) for c in "=;{") if i >= 0), default=len(rest))
    return "(" in rest[:stop]


def _namespace_scope_statements(text: str) -> list[tuple[int, str]]:
    """The statements at namespace scope (outside functions, classes and initialisers;
    inside ``namespace`` blocks too), with their offsets; preprocessor lines left out."""
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
            statement = "\n".join(
                line
                for line in text[start : index + 1].splitlines()
                if not line.lstrip().startswith("#")
            )
            statements.append((start, statement))
            start = index + 1
    return statements
