"""What the installed Triton has, for the gate's feedback (docs/verifier.md, "Feedback
that teaches"): whether a name a candidate writes exists, and what to write instead when it
does not (a name of the language the gate accepts, a libdevice function per vendor, an
idiom built from the language's own functions).

Everything is read from the installed package when asked (``hasattr`` along the path:
:mod:`kernelflow.verification.gate.installed`; the ``libdevice`` modules found under
``triton.language.extra``, imported by the names the package lists), never from a list
of what a release holds; without an importable Triton nothing is claimed to be missing.

Daemon side only.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path

from kernelflow.verification.gate.installed import exists as installed_exists
from kernelflow.verification.gate.installed import version

__all__ = ["Suggestion", "exists", "libdevice_paths", "suggest", "triton_version"]

_TL = "triton.language"
# Idioms for functions a coder expects in the language and it does not have, written with
# the language's own functions ({x}: the argument). Used only where every tl.* name an
# idiom calls exists in the installed Triton.
_IDIOMS = {
    "tanh": "2 * tl.sigmoid(2 * {x}) - 1",
    "relu": "tl.maximum({x}, 0.0)",
    "softplus": "tl.log(1 + tl.exp({x}))",
    "gelu": "0.5 * {x} * (1 + tl.erf({x} * 0.7071067811865476))",
    "silu": "{x} * tl.sigmoid({x})",
    "isnan": "{x} != {x}",
    "log1p": "tl.log(1 + {x})",
    "expm1": "tl.exp({x}) - 1",
    "square": "{x} * {x}",
    "neg": "-{x}",
    "reciprocal": "1.0 / {x}",
}
# Literals standing in for constants a coder expects in the language.
_LITERALS = {"pi": "3.141592653589793", "e": "2.718281828459045"}
# What to write for names no function stands in for (in words).
_WORDS = {
    "pi": "or a module-level constant `PI = 3.141592653589793` read in the kernel",
    "numel": "pass the element count as a kernel argument (`n = x.numel()` on the host)",
    "meshgrid": "broadcast instead: `rows[:, None]` and `cols[None, :]`",
}


def triton_version() -> str:
    """The installed Triton's version ("" without one)."""
    return version("triton")


def exists(path: str) -> bool | None:
    """Whether the installed Triton has the dotted ``path`` (``triton.language.tanh``;
    its libdevice modules imported first); None when no Triton can be imported here."""
    libdevice_paths()
    return installed_exists(path)


@functools.cache
def libdevice_paths() -> tuple[tuple[str, str], ...]:
    """The installed Triton's libdevice modules, each imported: (vendor, module path),
    the dispatching one (vendor "") first."""
    try:
        extra = importlib.import_module(f"{_TL}.extra")
    except ImportError:
        return ()
    found = []
    for info in pkgutil.iter_modules(extra.__path__):
        if info.name == "libdevice":
            found.append(("", f"{_TL}.extra.libdevice"))
        elif info.ispkg:
            folder = [str(Path(str(getattr(info.module_finder, "path", ""))) / info.name)]
            if any(sub.name == "libdevice" for sub in pkgutil.iter_modules(folder)):
                found.append((info.name, f"{_TL}.extra.{info.name}.libdevice"))
    for _, name in found:
        importlib.import_module(name)
    return tuple(sorted(found))


class Suggestion:
    """What to write instead of a Triton-language name: ``replacement`` (a resolved
    dotted path standing in for the name, or ""), ``idiom`` (an expression template with
    ``{x}`` for the argument of a call, or ""), and the advice in words."""

    def __init__(self, replacement: str = "", idiom: str = "", words: str = "") -> None:
        self.replacement = replacement
        self.idiom = idiom
        self.words = words


def suggest(path: str, accepted: Callable[[str], bool]) -> Suggestion:
    """What to write instead of ``path`` (under triton.language; the installed Triton
    lacks it): its last name where the language has it under a path the gate accepts
    (``accepted``), an idiom, the libdevice function per vendor, or the closest name."""
    leaf = path.rsplit(".", 1)[-1]
    if leaf == "libdevice":  # the module itself, where it was once (tl.libdevice)
        modules = [module for _, module in libdevice_paths() if accepted(f"{module}.exp")]
        return Suggestion(replacement=modules[0]) if modules else Suggestion()
    for candidate in (f"{_TL}.{leaf}", f"{_TL}.math.{leaf}"):
        if candidate != path and accepted(candidate) and exists(candidate):
            return Suggestion(replacement=candidate)
    vendors = [
        (vendor, f"{module}.{leaf}")
        for vendor, module in libdevice_paths()
        if exists(f"{module}.{leaf}")
    ]
    device = ""
    if vendors:
        named = ", ".join(
            f"`{_short(p)}` ({_VENDORS.get(v, v)}{'' if accepted(p) else ', not accepted here'})"
            for v, p in vendors
        )
        device = (
            f"the installed Triton has it as a libdevice function: {named}; Triton's CPU "
            "interpreter runs no libdevice call"
        )
    idiom = _IDIOMS.get(leaf, "")
    if idiom and all(exists(f"{_TL}.{name}") for name in _called(idiom)):
        return Suggestion(idiom=idiom, words=device)
    usable = [p for _, p in vendors if accepted(p)]
    if usable:
        return Suggestion(replacement=usable[0], words=device)
    if leaf in _WORDS or leaf in _LITERALS:
        return Suggestion(replacement=_LITERALS.get(leaf, ""), words=_WORDS.get(leaf, ""))
    names = _language_names(accepted)
    close = difflib.get_close_matches(leaf, names, n=1, cutoff=0.75)
    if close:
        return Suggestion(replacement=f"{_TL}.{close[0]}")
    return Suggestion(words="write it with the language's own functions (tl.exp, tl.where ...)")


_VENDORS = {"": "any GPU, picked when compiled", "cuda": "NVIDIA", "hip": "AMD"}


def _short(path: str) -> str:
    return "tl" + path[len(_TL) :] if path.startswith(_TL) else path


def _called(idiom: str) -> list[str]:
    return [part.split("(")[0] for part in idiom.split("tl.")[1:]]


def _language_names(accepted: Callable[[str], bool]) -> list[str]:
    """The public names of the installed triton.language the gate accepts."""
    if not exists(_TL):
        return []
    language = importlib.import_module(_TL)
    return [n for n in dir(language) if not n.startswith("_") and accepted(f"{_TL}.{n}")]
