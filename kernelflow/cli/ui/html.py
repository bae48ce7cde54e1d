"""What every page of the dashboard is made of: escaping, links, the page shell, badges,
tables, numbers and times.

Everything that comes from the log (task and group ids, candidate code, LLM prompts and
answers, reasons, metadata) is attacker-controlled: it reaches a page only through
``esc`` (directly, or through ``link``, ``pre``, ``cell`` and friends), and the shell's
Content-Security-Policy (``app``) runs no script but the dashboard's own file.
"""

from __future__ import annotations

import hashlib
import html
import time
from collections.abc import Iterable, Sequence
from urllib.parse import quote, urlencode

from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.speedups import speedup_text

# Sent with every page and stream: the CSP is the second line behind ``esc``.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

# The CSS class of each status and verdict a badge shows; anything else is "other" (a
# class attribute never carries text from the log).
_BADGES = {
    "running": "run",
    "success": "ok",
    "pass": "ok",
    "ok": "ok",
    "failed": "bad",
    "fail": "bad",
    "mismatch": "bad",
    "error": "bad",
    "compile_error": "bad",
    "runtime_error": "bad",
    "timeout": "warn",
    "cancelled": "warn",
    "rejected": "warn",
    "budget_exceeded": "warn",
    "unsupported": "warn",
    "rejected_static": "bad",
    "rejected_runtime": "bad",
}


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def href(*parts: str, **query: str | None) -> str:
    """A path of the dashboard: each part quoted whole (an id with ``/`` or ``?`` stays one
    part), and the query's non-empty values."""
    path = "/" + "/".join(quote(p, safe="") for p in parts)
    kept = {k: v for k, v in query.items() if v}
    return path + ("?" + urlencode(kept) if kept else "")


def link(text: object, url: str) -> str:
    return f'<a href="{esc(url)}">{esc(text)}</a>'


def task_link(task_id: str) -> str:
    return link(task_id, href("tasks", task_id))


def group_link(group_id: str) -> str:
    return link(group_id, href("groups", group_id))


def pre(text: object, cls: str = "") -> str:
    return f'<pre class="{cls}">{esc(text)}</pre>' if cls else f"<pre>{esc(text)}</pre>"


def badge(text: object) -> str:
    return f'<span class="badge {_BADGES.get(str(text).lower(), "other")}">{esc(text)}</span>'


def folded(summary: str, body: str, *, ident: str, is_open: bool = False) -> str:
    """A ``<details>`` block; ``summary`` is HTML already. ``ident`` keeps it open or
    closed across live updates (the page's script restores what the user opened)."""
    opened = " open" if is_open else ""
    return (
        f'<details id="{esc(ident)}"{opened}><summary>{summary}</summary>'
        f'<div class="inner">{body}</div></details>'
    )


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table of HTML cells (escape what goes in them: ``cell``)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def cell(value: object) -> str:
    """A table cell's text: ``—`` for nothing."""
    return "—" if value is None or value == "" else esc(value)


def number(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def speedup(
    value: float | None, conclusive: bool | None = None, interval: Sequence[float] = ()
) -> str:
    """A speedup's cell: ``1.70x``; ``inconclusive (between 0.03x and 10.57x): the machine
    was busy`` when ``conclusive`` is False (``kernelflow.projections.speedups``)."""
    return esc(speedup_text(value, interval, conclusive, untimed="—"))


def task_speedup(t: TaskMetrics) -> str:
    """A task's speedup cell: the one it ended with, or the best conclusive one so far."""
    if not t.ended:
        return speedup(t.best_speedup)
    return speedup(t.final_speedup, t.final_conclusive, t.final_speedup_ci95)


def sol_cell(fraction: object) -> str:
    """A passing kernel's fraction of speed-of-light (docs/verifier.md): ``45%``; ``—``
    where it was not counted."""
    return f"{fraction:.0%}" if isinstance(fraction, int | float) else "—"


def seconds(value: float | None) -> str:
    if value is None:
        return "—"
    if value < 120:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    return (
        f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"
    )


def clock(at: float | None) -> str:
    """A recorded time, in UTC (the log's times are Unix times)."""
    if not at:
        return "—"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + " UTC"


def ticking(since: float) -> str:
    """Seconds since ``since``, counted on in the browser between updates."""
    return f'<span class="since" data-since="{since:.3f}">{seconds(time.time() - since)}</span>'


def version_of(fragment: str) -> str:
    """What a live stream compares to know whether a page changed."""
    return hashlib.blake2b(fragment.encode(), digest_size=8).hexdigest()


NAV = (("tasks", "/"), ("run", "/run"))


def page(title: str, fragment: str, *, stream: str, where: str, active: str = "") -> str:
    """A whole page: ``fragment`` in the live region that ``stream`` (a server-sent event
    source) replaces as the log moves. ``where`` says what the dashboard reads (never
    with credentials)."""
    nav = " ".join(
        f'<a href="{url}" class="{"active" if name == active else ""}">{name}</a>'
        for name, url in NAV
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · kernelflow</title>
<link rel="stylesheet" href="/static/ui.css">
<script src="/static/ui.js" defer></script>
</head><body data-now="{time.time():.3f}">
<header><a class="brand" href="/">kernelflow</a><nav>{nav}</nav>
<span id="conn" class="conn">connecting…</span></header>
<main><div id="live" data-stream="{esc(stream)}" data-version="{version_of(fragment)}">
{fragment}
</div></main>
<footer>{esc(where)}</footer>
</body></html>
"""


def problem_page(title: str, text: str, where: str) -> str:
    """A page that says why there is nothing to show (no live region)."""
    return page(title, f'<p class="problem">{esc(text)}</p>', stream="", where=where)
