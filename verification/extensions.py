"""The verifier's cache of compiled C++/CUDA extensions (the ``cpp`` and ``cuda`` backends):
which of a candidate's ``load_inline`` extensions are built already, storing what a build
job made, and handing a candidate's work dir the libraries it loads.

An extension is cached under the hash of its sources, its flags and the toolchain
(:meth:`ExtensionSpec.key`; the toolchain is :func:`toolchain`: the C++ compiler's and
nvcc's version lines, torch's and Python's versions, the processor's model and flags; for
an extension with CUDA sources also :func:`gpu_architecture`: the compute capabilities it
is built for, torch's CUDA version and the nvcc torch builds with): a second check of the
same source compiles nothing. Several verifiers may share a cache dir: a build holds a
lock per extension, and an entry appears only whole (built aside, then renamed into
place). In a cluster the cache sits in front of the verifiers' shared object store
(:mod:`.extension_store`).

Parent side: stdlib only, never imports torch (the toolchain is read from the
interpreter's package metadata and the compiler's version line; the GPU's architecture in
a short subprocess).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelflow.sandbox import sandbox_env
from kernelflow.sandbox.probe import GPU_DEVICE_FILES, PROBE_TIMEOUT_S
from kernelflow.verification.backends.cpp import PREBUILT_MANIFEST
from kernelflow.verification.backends.extension import ExtensionSpec

__all__ = [
    "Extension",
    "build_locks",
    "default_cache_dir",
    "gpu_architecture",
    "install",
    "last_build_s",
    "place",
    "planned_extensions",
    "record_build_s",
    "record_failure",
    "recorded_failure",
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


@functools.cache
def gpu_architecture(python: str, gpu: str | None = None) -> str:
    """What a CUDA build depends on besides :func:`toolchain`, as the build job sees it
    (its sandbox's environment: ``gpu`` only, where a verifier owns one): the compute
    capabilities of the visible devices (``load_inline`` builds for those), torch's CUDA
    version, and the version line of the nvcc torch builds with (``CUDA_HOME``'s, which
    may not be the one on the PATH). A cache shared by machines with other GPUs must not
    hand them code built for this one."""
    if not any(os.path.exists(f) for f in GPU_DEVICE_FILES):
        return "gpu: none"
    probe = (
        "import torch, torch.utils.cpp_extension as c\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "caps = sorted({'sm_%d%d' % torch.cuda.get_device_capability(i) for i in range(n)})\n"
        "print(','.join(caps) or 'none', torch.version.cuda, c.CUDA_HOME or '')\n"
    )
    env = sandbox_env(tempfile.gettempdir(), gpu)
    line = _first_line([python, "-I", "-c", probe], env=env, timeout=PROBE_TIMEOUT_S)
    caps, _, rest = line.partition(" ")
    cuda, _, home = rest.partition(" ")
    nvcc = _first_line([str(Path(home, "bin", "nvcc")) if home else "nvcc", "--version"], last=True)
    return f"gpu {caps} | torch cuda {cuda} | {nvcc}"


def _first_line(
    cmd: list[str], *, last: bool = False, env: dict[str, str] | None = None, timeout: float = 30
) -> str:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except (OSError, subprocess.TimeoutExpired):
        return f"{cmd[0]}: none"
    lines = [line for line in done.stdout.splitlines() if line.strip()] or [f"{cmd[0]}: none"]
    return lines[-1 if last else 0].strip()


def planned_extensions(
    specs: list[ExtensionSpec], cache_dir: Path, tools: str, gpu: str = ""
) -> list[Extension]:
    """Each spec with its module name and cache entry under ``tools`` (the toolchain) and,
    for a spec with CUDA sources, ``gpu`` (:func:`gpu_architecture`) too: a C++-only
    build is the same on every GPU."""
    planned = []
    for spec in specs:
        under = f"{tools} | {gpu}" if spec.cuda_sources and gpu else tools
        planned.append(Extension(spec, spec.module_name(under), cache_dir / spec.key(under)))
    return planned


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
        if libraries:
            _enter(extension, functools.partial(shutil.copyfile, libraries[0]))


def place(extension: Extension, library: bytes) -> None:
    """Put ``library`` (fetched from elsewhere: the cluster's store) into the cache as
    ``extension``'s entry, whole, as :func:`store` does."""
    _enter(extension, lambda target: Path(target).write_bytes(library))


def _enter(extension: Extension, write_library: Callable[[Path], object]) -> None:
    """Make ``extension``'s entry: its library (``write_library`` writes it to the path
    given) and its spec, in a dir aside, renamed into place whole."""
    extension.entry.parent.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix=".building-", dir=extension.entry.parent))
    try:
        write_library(aside / _LIBRARY)
        (aside / _SPEC).write_text(json.dumps(extension.spec.to_json()))
        with contextlib.suppress(OSError):  # another verifier stored it meanwhile
            os.rename(aside, extension.entry)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


# A compiler's diagnostic with its place (``main.cpp:12:20: error: ...``): what makes a
# failed build the source's own, the same on every try.
_DIAGNOSTIC = re.compile(r"^\S+\.(?:cpp|cu|cuh|h|hpp):\d+")


def _failure_file(extension: Extension) -> Path:
    return Path(f"{extension.entry}.failed.json")


def recorded_failure(extensions: list[Extension]) -> dict[str, Any] | None:
    """How an earlier build of one of ``extensions`` failed, if one did with the
    compiler's errors: the same source, flags and toolchain fail the same way again, so
    the build is not run twice (``summary``, ``errors``, ``reasons`` of its report)."""
    for extension in extensions:
        try:
            recorded = json.loads(_failure_file(extension).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(recorded, dict) and isinstance(recorded.get("errors"), list):
            return recorded
    return None


def record_failure(
    extensions: list[Extension], summary: str, errors: list[str], reasons: list[str]
) -> None:
    """Remember a failed build of the one of ``extensions`` its errors name, where the
    compiler said why (a diagnostic with its line): not a build that was killed, ran out
    of time or memory, or could not start, which may go another way next time."""
    named = [e for e in extensions if summary.startswith(f"building the extension {e.spec.name!r}")]
    diagnosed = any(
        _DIAGNOSTIC.match(line.strip()) for error in errors for line in error.splitlines()
    )
    if len(named) != 1 or not diagnosed:
        return
    target = _failure_file(named[0])
    aside = target.with_name(f".{target.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        aside.write_text(json.dumps({"summary": summary, "errors": errors, "reasons": reasons}))
        os.replace(aside, target)


_LAST_BUILD = "last-build.json"


def last_build_s(cache_dir: Path) -> float | None:
    """How long the last build into ``cache_dir`` took, in seconds (None: none yet)."""
    try:
        seconds = json.loads(Path(cache_dir, _LAST_BUILD).read_text()).get("seconds")
    except (OSError, ValueError, AttributeError):
        return None
    return float(seconds) if isinstance(seconds, int | float) else None


def record_build_s(cache_dir: Path, seconds: float) -> None:
    """Remember how long a build into ``cache_dir`` took (what the next one is told)."""
    target = Path(cache_dir, _LAST_BUILD)
    aside = target.with_name(f".{target.name}.{os.getpid()}")
    with contextlib.suppress(OSError):
        aside.write_text(json.dumps({"seconds": round(seconds, 1)}))
        os.replace(aside, target)


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
