"""Asking a daemon's read model for ``kernelflow status``: the protocol on
``kf.query.status``, which both sides use, and the asker's side (``query_status``), which
``kernelflow status`` and the dashboard use. The answering side, the read model that folds
the log in a daemon, is ``kernelflow.actors.readmodel``; nothing here imports it.

A query (``StatusQuery``, JSON) may name a stream sequence (``after``): the answer waits
(up to ``wait_s``) until the fold has applied it, so ``kernelflow status`` sees everything
recorded before it asked. A reply carries at most ``limit`` rows (``PAGE`` at most;
``offset`` pages through the rest), in the order tasks first appeared in the log, which is
the same in every daemon's read model; a row is ``status_row``'s, which is also what a
caller that folds the log itself shows (``status_rows``) when no read model answers.

It lives beside the read model, in ``actors``, because the read model imports the protocol
and may import nothing above its layer; the commands and the dashboard import this module,
never the read model.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from kernelflow.events import subjects
from kernelflow.events.port import EventLogPort
from kernelflow.events.requests import NoResponders, RequestsPort
from kernelflow.projections.metrics import MetricsProjection, TaskMetrics

PAGE = 1000  # rows per reply: well under the 1 MiB NATS message limit
MAX_REASON = 300


class StatusQuery(msgspec.Struct, frozen=True):
    """A query on ``kf.query.status`` (JSON; every field may be left out)."""

    after: int = 0  # answer once the fold applied this stream sequence...
    wait_s: float = 5.0  # ...waiting at most this long for it (at most 30 s)
    offset: int = 0
    limit: int = PAGE
    task_id: str | None = None  # one task's row instead of a page of all


def status_row(t: TaskMetrics) -> dict[str, Any]:
    """A task's line in ``kernelflow status``: the keys of the CLI's one-task summary,
    without the final code (``kernelflow status TASK`` shows it)."""
    reason = t.reason if t.ended else None
    if reason is not None and len(reason) > MAX_REASON:
        reason = reason[: MAX_REASON - 1] + "…"
    return {
        "task_id": t.task_id,
        "status": t.status,
        "steps": t.steps,
        "verdict": t.final_verdict,
        "speedup": t.final_speedup,
        "speedup_conclusive": t.final_conclusive if t.final_speedup is not None else None,
        "speedup_ci95": list(t.final_speedup_ci95) if t.final_speedup is not None else [],
        "sol_fraction": t.final_sol_fraction if t.final_verdict == "pass" else None,
        "reason": reason,
        "verifications": list(t.verdicts),
        "rechecks": [{"verifier_version": v, "verdict": verdict} for v, verdict, *_ in t.revisions],
        "events": t.events,
        "forked_from": {"task_id": t.forked_from, "at": t.fork_at} if t.forked_from else None,
    }


def status_rows(projection: MetricsProjection) -> list[dict[str, Any]]:
    return [status_row(t) for t in projection.tasks.values()]


# --------------------------------------------------------------------------- the asker


@dataclass(frozen=True)
class StatusAnswer:
    rows: list[dict[str, Any]]
    instance: str
    position: int


class NoAnswer(Exception):
    """No read model could answer (none running, or none caught up in time): why."""


async def query_status(
    requests: RequestsPort,
    event_log: EventLogPort,
    wait_s: float = 5.0,
    on_catching_up: Callable[[str, int, int], None] | None = None,
) -> StatusAnswer:
    """Every task's status row from a daemon's read model, as of (at least) the end of the
    log when asked. A read model still catching up (a daemon just restarted after the log
    grew) is waited for as long as it moves, ``wait_s`` at a time: reading the log here
    instead would start from its first event. ``on_catching_up(instance, position,
    end)`` hears of each wait. Raises NoAnswer."""
    after = await event_log.end_seq()
    rows: list[dict[str, Any]] = []
    instance, position = "", 0
    behind_at: dict[str, int] = {}  # instance → where it was when last found behind
    while True:
        query = {"after": after, "wait_s": wait_s, "offset": len(rows), "limit": PAGE}
        try:
            data = await requests.ask(
                subjects.STATUS_QUERY, json.dumps(query).encode(), timeout_s=wait_s + 5.0
            )
        except NoResponders:
            raise NoAnswer("no daemon runs a read model") from None
        except TimeoutError:
            raise NoAnswer(f"no read model answered within {wait_s + 5.0:g}s") from None
        body = json.loads(data)
        if not body.get("ok"):
            raise NoAnswer(f"the read model refused the query: {body.get('error')}")
        if body.get("behind"):
            who, at = str(body.get("instance")), int(body.get("position", 0))
            if at <= behind_at.get(who, -1):
                raise NoAnswer(
                    f"the read model of {who} is catching up but did not move in "
                    f"{wait_s:g}s (at {at} of {after})"
                )
            behind_at[who] = at
            if on_catching_up is not None:
                on_catching_up(who, at, after)
            continue  # the same page again
        instance, position = body["instance"], max(position, int(body["position"]))
        page = body.get("rows") or []
        rows.extend(page)
        if not page or len(rows) >= int(body.get("total", 0)):
            return StatusAnswer(rows, instance, position)
