"""Rewards over HTTP (``kernelflow serve-rewards``; docs/verl.md, "Rewards over HTTP"): a
Starlette app in front of one :class:`~kernelflow.rewards.RewardClient`, so that trainers
which speak HTTP (OpenRLHF's ``--remote_rm_url``, slime's remote reward model, a program
of one's own) are scored by the verifier pool as ``compute_score_async`` is.

- ``POST /get_reward``: OpenRLHF's remote reward model. ``{"query": [...], "prompts":
  [...], "labels": [...]}`` (``query`` = prompt + response, ``labels`` = each task's
  reference source, the export's ``reward_model.ground_truth``) → ``{"rewards": [...],
  "scores": [...], "extra_logs": {...}}``, with the server's backend, policy and reward.
- ``POST /v1/reward``: one ``{"task", "response" | "code", "backend", "policy",
  "reward", "trials", "timeout_s"}`` → ``{"reward", "verdict", "correct", ...}``;
  ``POST /v1/rewards``: a list of them → a list.
- ``GET /healthz``: whether a pool answers (200) or why not (503); open without the token.

A response's code is read as ``compute_score`` reads it (a coder's answer: ``Final
Answer:``, a JSON ``code`` field, ``<code>`` tags, the last fenced block). Every request is
a task in the log, content-addressed: asked again (an HTTP client's retry, another
trainer), it is answered from the log. The client's ``max_in_flight`` bounds the
verifications in flight; requests beyond it wait.

Errors are one line of JSON, ``{"error": "..."}``: 400 for a request that cannot be used,
401 without the token, 413 for a body over ``MAX_BODY_BYTES``, 422 for a task the pool
judged unscorable (a reference that fails), 503 when the pool cannot judge (none answers,
no verifier for the backend, no reward within the deadline, NATS lost), 500 for a bug
(logged here, never shown).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelflow.actors.bridge import NatsUnreachable
from kernelflow.actors.connection import safe_url
from kernelflow.actors.health_pings import ping_daemons
from kernelflow.cli.http_access import OPEN_PATHS, TokenGate
from kernelflow.common.suggest import did_you_mean
from kernelflow.events.errors import TransportError
from kernelflow.projections.rewards import KERNEL_REWARDS, RewardFn, RewardInput
from kernelflow.rewards.client import NoVerifierPool, RewardClient, RewardTimeout

# The parsing a verl row's response gets (one reader of a coder's answer, not two).
from kernelflow.rewards.request import (
    RewardAnswer,
    RewardRequest,
    RewardUnjudged,
    code_in,
    kernel_reward,
)
from kernelflow.verification.backends import DEFAULT_BACKEND, backend_names
from kernelflow.verification.policy import DEFAULT_POLICY, UnknownPolicy, policy

__all__ = ["MAX_BATCH", "MAX_BODY_BYTES", "Defaults", "check_defaults", "create_app"]

log = logging.getLogger("kernelflow.cli.reward_server")

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_BATCH = 4096  # responses in one request
_HEALTH_CACHE_S = 1.0  # a probe's answer is shared for this long (each asks every daemon)
_PING_WINDOW_S = 0.3
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
# /v1/reward's fields; "label" and "prompt" are slime's remote reward model's names
# (``--rm-type remote_rm`` posts {"prompt", "response", "label"}).
_FIELDS = (
    "task",
    "response",
    "code",
    "backend",
    "policy",
    "reward",
    "trials",
    "timeout_s",
    "label",
    "prompt",
)


@dataclass(frozen=True)
class Defaults:
    """What a request that does not say gets (OpenRLHF's never says): the server's
    ``--backend``, ``--policy``, ``--reward``, ``--trials`` and ``--timeout``. ``trials``
    and ``timeout_s`` are ``compute_score``'s defaults, so the same response asked through
    verl or over HTTP is one task."""

    backend: str = DEFAULT_BACKEND
    policy: str = DEFAULT_POLICY
    reward: str = KERNEL_REWARDS[0]
    trials: int = 3
    timeout_s: float = 300.0


class _Refused(ValueError):
    """A request answered with ``status`` and one line saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def check_defaults(defaults: Defaults) -> None:
    """Raise ValueError (one line) where a default cannot be used."""
    _checked_backend(defaults.backend, "--backend")
    _checked_policy(defaults.policy, "--policy")
    _reward_fn(defaults.reward, "--reward")
    _checked_trials(defaults.trials, "--trials")
    _checked_timeout(defaults.timeout_s, "--timeout")


# --------------------------------------------------------------------------- the app


def create_app(
    client: RewardClient, defaults: Defaults | None = None, token: str | None = None
) -> ASGIApp:
    """The reward endpoints over ``client`` (shared by every request); with ``token``,
    only for requests that send ``Authorization: Bearer <token>`` (``/healthz`` is open)."""
    service = _Service(client, defaults or Defaults())
    routes = [
        Route("/get_reward", _answering(service.get_reward), methods=["POST"]),
        Route("/v1/reward", _answering(service.reward), methods=["POST"]),
        Route("/v1/rewards", _answering(service.rewards), methods=["POST"]),
        Route("/healthz", _answering(service.healthz), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error})
    return app if token is None else _BearerGate(app, token, "kernelflow serve-rewards")


class _BearerGate(TokenGate):
    """The dashboard's token check for programs: ``Authorization: Bearer`` only (no
    sign-in by ``?token=``, no cookie); anything else gets a JSON 401."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("path", "") in OPEN_PATHS
            or self._allowed(Request(scope))
        ):
            await self.app(scope, receive, send)
        else:
            refused = _error(401, "this reward server needs its token: send Authorization: Bearer")
            refused.headers["WWW-Authenticate"] = 'Bearer realm="kernelflow serve-rewards"'
            await refused(scope, receive, send)

    def _allowed(self, request: Request) -> bool:
        scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self._is_token(credentials.strip())


class _Service:
    def __init__(self, client: RewardClient, defaults: Defaults) -> None:
        self.client = client
        self.defaults = defaults
        self._health: tuple[float, int, dict[str, Any]] | None = None
        self._health_lock = asyncio.Lock()

    # ------------------------------------------------------------------ OpenRLHF

    async def get_reward(self, request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise _Refused(400, 'expected a JSON object {"query": [...], "prompts": [...], ...}')
        queries = _strings(body, "query")
        prompts = _strings(body, "prompts", len(queries), required=False)
        labels = _strings(body, "labels", len(queries), missing=_NO_LABELS)
        items = []
        for n, query in enumerate(queries):
            response = _response_of(query, prompts[n] if prompts else None)
            where = f"query[{n}]"
            items.append(_item(labels[n], response, None, self.defaults, where))
        answers = await self._scored(items)
        rewards = [a["reward"] for a in answers]
        return _json(
            {
                "rewards": rewards,
                # OpenRLHF filters on scores in [0, 1]: whether each was correct.
                "scores": [1.0 if a["correct"] else 0.0 for a in answers],
                "extra_logs": {
                    "correct": [1.0 if a["correct"] else 0.0 for a in answers],
                    "from_log": [1.0 if a["from_log"] else 0.0 for a in answers],
                },
            }
        )

    # ------------------------------------------------------------------ plain JSON

    async def reward(self, request: Request) -> Response:
        item = self._request_item(await _json_body(request), "")
        return _json((await self._scored([item]))[0])

    async def rewards(self, request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, list):
            raise _Refused(400, "expected a JSON list of reward requests")
        if len(body) > MAX_BATCH:
            raise _Refused(400, f"{len(body)} requests: at most {MAX_BATCH} in one")
        items = [self._request_item(entry, f"request[{n}]") for n, entry in enumerate(body)]
        return _json(await self._scored(items))

    def _request_item(self, body: object, where: str) -> _Item:
        if not isinstance(body, dict):
            raise _Refused(400, _at(where, "expected a JSON object with task and response"))
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            known = ", ".join(_FIELDS[:8])
            guess = did_you_mean(unknown[0], _FIELDS)
            raise _Refused(400, _at(where, f"unknown field {unknown[0]!r}{guess} (known: {known})"))
        if "task" in body and "label" in body:
            raise _Refused(400, _at(where, "task and label are the same field: send one"))
        task = _field(body, "label" if "label" in body else "task", str, where)
        if ("response" in body) == ("code" in body):
            raise _Refused(
                400, _at(where, "send response (text to read the code from) or code, not both")
            )
        code_given = "code" in body
        text = _field(body, "code" if code_given else "response", str, where)
        d = self.defaults
        asked = Defaults(
            backend=_field(body, "backend", str, where, d.backend),
            policy=_field(body, "policy", str, where, d.policy),
            reward=_field(body, "reward", str, where, d.reward),
            trials=_field(body, "trials", int, where, d.trials),
            timeout_s=_field(body, "timeout_s", float, where, d.timeout_s),
        )
        return _item(task, None if code_given else text, text if code_given else None, asked, where)

    # ------------------------------------------------------------------ scoring

    async def _scored(self, items: Sequence[_Item]) -> list[dict[str, Any]]:
        """Every item's answer, in order; a failure of any answers the whole request."""
        results = await asyncio.gather(*(self._score(i) for i in items), return_exceptions=True)
        failures = [
            (*_failure(r), n) for n, r in enumerate(results) if isinstance(r, BaseException)
        ]
        if failures:
            # The pool's own trouble first: it is every item's, not one item's.
            status, message, n = min(failures, key=lambda f: (f[0] != 503, f[2]))
            if status == 422:
                message = _at(items[n].where, message)
            raise _Refused(status, message)
        return [r for r in results if isinstance(r, dict)]

    async def _score(self, item: _Item) -> dict[str, Any]:
        if item.request is None:  # no code in the response: scored as a failed task
            inputs = RewardInput(status="failed")
            return _answer(item.fn(inputs), "no_code", correct=False, reward_fn=item.fn.key)
        answer: RewardAnswer = await self.client.score(item.request)
        return _answer(
            answer.score,
            answer.verdict,
            correct=answer.correct,
            task_id=answer.task_id,
            from_log=answer.from_log,
            speedup=answer.speedup,
            speedup_conclusive=answer.speedup_conclusive,
            reward_fn=answer.reward_fn,
            summary=answer.summary,
        )

    # ------------------------------------------------------------------ health

    async def healthz(self, _: Request) -> Response:
        async with self._health_lock:
            cached = self._health
            if cached is None or time.monotonic() - cached[0] > _HEALTH_CACHE_S:
                status, body = await self._pool_status()
                cached = self._health = (time.monotonic(), status, body)
        return _json(cached[2], cached[1])

    async def _pool_status(self) -> tuple[int, dict[str, Any]]:
        """200 and what answers where a conductor and a verifier offering the default
        backend answer; 503 and why not otherwise."""
        settings = self.client.settings
        where = safe_url(settings.nats_url) if settings.nats_url else "the embedded NATS"
        try:
            bridge = await asyncio.to_thread(self.client.start)
            pinging = ping_daemons(bridge.requests, _PING_WINDOW_S)
            answers = await asyncio.wrap_future(bridge.spawn(pinging))
        except (NatsUnreachable, TransportError, OSError) as exc:
            return 503, {"ok": False, "error": _one_line(f"NATS at {where}: {exc}")}
        roles = sorted({str(r) for a in answers for r in a.get("roles") or ()})
        # Each daemon's verifiers, by device (warming up: no backends yet).
        verifiers = [v for a in answers for v in (a.get("verifier") or {}).values()]
        offered = sorted({str(b) for v in verifiers for b in v.get("backends") or ()})
        body: dict[str, Any] = {
            "ok": False,
            "daemons": len(answers),
            "verifier_devices": len(verifiers),
            "backends": offered,
            "backend": self.defaults.backend,
        }
        missing = [r for r in ("conductor", "verifier") if r not in roles]
        warming = any("backends" not in v for v in verifiers)
        if not answers:
            body["error"] = f"no kernelflow daemon answers on {where}"
        elif missing:
            body["error"] = f"no daemon on {where} hosts a {' or a '.join(missing)}"
        elif self.defaults.backend not in offered and not warming:
            body["error"] = f"no verifier on {where} offers backend {self.defaults.backend!r}"
        else:
            body["ok"] = True
        return (200 if body["ok"] else 503), body


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class _Item:
    """One response to score: its request (None: the response holds no code), the reward
    function that scores it, and where it is in the HTTP request (for errors)."""

    request: RewardRequest | None
    fn: RewardFn
    where: str


def _item(
    task: str,
    response: str | None,
    code: str | None,
    asked: Defaults,
    where: str,
) -> _Item:
    """The item for ``task`` and a ``response`` to read the code from (or the ``code``),
    with the backend, policy, reward function and limits ``asked``."""
    if not task.strip():
        raise _Refused(400, _at(where, "the task (its reference source) is empty"))
    backend = _checked_backend(asked.backend, _at(where, "backend"))
    policy_name = _checked_policy(asked.policy, _at(where, "policy"))
    trials = _checked_trials(asked.trials, _at(where, "trials"))
    timeout_s = _checked_timeout(asked.timeout_s, _at(where, "timeout_s"))
    fn, parsed = _reward_fn(asked.reward, _at(where, "reward"), response or "")
    code = code if code is not None else parsed
    if code is None:
        return _Item(None, fn, where)
    request = RewardRequest(
        task_source=task,
        code=code,
        backend=backend,
        policy=policy_name,
        reward_fn=fn.key,
        trials=trials,
        timeout_s=timeout_s,
    )
    return _Item(request, fn, where)


def _reward_fn(name: str, what: str, response: str = "") -> tuple[RewardFn, str | None]:
    """The kernel reward ``name`` and the code ``response`` holds (None: none), read as
    ``compute_score`` reads a response."""
    try:
        return kernel_reward(name), code_in(response)
    except ValueError as exc:  # UnknownReward, or a reward that does not score kernels
        raise _Refused(400, f"{what}: {exc}") from None


def _checked_backend(name: str, what: str) -> str:
    known = backend_names()
    if name not in known:
        raise _Refused(400, f"{what} {name!r} is not one of {', '.join(known)}")
    return name


def _checked_policy(name: str, what: str) -> str:
    try:
        return policy(name).name
    except UnknownPolicy as exc:
        raise _Refused(400, f"{what}: {exc}") from None


def _checked_trials(trials: int, what: str) -> int:
    if not 1 <= trials <= 100:
        raise _Refused(400, f"{what} {trials}: expected 1 to 100")
    return trials


def _checked_timeout(timeout_s: float, what: str) -> float:
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= 3600):
        raise _Refused(400, f"{what} {timeout_s:g}: expected seconds in (0, 3600]")
    return timeout_s


