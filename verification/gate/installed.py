"""What the installed packages a candidate imports have (docs/verifier.md, "Feedback that
teaches"): whether a dotted name a candidate writes exists, and the package's version, so
that a refusal can say a name does not exist instead of guessing why it is refused.

Read from the package when asked, by attribute lookups only: nothing a candidate names is
imported (only the package's root, which the daemon has imported or may import); without
the package nothing is claimed to be missing.

Daemon side only.
"""

from __future__ import annotations

import difflib
import functools
import importlib

__all__ = ["closest", "exists", "version"]


@functools.cache
def _root(name: str) -> object | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def version(root: str) -> str:
    """The installed version of the package ``root`` ("" without one)."""
    return str(getattr(_root(root), "__version__", ""))


@functools.cache
def exists(path: str) -> bool | None:
    """Whether the installed package has the dotted ``path`` (``triton.language.tanh``,
    ``torch.nn.functional.gelu``); None when its root cannot be imported here."""
    root, *parts = path.split(".")
    value = _root(root)
    if value is None:
        return None
    for part in parts:
        if not hasattr(value, part):
            return False
        value = getattr(value, part)
    return True


def closest(path: str) -> str | None:
    """The public name beside the last of ``path`` (in the installed package) closest
    to it, as a dotted path; None when none is close."""
    parent, _, leaf = path.rpartition(".")
    if not parent or not exists(parent):
        return None
    value = _root(parent.split(".")[0])
    for part in parent.split(".")[1:]:
        value = getattr(value, part)
    names = [n for n in dir(value) if not n.startswith("_")]
    found = difflib.get_close_matches(leaf, names, n=1, cutoff=0.75)
    return f"{parent}.{found[0]}" if found else None
