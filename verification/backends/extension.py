"""C++/CUDA extensions a candidate builds with ``torch.utils.cpp_extension.load_inline``,
read from its source without running it: what to compile (``ExtensionSpec``), so that the
verifier compiles it itself, in a sandbox of its own with a time limit of its own, caches
the result, and hands the candidate's process the built library.

A candidate may only give ``load_inline`` what can be read here (:mod:`.extension_values`:
literals, names bound once to them, text formatted from them) and flags that tune the
build of that code (:mod:`.extension_flags`). What cannot be read is refused, since the
verifier must check the very code it compiles. The functions an extension exposes are
those ``functions=`` names, or, without it, those its sources bind themselves in
``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("name", ...); }``.

Imported inside sandboxes: stdlib only.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass

from kernelflow.verification.backends.base import dotted_name, import_bindings
from kernelflow.verification.backends.extension_flags import normalized_flags, refused_flag
from kernelflow.verification.backends.extension_values import UNREADABLE, call_scopes

__all__ = [
    "LOAD_INLINE",
    "ExtensionSpec",
    "extension_specs",
    "module_resolver",
    "spec_from_call",
    "wanted_extensions",
]

LOAD_INLINE = "torch.utils.cpp_extension.load_inline"
# load_inline's parameters, in order; those a candidate may give (the rest are the
# verifier's: where it builds, which files it reads).
PARAMETERS = (
    "name",
    "cpp_sources",
    "cuda_sources",
    "functions",
    "extra_cflags",
    "extra_cuda_cflags",
    "extra_ldflags",
    "extra_include_paths",
    "build_directory",
    "verbose",
    "with_cuda",
)
_VERIFIERS = frozenset({"extra_include_paths", "build_directory"})
GIVEN_BY_CANDIDATE = frozenset(PARAMETERS) - _VERIFIERS
Resolve = Callable[[ast.AST], "str | None"]


@dataclass(frozen=True)
class ExtensionSpec:
    """One ``load_inline`` call, as the verifier compiles it."""

    name: str
    cpp_sources: tuple[str, ...] = ()
    cuda_sources: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    extra_cflags: tuple[str, ...] = ()
    extra_cuda_cflags: tuple[str, ...] = ()
    extra_ldflags: tuple[str, ...] = ()

    def key(self, toolchain: str) -> str:
        """What its build depends on, hashed: the sources, the flags, the toolchain."""
        text = json.dumps([asdict(self), toolchain], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def module_name(self, toolchain: str) -> str:
        """The name it is built and imported under (the candidate's own name may repeat
        across candidates; this one is its content's)."""
        return "kf_ext_" + self.key(toolchain)[:20]

    def exposed(self) -> tuple[str, ...]:
        """The functions the built module exposes: ``functions``, or those the sources
        bind in their own ``PYBIND11_MODULE`` block."""
        if self.functions:
            return self.functions
        return tuple(dict.fromkeys(own_bindings("\n".join(self.cpp_sources + self.cuda_sources))))

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, object]) -> ExtensionSpec:
        def strings(key: str) -> tuple[str, ...]:
            value = data.get(key) or ()
            return tuple(str(v) for v in value)  # type: ignore[attr-defined]

        return cls(
            name=str(data["name"]),
            cpp_sources=strings("cpp_sources"),
            cuda_sources=strings("cuda_sources"),
            functions=strings("functions"),
            extra_cflags=strings("extra_cflags"),
            extra_cuda_cflags=strings("extra_cuda_cflags"),
            extra_ldflags=strings("extra_ldflags"),
        )


def spec_from_call(arguments: dict[str, object]) -> ExtensionSpec:
    """The spec of a ``load_inline`` call given ``arguments`` (by parameter name): what the
    candidate's process compares with what the verifier built."""

    def strings(value: object) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        return tuple(str(v) for v in value)  # type: ignore[attr-defined]

    return ExtensionSpec(
        name=str(arguments.get("name", "")),
        cpp_sources=strings(arguments.get("cpp_sources")),
        cuda_sources=strings(arguments.get("cuda_sources")),
        functions=strings(arguments.get("functions")),
        extra_cflags=normalized_flags(strings(arguments.get("extra_cflags"))),
        extra_cuda_cflags=normalized_flags(strings(arguments.get("extra_cuda_cflags"))),
        extra_ldflags=normalized_flags(strings(arguments.get("extra_ldflags"))),
    )