_NO_LABELS = (
    "labels are each response's task, its reference source (OpenRLHF: --label_key naming "
    "the column that holds the export's reward_model.ground_truth)"
)


def _strings(
    body: dict[str, Any],
    name: str,
    length: int | None = None,
    *,
    required: bool = True,
    missing: str = "",
) -> list[str]:
    """``body[name]``, a list of strings (of ``length`` where given); [] where it is
    absent or null and not ``required``."""
    value = body.get(name)
    if value is None:
        if not required:
            return []
        raise _Refused(400, f"missing field {name!r}" + (f": {missing}" if missing else ""))
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _Refused(400, f"{name}: expected a list of strings")
    if length is not None and len(value) != length:
        raise _Refused(400, f"{name}: {len(value)} items for {length} queries")
    if len(value) > MAX_BATCH:
        raise _Refused(400, f"{name}: {len(value)} items: at most {MAX_BATCH} in one request")
    return value


def _field(body: dict[str, Any], name: str, kind: type, where: str, default: Any = None) -> Any:
    """``body[name]`` as a ``kind`` (str, int, float); ``default`` where it is absent or
    null, a 400 where that is None too or the value is not a ``kind``."""
    value = body.get(name)
    if value is None:
        if default is None:
            raise _Refused(400, _at(where, f"missing field {name!r}"))
        return default
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise _Refused(400, _at(where, f"{name} must be {_KIND_NAMES[kind]}"))
    return value


