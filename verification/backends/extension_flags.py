"""The compiler and linker flags a candidate may give ``load_inline``.

Flags tune how the candidate's own code is compiled: optimisation, the target, OpenMP,
warnings, macros, nvcc's and ptxas's tuning and reports, and the libraries of the
toolchain a kernel links (``-lcublas``; what their calls compute is the C++ rules'
business). They may not point the build at files the gate never read: include and
library paths, response files, plugins, profiles, other compilers, output files. Empty
strings (KernelBench's template passes ``extra_cflags=[""]``) are no flags at all, and a
string holding several flags (``"-O3 --use_fast_math"``) is read flag by flag, as the
build's command line reads it.

Imported inside sandboxes: stdlib only.
"""

from __future__ import annotations

import re

__all__ = ["normalized_flags", "refused_flag"]

_SINGLE = re.compile(
    r"^(-O[0-3sz]?|-Ofast|-march=[\w.+-]+|-mtune=[\w.-]+|-mcpu=[\w.+-]+|-m(no-)?[a-z0-9.-]+"
    r"|-f(no-)?[a-z0-9-]+(=[\w.-]+)?|-W(?![lap],)[\w=,+-]*|-w|-std=(c|gnu)\+\+\d\w|-D\w+(=[\w.+-]*)?|-U\w+"
    r"|-g0?|-g[123]|-fopenmp|-pthread|-DNDEBUG|-v|--verbose|-lineinfo|--?use_fast_math"
    r"|-res-usage|--resource-usage|--expt-relaxed-constexpr|--expt-extended-lambda"
    r"|--extended-lambda|--restrict|-?-ftz=(true|false)|-?-prec-(div|sqrt)=(true|false)"
    r"|-?-fmad=(true|false)|--?(maxrregcount|max-register-count)(=\d+)?|-?-dlcm=\w+"
    r"|-arch=[\w.]+|--gpu-architecture=[\w.]+|-code=[\w.,]+|-gencode=[\w.,=]+"
    r"|--generate-code=[\w.,=]+|--threads=?\d*|-t\d+|--ptxas-options=[\w.,=-]+"
    r"|-Xptxas=[\w.,=-]+|-Xcompiler=[\w.,=+-]+|--compiler-options=[\w.,=+-]+"
    r"|--default-stream=legacy|-l(m|gomp|cudart|cublas|cublasLt|curand|cufft|cusparse"
    r"|cusolver|cudnn|c10|c10_cuda|torch|torch_cpu|torch_cuda|torch_python)|-Xcudafe"
    r"|--diag[-_]suppress=[\w,]+|-Xcudafe=--diag_suppress=[\w,]+)$"
)
# Options whose value is the next flag: the value must be one a flag of its own could be,
# or the option's own kind of value.
_VALUED = {
    "-Xptxas": r"[\w.,=-]+",
    "--ptxas-options": r"[\w.,=-]+",
    "-Xcompiler": r"[\w.,=+-]+",
    "--compiler-options": r"[\w.,=+-]+",
    "-gencode": r"arch=[\w.]+,code=[\w.,\[\]]+",
    "--generate-code": r"arch=[\w.]+,code=[\w.,\[\]]+",
    "-arch": r"[\w.]+",
    "--gpu-architecture": r"[\w.]+",
    "-code": r"[\w.,]+",
    "-maxrregcount": r"\d+",
    "--maxrregcount": r"\d+",
    "--threads": r"\d+",
    "-Xcudafe": r"--diag_suppress=[\w,]+",
}
_REFUSED = ("-fplugin", "-fprofile", "-fdump", "-fsave", "-fcoverage", "-fdebug-prefix")
# Within -Xcompiler / -Xptxas lists: what names a file.
_FILE_LIKE = re.compile(r"(^|,)-?-?(o|output|include|I|L|isystem|imacros|B|specs)\b|/|@")


def normalized_flags(flags: tuple[str, ...]) -> tuple[str, ...]:
    """``flags`` as the build's command line reads them: split at whitespace, empty ones
    dropped."""
    return tuple(part for flag in flags for part in flag.split())


def refused_flag(flags: tuple[str, ...]) -> str | None:
    """The first of ``flags`` (normalised) a candidate may not give, or None."""
    index = 0
    while index < len(flags):
        flag = flags[index]
        if flag.startswith(_REFUSED) or _FILE_LIKE.search(flag):
            return flag
        if flag in _VALUED:
            value = flags[index + 1] if index + 1 < len(flags) else ""
            if not re.fullmatch(_VALUED[flag], value) or _FILE_LIKE.search(value):
                return f"{flag} {value}".strip()
            index += 2
            continue
        if not _SINGLE.match(flag):
            return flag
        index += 1
    return None
