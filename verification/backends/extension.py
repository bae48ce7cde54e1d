"""C++/CUDA extensions a candidate builds with ``torch.utils.cpp_extension.load_inline``,
read from its source without running it: what to compile (``ExtensionSpec``), so that the
verifier compiles it itself, in a sandbox of its own with a time limit of its own, caches
the result, and hands the candidate's process the built library.

A candidate may only give ``load_inline`` what can be read here: literals, and module
names bound once to literals (``cpp_source = r'''...'''``), joined with ``+``. What
cannot be read is refused, since the verifier must check the very code it compiles.

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
GIVEN_BY_CANDIDATE = frozenset(PARAMETERS) - {"extra_include_paths", "build_directory"}
# Compiler and linker flags a candidate may pass: optimisation, target features, OpenMP,
# warnings, macros. Not include or library paths, response files or plugins (they read
# the host's files).
_FLAG = re.compile(
    r"^(-O[0-3s]|-Ofast|-march=[\w.-]+|-mtune=[\w.-]+|-m(no-)?[a-z0-9.-]+|-f(no-)?[a-z0-9-]+"
    r"(=[\w.-]+)?|-W[\w=,-]*|-std=(c|gnu)\+\+\d\d|-D\w+(=[\w.]*)?|-U\w+|-g0|-fopenmp|-lgomp"
    r"|-lm|-pthread|--use_fast_math|-use_fast_math|-arch=[\w.]+|-gencode=[\w.,=]+|-lineinfo"
    r"|-Xptxas=[\w,=-]+|--expt-relaxed-constexpr|--expt-extended-lambda|-res-usage)$"
)
_REFUSED_F = ("-fplugin", "-fprofile", "-fdump", "-fsave", "-fcoverage")
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
        extra_cflags=strings(arguments.get("extra_cflags")),
        extra_cuda_cflags=strings(arguments.get("extra_cuda_cflags")),
        extra_ldflags=strings(arguments.get("extra_ldflags")),
    )


def extension_specs(
    tree: ast.Module, resolve: Resolve
) -> tuple[list[tuple[ast.Call, ExtensionSpec]], list[tuple[ast.AST, str]]]:
    """Every ``load_inline`` call of the module with its spec, and the problems of those
    whose arguments cannot be read from the source (node, what is wrong)."""
    constants = _module_strings(tree)
    found: list[tuple[ast.Call, ExtensionSpec]] = []
    problems: list[tuple[ast.AST, str]] = []
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
            if name is None or name not in GIVEN_BY_CANDIDATE:
                problems.append(
                    (value, f"load_inline({name or '**'}=...) is the verifier's to choose")
                )
                readable = False
                continue
            read = _literal(value, constants)
            if read is _UNREADABLE:
                problems.append(
                    (
                        value,
                        f"load_inline's {name} must be a literal or a module-level string "
                        "(the verifier compiles exactly what it reads)",
                    )
                )
                readable = False
                continue
            given[name] = read
        if not readable:
            continue
        spec = spec_from_call(given)
        flags = [*spec.extra_cflags, *spec.extra_cuda_cflags, *spec.extra_ldflags]
        bad = [f for f in flags if not _FLAG.match(f) or f.startswith(_REFUSED_F)]
        if bad:
            problems.append(
                (
                    node,
                    f"compiler flag {bad[0]!r} is not allowed (optimisation, "
                    "target, OpenMP, warning and macro flags are)",
                )
            )
            continue
        if not spec.name or not (spec.cpp_sources or spec.cuda_sources) or not spec.functions:
            problems.append(
                (node, "load_inline needs a name, the sources and the functions to bind")
            )
            continue
        found.append((node, spec))
    return found, problems


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
    found, _ = extension_specs(tree, module_resolver(tree))
    return list(dict.fromkeys(spec for _, spec in found))


class _Unreadable:
    pass


_UNREADABLE = _Unreadable()


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level names bound exactly once, to a string the source spells out."""
    bound: dict[str, list[ast.AST]] = {}
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.NamedExpr):
            targets = [node.target]
        for target in targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, []).append(node)
    strings: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and len(bound.get(target.id, [])) == 1:
            value = _literal(node.value, strings)
            if isinstance(value, str):
                strings[target.id] = value
    return strings


def _literal(node: ast.AST, constants: dict[str, str]) -> object:
    """The value ``node`` spells out: a constant, a name of ``constants``, ``+`` of
    strings, a list or tuple of those; else ``_UNREADABLE``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str | bool | type(None)):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _literal(node.left, constants), _literal(node.right, constants)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        return _UNREADABLE
    if isinstance(node, ast.List | ast.Tuple):
        items = [_literal(item, constants) for item in node.elts]
        if all(isinstance(item, str) for item in items):
            return items
    return _UNREADABLE