def _at(where: str, text: str) -> str:
    """``text`` about the item at ``where`` (nothing: the request is the one item)."""
    return f"{where}: {text}" if where else text


_KIND_NAMES = {str: "a string", int: "a whole number", float: "a number"}


def _response_of(query: str, prompt: str | None) -> str:
    """The response in OpenRLHF's ``query`` (the prompt, then the response): what follows
    the prompt, or the whole query where the prompt is not in it."""
    if not prompt:
        return query
    if query.startswith(prompt):
        return query[len(prompt) :]
    at = query.rfind(prompt)
    return query[at + len(prompt) :] if at >= 0 else query


async def _json_body(request: Request) -> Any:
    size, chunks = 0, []
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _Refused(413, f"the body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB")
        chunks.append(chunk)
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from None


# --------------------------------------------------------------------------- answers


def _answer(
    reward: float,
    verdict: str,
    *,
    correct: bool,
    task_id: str | None = None,
    from_log: bool = False,
    speedup: float | None = None,
    speedup_conclusive: bool | None = None,
    reward_fn: str = "",
    summary: str = "",
) -> dict[str, Any]:
    return {
        "reward": reward,
        "verdict": verdict,
        "correct": correct,
        "task_id": task_id,
        "from_log": from_log,
        "speedup": speedup,
        "speedup_conclusive": speedup_conclusive,
        "reward_fn": reward_fn,
        "summary": summary,
    }


