"""Rewards from the verifier pool: a trainer's process asks the daemons' verifiers over
NATS and awaits the verdict (docs/verl.md, "Rewards from the verifier pool").

A :class:`RewardClient` holds one connection (the NATS of its settings: ``KF_NATS_URL``,
or the embedded server of the data dir, with its keys) and any number of requests in
flight, at most ``max_in_flight`` at once (the rest wait their turn: backpressure on the
trainer, not on the pool). A request is a task (:mod:`.request`): already judged, it is
answered from the log; being judged for another client, it is waited for; else it is
submitted and followed until its reward is recorded. A client that goes away leaves
nothing half done behind: the task is the daemons' and finishes without it, and whoever
asks again is answered from the log.

Before the first request for a backend, the client asks the daemons who runs: no daemon,
no conductor, or no verifier that offers the backend is one clear error
(:class:`NoVerifierPool`), not a wait to the deadline.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.connection import safe_url
from kernelflow.actors.health_pings import ping_daemons
from kernelflow.events import subjects
from kernelflow.events.model import Event
from kernelflow.host.runtime import connected, request_reply
from kernelflow.host.settings import Settings
from kernelflow.projections.task_state import fold
from kernelflow.rewards.request import RewardAnswer, RewardRequest, RewardUnjudged, answer_of
from kernelflow.rollout import rollout_complete

__all__ = [
    "DEFAULT_DEADLINE_S",
    "DEFAULT_MAX_IN_FLIGHT",
    "NoVerifierPool",
    "RewardClient",
    "RewardTimeout",
    "shared_client",
]

DEFAULT_MAX_IN_FLIGHT = 64
DEFAULT_DEADLINE_S = 900.0
# How long the daemons' answers are collected, how many times an empty round is asked
# again (a daemon starting), and how long a pool that answered is taken as up.
_PING_WINDOW_S = 0.3
_PING_ROUNDS = 5
_POOL_SEEN_S = 30.0
_SUBMIT_ANSWER_S = 30.0


class NoVerifierPool(RewardUnjudged):
    """No daemon can judge the request: none answers, none hosts a conductor, or no
    verifier offers the backend."""


class RewardTimeout(RewardUnjudged):
    """No reward within the client's deadline."""


