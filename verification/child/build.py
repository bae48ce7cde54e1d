"""Building a candidate's C++/CUDA extensions (the ``cpp`` and ``cuda`` backends), in the
candidate's confined process, under the verifier's own limit for compiling: each
``load_inline`` call the verifier read in the module (:mod:`kernelflow.verification.
backends.extension`), built under its content's name into the work dir's
``extensions/``, from where the verifier caches it
(:mod:`kernelflow.verification.extensions`). The compiler's errors are cut to what a
coder can act on: the first errors, each with its line and the line's text.

Child side: stdlib at module level; torch is imported where it is used.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from kernelflow.verification.backends.cpp import PREBUILT_MANIFEST
from kernelflow.verification.backends.extension import ExtensionSpec

__all__ = ["MAX_ERRORS", "build_extensions", "compiler_errors"]

MAX_ERRORS = 5
_ERROR = re.compile(
    r"^(?P<where>[^\s:]+\.(?:cpp|cu|cuh|h)):(?P<line>\d+)(?::\d+)?: (?:fatal )?error"
)


def build_extensions(workdir: Path, extensions: list[dict[str, Any]]) -> list[str]:
    """Build each extension into ``workdir``; the compiler's errors (empty: all built)."""
    import torch.utils.cpp_extension as cpp_extension

    # The ninja that the verifier extra installs beside this interpreter, when the daemon
    # runs it without its environment on the PATH.
    here = str(Path(sys.executable).parent)
    os.environ["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "/usr/bin:/bin")])
    root = workdir / Path(PREBUILT_MANIFEST).parent
    for entry in extensions:
        spec = ExtensionSpec.from_json(entry["spec"])
        module = str(entry["module"])
        build = root / module
        build.mkdir(parents=True, exist_ok=True)
        try:
            cpp_extension.load_inline(
                name=module,
                cpp_sources=list(spec.cpp_sources),
                cuda_sources=list(spec.cuda_sources) or None,
                functions=list(spec.functions) or None,  # None: the sources bind their own
                extra_cflags=list(spec.extra_cflags),
                extra_cuda_cflags=list(spec.extra_cuda_cflags),
                extra_ldflags=list(spec.extra_ldflags),
                build_directory=str(build),
                with_cuda=bool(spec.cuda_sources),
                verbose=False,
            )
        except Exception as exc:
            return compiler_errors(str(exc), spec.name)
    return []


def compiler_errors(output: str, name: str) -> list[str]:
    """The first errors of a failed build's output (file, line, message and the line's
    source, as the compiler printed them), not its wall of notes and template instances."""
    lines = output.splitlines()
    found: list[str] = []
    for index, line in enumerate(lines):
        match = _ERROR.match(line.strip())
        if match is None:
            continue
        where = Path(match.group("where")).name
        text = line.strip()[len(match.group("where")) :]
        shown = [f"{where}{text}"[:300]]
        following = lines[index + 1 : index + 3]
        shown += [f"    {s.rstrip()[:200]}" for s in following if s.strip() and "|" in s]
        found.append("\n".join(shown))
        if len(found) == MAX_ERRORS:
            break
    if not found:  # a linker or ninja failure: its last lines
        tail = [line for line in lines if line.strip()][-8:]
        found = ["\n".join(t[:300] for t in tail) or f"building {name!r} failed"]
    return [f"building the extension {name!r} failed:", *found]