def _failure(exc: BaseException) -> tuple[int, str]:
    """The status and the line a failed scoring is answered with."""
    if isinstance(exc, _Refused):
        return exc.status, str(exc)
    if isinstance(exc, NoVerifierPool | RewardTimeout):
        return 503, _one_line(str(exc))
    if isinstance(exc, RewardUnjudged):
        return 422, _one_line(str(exc))
    if isinstance(exc, asyncio.CancelledError):  # the client closing: the server stops
        return 503, "the reward server is stopping: ask again"
    if isinstance(exc, NatsUnreachable | TransportError | ConnectionError):
        return 503, _one_line(f"NATS failed before the reward was read: {exc}")
    log.error("a reward request failed", exc_info=exc)
    return 500, "internal error (the server's log says what)"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _json(body: Any, status: int = 200) -> Response:
    text = json.dumps(_finite(body), allow_nan=False, separators=(",", ":"))
    return Response(text, status, headers=_HEADERS, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": _one_line(message)}, status)


def _answering(
    handler: Callable[[Request], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """``handler``, its refusals and failures answered as one JSON line (never a
    traceback)."""

    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except _Refused as exc:
            return _error(exc.status, str(exc))
        except Exception as exc:  # answered; logged where it is a bug
            return _error(*_failure(exc))

    return answer


async def _http_error(_: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such path, a method a path does not take)."""
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, str(exc.detail))
