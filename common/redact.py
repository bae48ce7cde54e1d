"""Credentials removed from text that leaves a process for the log, a prompt or a report.

Text that code under test produced (a candidate's exception message, a tool's output)
goes into verification reports, the coder's next prompt and the permanent log. Whatever
looks like a credential is replaced with ``***`` first: user-info in URLs
(``nats://user:pass@host``), API keys (``sk-…``, ``AKIA…``, GitHub and Slack tokens, NATS
seeds), bearer tokens and ``key=value`` assignments of secret-looking names, and the
values of this process's own secret settings (environment variables named like
``*_KEY``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, and the password of any URL among
them), wherever they appear.

Pure: reading the environment is the only thing it does.
"""

from __future__ import annotations

import os
import re
import traceback
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

__all__ = ["MASK", "scrub", "scrubbed_traceback", "secret_values"]

MASK = "***"
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # user-info of a URL: scheme://user:password@host, scheme://token@host
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"<>]+@"), rf"\g<1>{MASK}@"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{16,}"), f"sk-{MASK}"),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), MASK),
    (re.compile(r"\b(?:gh[pousr]|github_pat)_[A-Za-z0-9_]{20,}"), MASK),
    (re.compile(r"\bxox[abeprs]-[A-Za-z0-9-]{10,}"), MASK),
    # NATS nkey seeds (S + key type + 56 base32 chars) and JWTs
    (re.compile(r"\bS[UAONCX][A-Z2-7]{56}\b"), MASK),
    (re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"), MASK),
    (re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}"), rf"\g<1>\g<2>{MASK}"),
    (
        re.compile(
            r"(?i)\b([a-z0-9_.-]*(?:api[_-]?key|secret|token|passw(?:or)?d|credentials?)"
            r"[\"']?\s*[:=]\s*[\"']?)[^\s\"',;]{4,}"
        ),
        rf"\g<1>{MASK}",
    ),
)
_SECRET_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE)")
# Shorter values are too likely to stand for something else in ordinary text.
_MIN_SECRET_CHARS = 6


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secrets this process was given: values of secret-looking environment variables,
    and the user-info (user and password) of every URL in the environment, longest
    first."""
    environ = os.environ if environ is None else environ
    found: set[str] = set()
    for name, value in environ.items():
        if _SECRET_NAME.search(name) and len(value) >= _MIN_SECRET_CHARS:
            found.add(value)
        for url in re.findall(r"[a-z][a-z0-9+.-]*://[^\s,]+", value, flags=re.I):
            try:
                parts = urlsplit(url)
            except ValueError:
                continue
            for part in (parts.username, parts.password):
                if part and len(part) >= _MIN_SECRET_CHARS:
                    found.add(part)
    return sorted(found, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with every credential-looking part, and every one of ``secrets`` (default:
    this process's, :func:`secret_values`), replaced with ``***``."""
    if not text:
        return text
    for value in secret_values() if secrets is None else secrets:
        if value and value in text:
            text = text.replace(value, MASK)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def scrubbed_traceback() -> str:
    """The traceback of the exception being handled, scrubbed: for a log line, where an
    exception's message may quote a URL with its user-info or a header with its key."""
    return scrub(traceback.format_exc().rstrip())
