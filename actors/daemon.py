"""The daemon: pools of actors per role, each fed by a durable JetStream consumer.

Work reaches actors only through the log: the conductor's pool consumes commands and the
events that call for a decision; each agent pool consumes the dispatches for its agent.
A pump fetches only as many messages as its pool has idle actors (backpressure), keeps
them "in progress" while an actor works, and acks them when the actor is done. A daemon
that dies leaves its messages unacked: JetStream redelivers them after ``ack_wait`` to
whichever daemon is consuming, and the log tells that daemon how far the work got.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pykka
from nats.aio.msg import Msg
from nats.js import api

from actors.agents import LLMAgent
from actors.bridge import Bridge
from actors.conductor import Conductor
from actors.llm.base import LLMProvider
from actors.pull import CreditPuller
from actors.verifier.actor import Verifier
from actors.verifier.engine import VerifierConfig
from actors.worker import Delivery, Job, Settlement, Source
from events import subjects
from workflows.model import VERIFIER

log = logging.getLogger("kernelflow.daemon")
ActorRef = pykka.ActorRef[Any]  # refs are invariant in the actor type; pools mix kinds

CONDUCTOR_ROLE = "conductor"
DEFAULT_ROLES = (CONDUCTOR_ROLE, "designer", "coder", VERIFIER)


@dataclass
class DaemonConfig:
    roles: tuple[str, ...] = DEFAULT_ROLES
    # Actors per role. The verifier defaults to one: it owns the (single) GPU.
    pool_sizes: dict[str, int] = field(default_factory=dict)
    default_pool_size: int = 4
    # Redelivery delay for work a dead daemon left behind; live work is kept alive by
    # "in progress" heartbeats, so this can be short.
    ack_wait_s: float = 30.0
    llm: LLMProvider | None = None
    max_deliveries: int = 20
    # How long stop() lets actors finish the job they hold.
    stop_timeout_s: float = 30.0
    verifier: VerifierConfig = field(default_factory=VerifierConfig)

    def pool_size(self, role: str) -> int:
        default = 1 if role == VERIFIER else self.default_pool_size
        return self.pool_sizes.get(role, default)


@dataclass(frozen=True)
class _Feed:
    role: str
    stream: str
    durable: str
    filters: list[str]
    source: Source


@dataclass
class _Pool:
    role: str
    actors: list[ActorRef]
    idle: asyncio.Queue[ActorRef]
    puller: CreditPuller | None = None


class Daemon:
    def __init__(self, bridge: Bridge, config: DaemonConfig) -> None:
        self.bridge = bridge
        self.config = config
        self._pools: dict[str, _Pool] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Daemon:
        for feed in self._feeds():
            make = self._factory(feed.role)
            actors = [make() for _ in range(self.config.pool_size(feed.role))]
            self._pools[feed.durable] = _Pool(feed.role, actors, asyncio.Queue())
        self.bridge.call(self._start_pumps())
        log.info(
            "daemon started: %s",
            ", ".join(f"{name} x{len(p.actors)}" for name, p in self._pools.items()),
        )
        return self

    def _feeds(self) -> list[_Feed]:
        """The durable consumers this daemon reads. Each gets its own actor pool, so a
        busy feed can never starve another of actors."""
        feeds = []
        for role in self.config.roles:
            if role == CONDUCTOR_ROLE:
                feeds.append(
                    _Feed(
                        role,
                        subjects.COMMANDS_STREAM,
                        "kf-conductor-commands",
                        [subjects.ALL_COMMANDS],
                        "command",
                    )
                )
                feeds.append(
                    _Feed(
                        role,
                        subjects.EVENTS_STREAM,
                        "kf-conductor",
                        subjects.decision_triggers(),
                        "event",
                    )
                )
            else:
                feeds.append(
                    _Feed(
                        role,
                        subjects.EVENTS_STREAM,
                        f"kf-agent-{role}",
                        [subjects.dispatches_for(role)],
                        "event",
                    )
                )
        return feeds

    def _factory(self, role: str) -> Callable[[], ActorRef]:
        bridge, config = self.bridge, self.config
        if role == CONDUCTOR_ROLE:
            return lambda: Conductor.start(bridge, config.llm)
        if role == VERIFIER:
            return lambda: Verifier.start(bridge, config.verifier)
        if config.llm is None:
            raise ValueError(f"role {role!r} is an LLM agent and needs an LLM provider (--llm)")
        llm = config.llm
        return lambda: LLMAgent.start(bridge, role, llm)

    async def _start_pumps(self) -> None:
        for feed in self._feeds():
            pool = self._pools[feed.durable]
            for actor in pool.actors:
                pool.idle.put_nowait(actor)
            await self._pump(pool, feed)

    async def _pump(self, pool: _Pool, feed: _Feed) -> None:
        js = self.bridge.log.jetstream
        await js.add_consumer(
            feed.stream,
            api.ConsumerConfig(
                durable_name=feed.durable,
                filter_subjects=feed.filters,
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=self.config.ack_wait_s,
                # A message that keeps failing (or keeps killing its daemon) is given up
                # after this many deliveries rather than retried forever.
                max_deliver=self.config.max_deliveries,
                deliver_policy=api.DeliverPolicy.ALL,
            ),
        )

        def deliver(msg: Msg) -> None:
            if pool.idle.empty():
                # More than was asked for (a late answer to a request given up on after a
                # reconnect): let JetStream deliver it again shortly.
                self._in_background(msg.nak(delay=1.0))
                return
            self._hand_over(pool, pool.idle.get_nowait(), msg, feed.source)

        pool.puller = CreditPuller(
            self.bridge.nc, feed.stream, feed.durable, credit=pool.idle.qsize, deliver=deliver
        )
        self._pumps.append(asyncio.create_task(pool.puller.run(), name=feed.durable))

    def _hand_over(self, pool: _Pool, actor: ActorRef, msg: Msg, source: Source) -> None:
        job = Job(
            source=source,
            subject=msg.subject,
            data=msg.data,
            headers=dict(msg.headers or {}),
            stream_seq=msg.metadata.sequence.stream,
            deliveries=msg.metadata.num_delivered,
        )
        heartbeat = self._in_background(self._keep_in_progress(msg))
        loop = self.bridge.loop

        def settle(how: Settlement) -> None:  # called on the actor's thread
            loop.call_soon_threadsafe(
                lambda: loop.create_task(self._settle(pool, actor, msg, heartbeat, how))
            )

        actor.tell(Delivery(job, settle))

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)
        return task

    async def _keep_in_progress(self, msg: Msg) -> None:
        while True:
            await asyncio.sleep(self.config.ack_wait_s / 3)
            with contextlib.suppress(Exception):
                await msg.in_progress()

    async def _settle(
        self, pool: _Pool, actor: ActorRef, msg: Msg, heartbeat: asyncio.Task[None], how: Settlement
    ) -> None:
        heartbeat.cancel()
        try:
            if how == "ack":
                await msg.ack()
            else:
                await msg.nak(delay=self.config.ack_wait_s)
        except Exception as exc:  # the message will be redelivered; the log makes that safe
            log.warning("%s: could not settle %s: %s", pool.role, msg.subject, exc)
        pool.idle.put_nowait(actor)
        if pool.puller is not None:
            pool.puller.credit_changed()

    def stop(self) -> None:
        """Stop taking work, let actors finish what they hold, then stop them."""

        async def halt_pumps() -> None:
            for task in self._pumps:
                task.cancel()
            await asyncio.gather(*self._pumps, return_exceptions=True)

        with contextlib.suppress(Exception):
            self.bridge.call(halt_pumps(), timeout=10)
        # Actors finish the job they hold (bounded by a deadline); what they cannot finish
        # stays unacked and is redelivered, which the log makes safe.
        stopping = [
            actor.stop(block=False) for pool in self._pools.values() for actor in pool.actors
        ]
        deadline = time.monotonic() + self.config.stop_timeout_s
        for future in stopping:
            with contextlib.suppress(Exception):
                future.get(timeout=max(0.0, deadline - time.monotonic()))
        log.info("daemon stopped")
