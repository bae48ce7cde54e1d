"""Daemon health: each daemon answers pings on ``kf.health.ping`` (core NATS, every daemon
answers) with who it is and what it hosts, and ``kernelflow health`` gathers the answers.

The answer is a JSON object: ``daemon_id``, ``host``, ``pid``, ``roles``, ``pools`` (actors
per role), ``started_at``, ``uptime_s``, ``nats_url`` (credentials removed), ``llm`` (the
provider and, per LLM agent, provider spec and model — never a key) and ``read_model``
(its position, when the daemon runs one).

A command's own daemon (``run``, ``rollout``, ``bench``, the ``Task`` API) serves only its
own tasks (``kernelflow.host.runtime.own_work``). It answers too, with ``own_tasks_only``
and, of the task ids a ping names (``{"tasks": [...]}``, at most ``ASKED_MAX``), the ones
it serves (``serving``): so ``status`` tells a task a command is running from one nobody
will take.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.connection import safe_url
from kernelflow.events import subjects
from kernelflow.events.requests import Request, RequestsPort, Serving

log = logging.getLogger("kernelflow.host.health")


def new_daemon_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def safe_spec(spec: str | None) -> str | None:
    """A provider spec fit to show: no user:password in a URL, no query string."""
    if not spec:
        return spec
    kind, _, rest = spec.partition(":")
    head, sep, model = rest.partition("#")
    if "://" in head:
        parts = urlsplit(head)
        host = parts.hostname or ""
        netloc = host + (f":{parts.port}" if parts.port else "")
        head = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    return f"{kind}:{head}{sep}{model}" if rest else kind


def llm_description(provider: object | None, agents: Iterable[str]) -> dict[str, Any]:
    """Which provider and model each agent would call, from a provider built by
    ``kernelflow.llm.make_provider`` (nothing is called). ``provider`` None: no LLM."""
    if provider is None:
        return {"provider": None, "spec": None, "agents": {}}
    config = getattr(provider, "config", None)
    default = getattr(config, "provider", None)
    out: dict[str, Any] = {
        "provider": (default or "").partition(":")[0] or getattr(provider, "name", None),
        "spec": safe_spec(default),
        "agents": {},
    }
    params_for = getattr(provider, "params_for", None)
    build = getattr(provider, "provider", None)
    for agent in agents:
        entry: dict[str, Any] = {}
        try:
            spec = params_for(agent)[0] if params_for else default
            entry["spec"] = safe_spec(spec)
            entry["provider"] = (spec or "").partition(":")[0] or None
            built = build(spec) if build and spec else None
            model = getattr(built, "model", None)
            inner = getattr(built, "inner", None)
            entry["model"] = model or getattr(inner, "model", None)
        except Exception as exc:  # a bad per-agent setting: say so, do not raise
            entry["error"] = str(exc)
        out["agents"][agent] = entry
    return out


def daemon_describer(
    daemon_id: str,
    nats_url: str,
    roles: Iterable[str],
    pools: dict[str, int],
    llm: object | None,
    read_model: Any = None,
    warm_ups: Any = None,
) -> Callable[[], dict[str, Any]]:
    """What a daemon says about itself; ``read_model`` (an ``kernelflow.actors.readmodel.ReadModel``
    or None) is asked for its position on every ping, ``warm_ups`` (the daemon's
    ``kernelflow.actors.verifier.WarmUps``, or None) for how ready its verifiers are."""
    roles = list(roles)
    static = {
        "daemon_id": daemon_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "roles": roles,
        "pools": pools,
        "nats_url": safe_url(nats_url),
        "llm": llm_description(llm, [r for r in roles if r != "verifier"]),
    }

    def describe() -> dict[str, Any]:
        return {
            **static,
            "read_model": read_model.describe() if read_model else None,
            "verifier": warm_ups.describe() if warm_ups is not None else None,
        }

    return describe


# The most task ids a ping names (its body stays far under NATS's payload limit).
ASKED_MAX = 2000


class HealthResponder:
    """Answers ``kf.health.ping`` on the bridge loop with ``describe()`` (which must be
    cheap: it runs on the loop) plus uptime; ``serves``: a command's own daemon's test of
    a task id (the module's docstring)."""

    def __init__(
        self,
        bridge: Bridge,
        describe: Callable[[], dict[str, Any]],
        serves: Callable[[str], bool] | None = None,
    ) -> None:
        self.bridge = bridge
        self._describe = describe
        self._serves = serves
        self._started = time.time()
        self._serving: Serving | None = None

    def start(self) -> HealthResponder:
        self._serving = self.bridge.call(
            self.bridge.requests.serve(subjects.HEALTH_PING, self._on_ping)
        )
        return self

    async def _on_ping(self, msg: Request) -> None:
        if not msg.reply_to:
            return
        if (why := subjects.reply_refusal(msg.reply_to)) is not None:
            # An answer there could land in the log, or be taken for an API request.
            log.warning("not answering a health ping: %s", why)
            return
        try:
            body = self._describe()
        except Exception as exc:  # still answer: a daemon that cannot describe itself
            body = {"error": repr(exc)}
        body |= {"started_at": self._started, "uptime_s": round(time.time() - self._started, 3)}
        if self._serves is not None:
            asked = _asked_tasks(msg.data)
            body |= {"own_tasks_only": True, "serving": [t for t in asked if self._serves(t)]}
        with contextlib.suppress(Exception):
            await msg.respond(json.dumps(body, default=str).encode())

    def stop(self) -> None:
        if self._serving is not None:
            with contextlib.suppress(Exception):
                self.bridge.call(self._serving.stop(), timeout=5)


def _asked_tasks(data: bytes) -> list[str]:
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        return []
    tasks = body.get("tasks") if isinstance(body, dict) else None
    if not isinstance(tasks, list):
        return []
    return [t for t in tasks[:ASKED_MAX] if isinstance(t, str)]


async def ping_daemons(
    requests: RequestsPort, window_s: float, tasks: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Every daemon's answer that arrives within ``window_s``; a command's own daemon says
    which of ``tasks`` it serves."""
    answers: list[dict[str, Any]] = []
    asked = json.dumps({"tasks": list(tasks)[:ASKED_MAX]}).encode()
    for data in await requests.gather(subjects.HEALTH_PING, asked, window_s):
        try:
            body = json.loads(data)
        except ValueError:
            log.warning("unreadable health answer")
            continue
        if isinstance(body, dict):
            answers.append(body)
    return sorted(answers, key=lambda a: str(a.get("daemon_id", "")))
