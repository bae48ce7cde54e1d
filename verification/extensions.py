"""The verifier's cache of compiled C++/CUDA extensions (the ``cpp`` and ``cuda`` backends):
which of a candidate's ``load_inline`` extensions are built already, storing what a build
job made, and handing a candidate's work dir the libraries it loads.

An extension is cached under the hash of its sources, its flags and the toolchain
(:meth:`ExtensionSpec.key`): a second check of the same source compiles nothing. Several
verifiers may share a cache dir: a build holds a lock per extension, and an entry appears
only whole (built aside, then renamed into place).

Parent side: stdlib only, never imports torch (the toolchain is read from the
interpreter's package metadata and the compiler's version line).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kernelflow.verification.backends.cpp import PREBUILT_MANIFEST
from kernelflow.verification.backends.extension import ExtensionSpec

__all__ = [
    "Extension",
    "build_locks",
    "default_cache_dir",
    "install",
    "planned_extensions",
    "store",
    "toolchain",
    "unbuilt",
]

_LIBRARY = "library.so"
_SPEC = "spec.json"


@dataclass(frozen=True)
class Extension:
    """One extension a candidate builds: its spec, and its entry in the cache."""

    spec: ExtensionSpec
    module: str  # the name it is built and imported under (its content's)
    entry: Path  # <cache>/<key>: library.so and spec.json once built

    @property
    def library(self) -> Path:
        return self.entry / _LIBRARY

    def job_entry(self) -> dict[str, object]:
        """How a build job names it (see ``child.build``)."""
        return {"spec": self.spec.to_json(), "module": self.module}


def default_cache_dir() -> Path:
    """Where extensions are cached when the configuration names no dir: a dir of this
    user's under the system's temp dir (the daemon and the CLI name one in the data dir)."""
    return Path(tempfile.gettempdir(), f"kernelflow-extensions-{os.getuid()}")


@functools.cache
def toolchain(python: str) -> str:
    """What a build depends on besides its sources: the C++ (and CUDA) compilers' version
    lines, the torch and Python versions of ``python``, the processor."""
    parts = [_first_line(["c++", "--version"]), _first_line(["nvcc", "--version"], last=True)]
    probe = (
        "import importlib.metadata as m, sys; "
        "print(m.version('torch'), '%d.%d' % sys.version_info[:2])"
    )
    parts.append(_first_line([python, "-I", "-c", probe]))
    parts.append(_cpu_identity())
    return " | ".join(parts)


def _cpu_identity() -> str:
    """The processor's model and instruction-set flags, hashed (``-march=native`` builds
    for them: a cache shared by other machines must not hand them this one's code)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cpu: unknown"
    wanted = [
        line
        for line in text.splitlines()
        if line.startswith(("model name", "flags", "Features", "CPU part"))
    ]
    return "cpu " + hashlib.sha256("\n".join(sorted(set(wanted))).encode()).hexdigest()[:16]


def _first_line(cmd: list[str], *, last: bool = False) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return f"{cmd[0]}: none"
    lines = [line for line in done.stdout.splitlines() if line.strip()] or [f"{cmd[0]}: none"]
    return lines[-1 if last else 0].strip()


def planned_extensions(specs: list[ExtensionSpec], cache_dir: Path, tools: str) -> list[Extension]:
    """Each spec with its module name and cache entry under ``tools`` (the toolchain)."""
    return [Extension(spec, spec.module_name(tools), cache_dir / spec.key(tools)) for spec in specs]


def unbuilt(extensions: list[Extension]) -> list[Extension]:
    """Those of ``extensions`` not built yet (empty: all are in the cache)."""
    return [e for e in extensions if not e.library.is_file()]


@contextlib.contextmanager
def build_locks(extensions: list[Extension]) -> Iterator[None]:
    """Hold the build lock of each of ``extensions`` (in one order, so two verifiers never
    wait on each other): a verifier that wanted the same extension waits here, then finds
    it built."""
    with contextlib.ExitStack() as stack:
        for extension in sorted(extensions, key=lambda e: e.entry.name):
            extension.entry.parent.mkdir(parents=True, exist_ok=True)
            lock = stack.enter_context(open(f"{extension.entry}.lock", "a+b"))
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def store(extensions: list[Extension], built_dir: Path) -> None:
    """Move what a build job left in ``built_dir`` (its ``extensions/`` dir: one dir per
    module) into the cache: each entry built aside and renamed into place whole."""
    for extension in extensions:
        libraries = sorted(Path(built_dir, extension.module).glob(f"{extension.module}*.so"))
        if not libraries:
            continue
        aside = Path(tempfile.mkdtemp(prefix=".building-", dir=extension.entry.parent))
        try:
            shutil.copyfile(libraries[0], aside / _LIBRARY)
            (aside / _SPEC).write_text(json.dumps(extension.spec.to_json()))
            with contextlib.suppress(OSError):  # another verifier stored it meanwhile
                os.rename(aside, extension.entry)
        finally:
            shutil.rmtree(aside, ignore_errors=True)


def install(extensions: list[Extension], candidate_dir: Path) -> None:
    """Copy the built libraries into the candidate's work dir, with the manifest its
    ``load_inline`` loads them by (the candidate reads only its own dir)."""
    manifest = Path(candidate_dir, PREBUILT_MANIFEST)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    entries = []
    for extension in extensions:
        target = manifest.parent / extension.module / f"{extension.module}.so"
        target.parent.mkdir(exist_ok=True)
        shutil.copyfile(extension.library, target)
        entries.append(
            {"spec": extension.spec.to_json(), "library": str(target.relative_to(manifest.parent))}
        )
    manifest.write_text(json.dumps(entries))