class RewardClient:
    """Scores :class:`RewardRequest` s on the verifier pool of ``settings``' NATS."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        deadline_s: float = DEFAULT_DEADLINE_S,
        requester: str | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if deadline_s <= 0:
            raise ValueError("deadline_s must be positive")
        self.settings = settings or Settings()
        self.max_in_flight = max_in_flight
        self.deadline_s = deadline_s
        self.requester = requester or f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self._stack = contextlib.ExitStack()
        self._bridge: Bridge | None = None
        self._slots: asyncio.Semaphore | None = None  # made on the bridge loop
        self._pool_seen: dict[str, float] = {}  # backend -> when a verifier offered it

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Bridge:
        """Connect (once; the first request does it too). Raises what connecting raises."""
        with self._lock:
            if self._bridge is None:
                self._bridge = self._stack.enter_context(connected(self.settings))
            return self._bridge

    def close(self) -> None:
        with self._lock:
            self._bridge = None
            self._slots = None
            self._stack.close()

    def __enter__(self) -> RewardClient:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ scoring

    async def score(self, request: RewardRequest) -> RewardAnswer:
        """The reward of ``request``, awaited on the caller's loop (the NATS work runs on
        the client's own). Raises RewardUnjudged (NoVerifierPool, RewardTimeout)."""
        bridge = self._bridge
        if bridge is None:
            bridge = await asyncio.to_thread(self.start)
        return await asyncio.wrap_future(bridge.spawn(self._score(bridge, request)))

    def score_sync(self, request: RewardRequest) -> RewardAnswer:
        """:meth:`score` for a caller without an event loop."""
        bridge = self.start()
        return bridge.spawn(self._score(bridge, request)).result()

    async def score_many(self, requests: Sequence[RewardRequest]) -> list[RewardAnswer]:
        """Every request's reward, in order (at most ``max_in_flight`` at once)."""
        return list(await asyncio.gather(*(self.score(r) for r in requests)))

    async def _score(self, bridge: Bridge, request: RewardRequest) -> RewardAnswer:
        """On the bridge loop."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_in_flight)
        async with self._slots:
            task_id = request.task_id()
            events = list((await bridge.log.read_task(task_id)).events)
            if events and rollout_complete(fold(task_id, events)):
                return answer_of(request, events, from_log=True)
            if not events:
                await self._check_pool(bridge, request.backend)
                command = request.command(requester=self.requester, deadline_s=self.deadline_s)
                reply = await request_reply(bridge, command, subjects.SUBMIT, _SUBMIT_ANSWER_S)
                if reply is None:  # no conductor took it: the pool seen a moment ago is gone?
                    self._pool_seen.pop(request.backend, None)
                    await self._check_pool(bridge, request.backend)
                elif not reply.get("ok"):
                    raise RewardUnjudged(f"task {task_id} refused: {reply.get('error')}")
            try:
                events = await asyncio.wait_for(_until_rewarded(bridge, task_id), self.deadline_s)
            except TimeoutError:
                raise RewardTimeout(
                    f"no reward for task {task_id} within {self.deadline_s:g}s (kernelflow "
                    "status shows where it is; more verifiers, or a longer deadline_s)"
                ) from None
            return answer_of(request, events, from_log=False)

    async def _check_pool(self, bridge: Bridge, backend: str) -> None:
        """Raise NoVerifierPool unless a daemon hosts a conductor and a verifier that
        offers ``backend`` (or one still warming up, which will say what it offers)."""
        seen = self._pool_seen.get(backend)
        if seen is not None and time.monotonic() - seen < _POOL_SEEN_S:
            return
        where = safe_url(self.settings.nats_url) if self.settings.nats_url else "the embedded NATS"
        answers: list[dict[str, Any]] = []
        for _ in range(_PING_ROUNDS):
            answers = await ping_daemons(bridge.requests, _PING_WINDOW_S)
            if answers:
                break
        if not answers:
            raise NoVerifierPool(
                f"no kernelflow daemon answers on {where}: start one "
                "(kernelflow daemon --roles conductor,verifier)"
            )
        roles = {r for a in answers for r in a.get("roles") or ()}
        missing = [r for r in ("conductor", "verifier") if r not in roles]
        if missing:
            raise NoVerifierPool(
                f"no daemon on {where} hosts a {' or a '.join(missing)} (running: "
                f"{', '.join(sorted(roles)) or 'nothing'}); reward requests need both"
            )
        verifiers = [v for a in answers for v in (a.get("verifier") or {}).values()]
        ready = [v for v in verifiers if "backends" in v]
        offered = sorted({str(b) for v in ready for b in v["backends"]})
        if len(ready) == len(verifiers) and backend not in offered:
            raise NoVerifierPool(
                f"no verifier on {where} offers backend {backend!r} (offered: "
                f"{', '.join(offered) or 'none'})"
            )
        self._pool_seen[backend] = time.monotonic()


async def _until_rewarded(bridge: Bridge, task_id: str) -> list[Event]:
    """The task's events once it is over and its rewards are recorded."""
    while True:
        events: list[Event] = []
        reading = bridge.log.read(start_seq=1, subject=subjects.task_events(task_id), follow=True)
        try:
            async with contextlib.aclosing(reading):
                async for _, event in reading:
                    events.append(event)
                    if rollout_complete(fold(task_id, events)):
                        return events
        except TimeoutError:
            continue  # a loaded server answered late: read it again


# --------------------------------------------------------------------------- shared


_SHARED: dict[tuple[object, ...], RewardClient] = {}
_SHARED_LOCK = threading.Lock()


def shared_client(
    *, max_in_flight: int | None = None, deadline_s: float | None = None
) -> RewardClient:
    """This process's client for the settings of its environment (one per NATS and data
    dir; closed when the process exits): what ``compute_score_async`` uses. The first
    call's ``max_in_flight`` and ``deadline_s`` (or ``KF_REWARD_MAX_IN_FLIGHT`` and
    ``KF_REWARD_DEADLINE``) are the client's."""
    settings = Settings()
    key = (settings.nats_url, str(settings.data_dir), str(settings.nats_creds))
    with _SHARED_LOCK:
        client = _SHARED.get(key)
        if client is None:
            client = RewardClient(
                settings,
                max_in_flight=max_in_flight or settings.reward_max_in_flight,
                deadline_s=deadline_s or settings.reward_deadline_s,
            )
            _SHARED[key] = client
            if len(_SHARED) == 1:
                atexit.register(close_shared_clients)
        return client


def close_shared_clients() -> None:
    """Close this process's shared clients (:func:`shared_client`) now rather than at its
    exit: a process that outlives the NATS its rewards came from (a notebook whose daemons
    stopped) then stops reconnecting to it. A later call makes a new one."""
    with _SHARED_LOCK:
        for client in _SHARED.values():
            client.close()
        _SHARED.clear()