def own_bindings(source: str) -> list[str]:
    """The names a source binds in its own ``PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)``
    block (``m.def("forward", &forward)``), in order."""
    names: list[str] = []
    for block in re.finditer(
        r"PYBIND11_MODULE\s*\(\s*TORCH_EXTENSION_NAME\s*,\s*(\w+)\s*\)", source
    ):
        handle = re.escape(block.group(1))
        body = source[block.end() : _block_end(source, block.end())]
        names += re.findall(rf"\b{handle}\s*\.\s*def\s*\(\s*\"(\w+)\"", body)
    return names


def _block_end(source: str, start: int) -> int:
    """Where the brace block opening after ``start`` closes (the end if it never does)."""
    depth = 0
    for index in range(source.find("{", start), len(source)):
        if index < 0:
            break
        if source[index] == "{":
            depth += 1
        elif source[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return len(source)


def extension_specs(
    tree: ast.Module, resolve: Resolve
) -> tuple[list[tuple[ast.Call, ExtensionSpec]], list[tuple[ast.AST, str, str]]]:
    """Every ``load_inline`` call of the module with its spec, and the problems of those
    whose arguments cannot be read from the source (node, what is wrong, what to write
    instead)."""
    scopes = call_scopes(tree)
    found: list[tuple[ast.Call, ExtensionSpec]] = []
    problems: list[tuple[ast.AST, str, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and resolve(node.func) == LOAD_INLINE):
            continue
        given: dict[str, object] = {}
        readable = True
        named = [
            *zip(PARAMETERS, node.args, strict=False),
            *((k.arg, k.value) for k in node.keywords),
        ]
        for name, value in named:
            nothing = isinstance(value, ast.Constant) and value.value is None
            if name in _VERIFIERS and (nothing or (isinstance(value, ast.List) and not value.elts)):
                continue  # extra_include_paths=[], build_directory=None: nothing asked
            if name is None or name not in GIVEN_BY_CANDIDATE:
                problems.append(
                    (
                        value,
                        f"load_inline({name or '**'}=...) is the verifier's to choose",
                        f"leave {name or '**'}=... out; give only "
                        + ", ".join(sorted(GIVEN_BY_CANDIDATE)),
                    )
                )
                readable = False
                continue
            read = scopes[id(node)].read(value)
            if read is UNREADABLE or not _strings(read):
                problems.append(
                    (
                        value,
                        f"load_inline's {name} is not spelled out in the module (the verifier "
                        "compiles exactly what it reads)",
                        f"give {name} as literals, names bound once to them, or text "
                        "formatted from them, at module level",
                    )
                )
                readable = False
                continue
            given[name] = read
        if not readable:
            continue
        spec = spec_from_call(given)
        bad = refused_flag(spec.extra_cflags + spec.extra_cuda_cflags + spec.extra_ldflags)
        if bad is not None:
            problems.append(
                (
                    node,
                    f"compiler flag {bad!r} is not allowed: paths, files, plugins and other "
                    "compilers point the build at what the gate never read",
                    "use optimisation, target, OpenMP, warning and macro flags (-O3, "
                    "-march=native, -fopenmp, -DNAME), nvcc's and ptxas's own (--use_fast_math, "
                    "-arch=sm_90, -Xptxas=-v) and the toolchain's libraries (-lcublas)",
                )
            )
        if not spec.name or not (spec.cpp_sources or spec.cuda_sources):
            problems.append(
                (
                    node,
                    "load_inline needs a name and the sources to build",
                    'give name="my_ext" and cpp_sources (and cuda_sources for CUDA)',
                )
            )
        elif not spec.exposed():
            problems.append(
                (
                    node,
                    "load_inline builds no function to call",
                    'name them in functions=["my_forward"] or bind them in the sources\' '
                    "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)",
                )
            )
        found.append((node, spec))
    return found, problems


def _strings(value: object) -> bool:
    """Whether ``value`` is what load_inline's parameters take: a string, a list of them,
    a flag (True/False/None)."""
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    return isinstance(value, str | bool | type(None))


def module_resolver(tree: ast.Module) -> Resolve:
    """A node's dotted name, its first part resolved through the module's imports (as the
    gate resolves names, for a reader that runs no gate)."""
    aliases = {
        local: path
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0)
        for local, path, _ in import_bindings(node)
    }

    def resolve(node: ast.AST) -> str | None:
        name = dotted_name(node)
        if name is None:
            return None
        head, _, rest = name.partition(".")
        base = aliases.get(head)
        if base is None:
            return name
        return f"{base}.{rest}" if rest else base

    return resolve


def wanted_extensions(source: str) -> list[ExtensionSpec]:
    """The extensions a candidate's module builds, each once, read from its source (none
    when it does not parse: the check refuses it anyway)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found, problems = extension_specs(tree, module_resolver(tree))
    if problems:
        return []
    return list(dict.fromkeys(spec for _, spec in found))
