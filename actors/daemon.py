"""The daemon: pools of actors per role, each fed by a durable consumer
(``kernelflow.events.consumers``: JetStream's, or the memory bridge's).

Work reaches actors only through the log: the conductor's pool consumes commands and the
events that call for a decision; each agent pool consumes the dispatches for its agent.
A pump fetches only as many messages as its pool has idle actors (backpressure), keeps
them "in progress" while an actor works, and acks them when the actor is done. A daemon
that dies leaves its messages unacked: JetStream redelivers them after ``ack_wait`` to
whichever daemon is consuming, and the log tells that daemon how far the work got.

Per message the loop does: hand it to an idle actor (one ``tell``), keep it in progress
(one sweep every ``ack_wait / 3`` covers every message held), and settle it when the actor
says so (one ack). An actor may give its message to another actor (``Delivery.release``):
it is free for new work at once, and the message is held until the other settles it.
A trigger whose decision needs no LLM is decided by the loop itself, as it arrives
(``advance_on_loop``): no actor, no thread hand-off. So that busy conductors (waiting on
their LLM) hold up no such decision, the triggers' pump asks for up to ``_LOOP_ROOM``
messages beyond its idle actors; one of those that needs an actor after all waits in the
daemon (kept in progress) for the next actor to free up.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pykka

from kernelflow.actors.agents import LLMAgent
from kernelflow.actors.bridge import Bridge
from kernelflow.actors.conductor import Conductor, advance_on_loop, settled
from kernelflow.actors.devices import cpu_verifiers, gpu_verifiers
from kernelflow.actors.extension_store import ensure_extension_bucket
from kernelflow.actors.verifier import Verifier, WarmUps
from kernelflow.actors.worker import Delivery, Message, Settlement, Source, task_of
from kernelflow.events import subjects
from kernelflow.events.consumers import ConsumerSpec, Delivered, Pull
from kernelflow.llm.base import LLMProvider
from kernelflow.sandbox.workdirs import remove_abandoned_workdirs
from kernelflow.verification.engine import VerifierConfig
from kernelflow.workflows.model import VERIFIER

log = logging.getLogger("kernelflow.daemon")
ActorRef = pykka.ActorRef[Any]  # refs are invariant in the actor type; pools mix kinds

CONDUCTOR_ROLE = "conductor"
DEFAULT_ROLES = (CONDUCTOR_ROLE, "designer", "coder", VERIFIER)
# Pool sizes that differ from the default: the verifier owns the (single) GPU; a conductor
# actor (recording a new task, asking the conductor's LLM) spends most of its time waiting
# on round trips and LLM calls, so a burst of tasks needs many of them (threads that wait
# cost next to nothing). Routing decisions take no actor: the loop makes them.
_DEFAULT_POOLS = {VERIFIER: 1, CONDUCTOR_ROLE: 16}
# When a message settled "soon" is delivered again.
SOON_S = 0.5
# When work a daemon did not serve (``DaemonConfig.serves``) is delivered again once it
# gave it back as it stopped: after its pull requests expired (``CreditPuller``'s
# ``expires_s``, 5 s), which the server would otherwise hand it to, unheard, for
# ``ack_wait_s``.
_GIVEN_BACK_AFTER_S = 6.0
# Triggers the loop may hold at once beyond what idle conductor actors can take.
_LOOP_ROOM = 64


@dataclass
class DaemonConfig:
    roles: tuple[str, ...] = DEFAULT_ROLES
    # Actors per role (see _DEFAULT_POOLS for the roles whose default is not 4).
    pool_sizes: dict[str, int] = field(default_factory=dict)
    default_pool_size: int = 4
    # Redelivery delay for work a dead daemon left behind; live work is kept alive by
    # "in progress" heartbeats, so this can be short.
    ack_wait_s: float = 30.0
    llm: LLMProvider | None = None
    # Deliveries of one message before its work is given up: recorded as failed (an
    # agent's dispatch, a decision: the task ends) rather than left waiting forever.
    max_deliveries: int = 20
    # How long stop() lets actors finish the message they hold.
    stop_timeout_s: float = 30.0
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    # CUDA devices (indices or UUIDs) the verifier pool owns: one verifier actor per
    # device, each checking on its own device only (``--devices 0,1``, ``all``). Empty:
    # one pool as sized above.
    gpus: tuple[str, ...] = ()
    # CPU verifiers, each pinned to a disjoint set of ``cores`` (``--devices cpu:N``;
    # None: the cores this process may use); 0: the pool as sized above, unpinned.
    cpu_verifiers: int = 0
    cores: tuple[int, ...] | None = None
    # Called on the bridge loop with the role as each message is taken up: a command
    # that runs its own daemon (``kernelflow run``) says through it what else it works on.
    on_message: Callable[[str, Message], None] | None = None
    # Which messages this daemon does (None: every one). A message it does not serve stays queued
    # for another daemon: taken, kept "in progress" untouched while this daemon runs, and
    # given back as it stops (a command's own daemon that works only on its own tasks:
    # ``kernelflow run`` without ``--serve-others``, README.md "CLI").
    serves: Callable[[Message], bool] | None = None

    def pool_size(self, role: str) -> int:
        if role == VERIFIER and self.gpus:
            return len(self.gpus)
        if role == VERIFIER and self.cpu_verifiers:
            return self.cpu_verifiers
        return self.pool_sizes.get(role, _DEFAULT_POOLS.get(role, self.default_pool_size))

    def verifier_configs(self) -> list[VerifierConfig]:
        """One configuration per verifier actor: with ``gpus``, each owns its device; with
        ``cpu_verifiers``, its cores (ValueError: more verifiers than cores)."""
        if self.gpus:
            return gpu_verifiers(self.verifier, self.gpus)
        if self.cpu_verifiers:
            return cpu_verifiers(self.verifier, self.cpu_verifiers, self.cores)
        return [self.verifier] * self.pool_size(VERIFIER)


@dataclass(frozen=True)
class _Feed:
    role: str
    stream: str
    durable: str
    filters: tuple[str, ...]
    source: Source
    # Task id -> whether this process knows that work for the task calls for nothing.
    stale: Callable[[str], bool] | None = None
    # Decisions that need no LLM are made on the loop, as triggers arrive (see
    # ``advance_on_loop``); the rest go to the pool's actors.
    decided_on_loop: bool = False


@dataclass
class _Pool:
    role: str
    actors: list[ActorRef]
    idle: asyncio.Queue[ActorRef]
    puller: Pull | None = None
    # Messages the loop may hold beyond what idle actors can take: a feed whose messages
    # the loop mostly handles itself (decisions) is not held back by busy actors.
    loop_room: int = 0
    # Held by the loop (its own work, or waiting for an actor), not settled yet.
    on_loop: int = 0
    # Taken while every actor was busy, for the next actor to free up.
    waiting: collections.deque[tuple[_Held, Message]] = field(default_factory=collections.deque)

    def credit(self) -> int:
        """How many more messages to ask for."""
        return self.idle.qsize() + max(0, self.loop_room - self.on_loop)

    def credit_changed(self) -> None:
        if self.puller is not None:
            self.puller.credit_changed()


@dataclass(frozen=True)
class PoolLoad:
    """One feed's pool as the loop sees it now (a daemon's metrics)."""

    role: str
    stream: str
    consumer: str
    actors: int
    busy: int  # actors holding a message
    waiting: int  # messages taken while every actor was busy, waiting for one


@dataclass(eq=False)
class _Held:
    """A message handed to an actor (None: worked on by the loop) and not settled yet."""

    pool: _Pool
    actor: ActorRef | None
    msg: Delivered
    actor_freed: bool = False
    settled: bool = False
    # Counted in its pool's ``on_loop`` until handed to an actor or settled.
    on_loop: bool = False


class Daemon:
    def __init__(self, bridge: Bridge, config: DaemonConfig) -> None:
        self.bridge = bridge
        self.config = config
        self.warm_ups = WarmUps()  # how far its verifiers got readying their sandboxes
        self._pools: dict[str, _Pool] = {}
        self._pumps: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._held: set[_Held] = set()
        self._parked: list[Delivered] = []  # messages it does not serve, left for another daemon
        self._heartbeat: asyncio.Task[None] | None = None

    def pool_loads(self) -> list[PoolLoad]:
        """Each feed's actors, how many are busy, how many messages wait for one. On the
        bridge loop, which owns the pools."""
        return [
            PoolLoad(
                feed.role,
                feed.stream,
                feed.durable,
                len(pool.actors),
                len(pool.actors) - pool.idle.qsize(),
                len(pool.waiting),
            )
            for feed in self._feeds()
            if (pool := self._pools.get(feed.durable)) is not None
        ]

    async def backlog(self, load: PoolLoad) -> tuple[int, int]:
        """What a feed's durable consumer holds (``pool_loads``' ``load``): messages
        waiting to be delivered, and delivered but not settled. On the bridge loop."""
        state = await self.bridge.consumers.state(load.stream, load.consumer)
        return state.pending, state.ack_pending

    def remove_consumer(self, role: str) -> None:
        """Delete the durable consumer of agent ``role`` (a role that dies with its
        process: its consumer would outlive it in NATS)."""
        consumer = subjects.agent_consumer(role)
        self.bridge.call(self.bridge.consumers.delete(subjects.EVENTS_STREAM, consumer))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Daemon:
        removed = remove_abandoned_workdirs()
        if removed:  # left by a daemon killed mid-verification or mid-tool-run
            log.info(
                "removed %d sandbox work dir(s) a stopped daemon left in %s",
                len(removed),
                os.path.dirname(removed[0]),
            )
        self._ensure_extension_bucket()
        for feed in self._feeds():
            actors = self._actors(feed.role)
            room = _LOOP_ROOM if feed.decided_on_loop else 0
            self._pools[feed.durable] = _Pool(feed.role, actors, asyncio.Queue(), loop_room=room)
        self.bridge.call(self._start_pumps())
        log.info(
            "daemon started: %s",
            ", ".join(f"{name} x{len(p.actors)}" for name, p in self._pools.items()),
        )
        return self

    def _ensure_extension_bucket(self) -> None:
        """The verifiers' shared extension store, made with the streams' replicas where
        this daemon's key may (the daemon role; a verifier's may not, and uses it once
        there). Before any verifier starts, and before the daemon says it started."""
        replicas = self.bridge.streams.replicas
        try:
            buckets = self.bridge.buckets
            if self.bridge.call(ensure_extension_bucket(buckets, replicas), timeout=15):
                log.info(
                    "created the shared extension store %s (%d replica(s))",
                    subjects.EXTENSIONS_BUCKET,
                    replicas,
                )
        except Exception as exc:
            log.info(
                "the shared extension store %s is not there and was not created (%s): this "
                "daemon's verifiers build what its node lacks until a daemon with the "
                "daemon key creates it",
                subjects.EXTENSIONS_BUCKET,
                str(exc) or type(exc).__name__,
            )

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
                        subjects.CONDUCTOR_COMMANDS_CONSUMER,
                        (subjects.ALL_COMMANDS,),
                        "command",
                    )
                )
                feeds.append(
                    _Feed(
                        role,
                        subjects.EVENTS_STREAM,
                        subjects.CONDUCTOR_CONSUMER,
                        tuple(subjects.decision_triggers()),
                        "event",
                        stale=functools.partial(settled, self.bridge),
                        decided_on_loop=True,
                    )
                )
            else:
                feeds.append(
                    _Feed(
                        role,
                        subjects.EVENTS_STREAM,
                        subjects.agent_consumer(role),
                        (subjects.dispatches_for(role),),
                        "event",
                        # Nothing is dispatched after a task's end.
                        stale=self.bridge.log.has_ended,
                    )
                )
        return feeds

    def _actors(self, role: str) -> list[ActorRef]:
        bridge, config = self.bridge, self.config
        if role == VERIFIER:
            return [Verifier.start(bridge, c, self.warm_ups) for c in config.verifier_configs()]
        size = config.pool_size(role)
        if role == CONDUCTOR_ROLE:
            return [Conductor.start(bridge, config.llm) for _ in range(size)]
        if config.llm is None:
            raise ValueError(f"role {role!r} is an LLM agent and needs an LLM provider (--llm)")
        return [LLMAgent.start(bridge, role, config.llm, config.verifier) for _ in range(size)]

    async def _start_pumps(self) -> None:
        self._heartbeat = asyncio.create_task(self._keep_in_progress(), name="kf-in-progress")
        for feed in self._feeds():
            pool = self._pools[feed.durable]
            for actor in pool.actors:
                pool.idle.put_nowait(actor)
            await self._pump(pool, feed)

    async def _pump(self, pool: _Pool, feed: _Feed) -> None:
        await self.bridge.consumers.create(
            ConsumerSpec(
                feed.stream,
                feed.durable,
                feed.filters,
                ack_wait_s=self.config.ack_wait_s,
                # A message that keeps failing (or keeps killing its daemon) is given up
                # after this many deliveries rather than retried forever.
                max_deliveries=self.config.max_deliveries,
            )
        )

        def deliver(msg: Delivered) -> None:
            if subjects.HISTORY_ONLY_HEADER in msg.headers:
                # A forked task's copied history: nothing to do (docs/workflows.md).
                self._in_background(msg.ack())
                return
            if feed.stale is not None and feed.stale(task_of(msg.subject)):
                # Queued work for a task known to be over (history delivered to a new
                # consumer, an imported log): done without an actor or a read.
                self._in_background(msg.ack())
                return
            message = self._message(pool, msg, feed.source)
            if self.config.serves is not None and not self.config.serves(message):
                self._parked.append(msg)
                return
            if not feed.decided_on_loop and pool.idle.empty():
                # More than was asked for (a late answer to a request given up on after a
                # reconnect): let JetStream deliver it again shortly.
                self._in_background(msg.nak(delay=1.0))
                return
            held = _Held(pool, None, msg)
            self._held.add(held)
            if feed.decided_on_loop:
                self._hold_on_loop(held)
                delivery = self._delivery(held, message)
                to_actor = functools.partial(self._to_next_actor, held, message)
                if advance_on_loop(self.bridge, delivery, self._in_background, to_actor):
                    return
            self._to_next_actor(held, message)

        pool.puller = self.bridge.consumers.pull(feed.stream, feed.durable, pool.credit, deliver)
        self._pumps.append(asyncio.create_task(pool.puller.run(), name=feed.durable))

    def _message(self, pool: _Pool, msg: Delivered, source: Source) -> Message:
        message = Message(
            source=source,
            subject=msg.subject,
            data=msg.data,
            headers=dict(msg.headers),
            stream_seq=msg.stream_seq,
            deliveries=msg.delivered,
            last_delivery=0 < self.config.max_deliveries <= msg.delivered,
        )
        if self.config.on_message is not None:
            self.config.on_message(pool.role, message)
        return message

    def _hold_on_loop(self, held: _Held) -> None:
        held.on_loop = True
        held.pool.on_loop += 1

    def _off_loop(self, held: _Held) -> None:
        if held.on_loop:
            held.on_loop = False
            held.pool.on_loop -= 1
            held.pool.credit_changed()

    def _to_next_actor(self, held: _Held, message: Message) -> None:
        """Hand the message to an idle actor, or to the next to free up."""
        if held.pool.idle.empty():
            held.pool.waiting.append((held, message))
        else:
            self._to_actor(held, held.pool.idle.get_nowait(), message)

    def _to_actor(self, held: _Held, actor: ActorRef, message: Message) -> None:
        self._off_loop(held)
        held.actor = actor
        actor.tell(self._delivery(held, message))

    def _delivery(self, held: _Held, message: Message) -> Delivery:
        post = self.bridge.post

        def settle(how: Settlement) -> None:  # called on an actor's thread, or the loop
            post(lambda: self._settle(held, how))

        def release() -> None:  # called on an actor's thread
            post(lambda: self._free(held))

        return Delivery(message, settle, release)

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coro)
        self._background.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._background.discard)
        return task

    async def _keep_in_progress(self) -> None:
        """Tell JetStream every message an actor holds is still being worked on, so that
        only a dead daemon's messages are redelivered."""
        while True:
            await asyncio.sleep(self.config.ack_wait_s / 3)
            for msg in [held.msg for held in self._held] + self._parked:
                with contextlib.suppress(Exception):
                    await msg.in_progress()

    def _free(self, held: _Held) -> None:
        if held.actor_freed:
            return
        held.actor_freed = True
        pool, actor = held.pool, held.actor
        if actor is None:  # the loop's own work
            self._off_loop(held)
        elif pool.waiting:  # a message taken while every actor was busy
            waiting, message = pool.waiting.popleft()
            self._to_actor(waiting, actor, message)
        else:
            pool.idle.put_nowait(actor)
            pool.credit_changed()

    def _settle(self, held: _Held, how: Settlement) -> None:
        if held.settled:
            return
        held.settled = True
        self._held.discard(held)
        self._free(held)
        self._in_background(self._answer(held, how))

    async def _answer(self, held: _Held, how: Settlement) -> None:
        # A message that outlived stop() is settled on a closed connection: nothing happens,
        # and it is redelivered to the next daemon, like the rest.
        try:
            if how == "ack":
                await held.msg.ack()
            else:
                await held.msg.nak(delay=SOON_S if how == "soon" else self.config.ack_wait_s)
        except Exception as exc:  # the message will be redelivered; the log makes that safe
            log.warning("%s: could not settle %s: %s", held.pool.role, held.msg.subject, exc)

    async def _give_back_waiting(self) -> None:
        """Messages taken while every actor was busy, and never begun, go back to the
        stream now, for another daemon to take at once rather than after ``ack_wait``."""
        for pool in self._pools.values():
            while pool.waiting:
                held, _ = pool.waiting.popleft()
                held.settled = True
                self._held.discard(held)
                self._off_loop(held)
                with contextlib.suppress(Exception):
                    await held.msg.nak()
        parked, self._parked = self._parked, []
        for msg in parked:
            with contextlib.suppress(Exception):
                await msg.nak(delay=_GIVEN_BACK_AFTER_S)

    def stop(self, wait_s: float | None = None) -> None:
        """Stop taking work, let actors finish what they hold (for up to ``wait_s``,
        default ``stop_timeout_s``), then stop them."""

        async def halt_pumps() -> None:
            for task in self._pumps:
                task.cancel()
            await asyncio.gather(*self._pumps, return_exceptions=True)
            await self._give_back_waiting()

        with contextlib.suppress(Exception):
            self.bridge.call(halt_pumps(), timeout=10)
        # Actors finish the message they hold (bounded by a deadline); what they cannot finish
        # stays unacked and is redelivered, which the log makes safe.
        stopping = [
            actor.stop(block=False) for pool in self._pools.values() for actor in pool.actors
        ]
        deadline = time.monotonic() + (self.config.stop_timeout_s if wait_s is None else wait_s)
        for future in stopping:
            with contextlib.suppress(Exception):
                future.get(timeout=max(0.0, deadline - time.monotonic()))
        heartbeat = self._heartbeat  # kept up while the actors finished their messages
        if heartbeat is not None:
            with contextlib.suppress(Exception):
                self.bridge.loop.call_soon_threadsafe(heartbeat.cancel)
        log.info("daemon stopped")
