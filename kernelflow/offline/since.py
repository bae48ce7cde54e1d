"""``--since TIME``: a time, or a duration back from now, and where the live log reaches
it."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
SINCE_HELP = (
    "only the tasks that began at or after TIME: ISO-8601 (2025-06-01T12:00, "
    "2025-06-01T12:00:00Z; no zone = local time) or a duration back from now (90s, 30m, 2h, "
    "1d, 1h30m)"
)


class BadTime(ValueError):
    pass


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``'s value as a Unix time. Raises BadTime saying what is accepted."""
    now = time.time() if now is None else now
    raw = text.strip()
    if raw and _DURATION.sub("", raw) == "" and (parts := _DURATION.findall(raw)):
        back = sum(float(n) * _UNIT_S[unit] for n, unit in parts)
        return float(int(now - back))  # whole seconds: a readable boundary in file headers
    try:
        when = datetime.fromisoformat(raw)
    except ValueError:
        raise BadTime(
            f"--since {text!r}: not a time; use ISO-8601 (2025-06-01T12:00:00Z, "
            "2025-06-01 12:00 in local time) or a duration back from now (30m, 2h, 1d)"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # a time without a zone is the local time
    at = when.timestamp()
    if at > now:
        raise BadTime(f"--since {text!r} is in the future ({when.isoformat()})")
    return at


def iso_utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
