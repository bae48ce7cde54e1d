"""The "did you mean" of an error about a name that is not one of the known ones (a role,
an agent kind, a tool, a reward, a provider, a command's choice)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: object, choices: Iterable[str], cutoff: float = 0.6) -> str:
    """``; did you mean 'x'?`` for a near miss of one of ``choices`` (difflib's ratio at
    least ``cutoff``), else nothing."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""
