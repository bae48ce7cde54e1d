"""The NATS bridge: one asyncio thread that owns the NATS connection and the event log.

``Bridge.log`` is the log's port (``kernelflow.events.port``), ``Bridge.commands`` the
command queue's (``kernelflow.events.queue``), ``Bridge.consumers`` the durable
consumers' (``kernelflow.events.consumers``), ``Bridge.requests`` that of requests
among processes (``kernelflow.events.requests``) and ``Bridge.buckets`` the object
stores' (``kernelflow.events.objects``): callers ask them, never NATS
(docs/architecture.md, "The event log and its ports"); on this bridge they are the NATS
adapters, on ``kernelflow.actors.memory_bridge``'s the memory ones.

Actors are pykka threads. They reach NATS through ``Bridge.call`` (which schedules a
coroutine on the bridge loop and waits for it on the actor's thread); the loop hands work
to actors with ``tell``. Nothing ever blocks the loop waiting on an actor.

A hop between an actor thread and the loop is the framework's most frequent cost (a few
per event), so it is kept lean: ``post`` queues a callback for the loop and wakes it only
when no wake-up is pending already (under load, one wake-up carries many hops), and a
call's answer is handed back through one lock rather than a ``concurrent.futures`` future
chained to an asyncio task (``run_coroutine_threadsafe`` costs about three times as much).
The loop itself is uvloop's where it is installed (the default on Linux and macOS): the
bridge is the daemon's busiest thread, and uvloop's transports and scheduling cost it
about a third less CPU per event than asyncio's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

import nats.errors
from nats.aio.client import Client as NATS

from kernelflow.actors.connection import (
    ClientAuth,
    NatsAccessRefused,
    check_tls,
    refusal,
    safe_url,
    server_urls,
)
from kernelflow.events.consumers import ConsumersPort
from kernelflow.events.log import EventLog, EventLogPort, StreamConfig, TaskHistory
from kernelflow.events.model import Event
from kernelflow.events.nats_consumers import NatsConsumers
from kernelflow.events.nats_objects import NatsBuckets
from kernelflow.events.nats_queue import JetStreamCommandQueue
from kernelflow.events.nats_requests import NatsRequests
from kernelflow.events.objects import Buckets
from kernelflow.events.pull import cancel_and_wait
from kernelflow.events.queue import CommandQueuePort
from kernelflow.events.requests import RequestsPort

T = TypeVar("T")
log = logging.getLogger("kernelflow.bridge")
# How long the first connection's failures go unsaid (at most half of the time it is given):
# most starts are over by then, refusals included (a server that wants a client
# certificate drops the first attempts before its alert says why, later on a loaded machine).
_QUIET_S = 3.0
# How long a give-up waits for the lost connection to close before it gives up anyway.
_GIVE_UP_CLOSE_S = 2.0


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # a platform without uvloop (Windows): asyncio's loop works too
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class NatsUnreachable(ConnectionError):
    """No NATS server answered in time when the bridge started."""


class NatsLost(NatsUnreachable):
    """The connection stayed lost for longer than the bridge's ``give_up_s``."""


class NatsPermissionDenied(NatsAccessRefused):
    """The server refused something this client's credentials do not allow (it answers
    such a publish with an error of the connection, and the request waits out its time)."""


class _RepeatedErrors:
    """Logs an error once, then every ``every``-th repeat with a count: while NATS is down
    the client retries every 0.5 s and fails the same way each time."""

    def __init__(self, every: int = 20) -> None:
        self.every = every
        self.last = ""
        self.repeats = 0

    def report(self, text: str) -> None:
        if text != self.last:
            self.last, self.repeats = text, 0
            log.warning("%s", text)
            return
        self.repeats += 1
        if self.repeats % self.every == 0:
            log.warning("still (%d attempts): %s", self.repeats + 1, text)

    def reset(self) -> None:
        """The connection is back: the next outage's first error is news."""
        self.last, self.repeats = "", 0


def _reason(exc: BaseException) -> str:
    """Why a connection attempt failed, in words: an unroutable address's timeout has no
    text of its own."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, TimeoutError):
        return "the connection attempt timed out"
    return str(exc).removeprefix("nats: ") or type(exc).__name__


class _Answer(Generic[T]):
    """The outcome of one ``Bridge.call``: set once on the loop, waited for on the
    caller's thread."""

    __slots__ = ("_error", "_ready", "_value")

    def __init__(self) -> None:
        self._ready = threading.Lock()
        self._ready.acquire()  # released once the outcome is in
        self._value: T | None = None
        self._error: BaseException | None = None

    def settle(self, task: asyncio.Task[T]) -> None:
        """On the loop, as the task's done callback."""
        try:
            self._value = task.result()
        except BaseException as exc:  # cancellation included: the caller gets it raised
            self._error = exc
        self._ready.release()

    def wait(self, timeout: float | None) -> T:
        if not self._ready.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise TimeoutError(f"no answer from the bridge loop within {timeout}s")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


class Bridge:
    def __init__(
        self,
        nats_url: str,
        streams: StreamConfig | None = None,
        after_append: Callable[[Event, TaskHistory], None] | None = None,
        auth: ClientAuth | None = None,
        give_up_s: float | None = None,
        on_give_up: Callable[[], None] | None = None,
    ) -> None:
        self.nats_url = nats_url  # one URL, or a comma-separated list of a cluster's
        self.auth = auth or ClientAuth()
        self.streams = streams or StreamConfig()
        self._after_append = after_append
        self.loop = _new_loop()
        self._thread = threading.Thread(target=self._run, name="kf-nats-bridge", daemon=True)
        self._nc: NATS | None = None
        self._log: EventLogPort | None = None
        self._commands: CommandQueuePort | None = None
        self._consumers: ConsumersPort | None = None
        self._requests: RequestsPort | None = None
        self._buckets: Buckets | None = None
        self._closing = False
        # Callbacks posted from other threads and not run yet, and whether the loop has
        # been woken to run them.
        self._posts: list[Callable[[], object]] = []
        self._posts_lock = threading.Lock()
        self._drain_scheduled = False
        # Permission violations the server reported, and the last one's text: a call that
        # times out while one arrives is refused, not slow (see ``call``).
        self._denials = 0
        self._last_denial = ""
        # How long a lost connection is retried (None: for good) before the bridge closes
        # it and calls ``on_give_up`` (on the loop), ``lost`` saying why: a supervised
        # process exits then, and its supervisor starts a fresh one.
        self.give_up_s = give_up_s
        self._on_give_up = on_give_up
        self.lost: NatsLost | None = None
        self._giving_up: asyncio.Task[None] | None = None
        # While starting: how long refusals may last (``start``), and why the last
        # attempt to connect failed.
        self._refused_s: float | None = None
        self._failed = ""

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float | None = 30.0, *, refused_s: float | None = None) -> Bridge:
        """Connect, and check (or create) the streams. Raises NatsUnreachable when no
        server answered within ``timeout_s`` (None: waits for one) or, with ``refused_s``,
        when every server refused the connection for that long (nothing listens there: a
        command fails at once rather than wait out its timeout), NatsAccessRefused when one
        refused this client's credentials or TLS, CredentialsError for a file that cannot
        be used. Retries are said on the log only where the wait is long (a daemon's):
        a short one ends in one line saying why."""
        self._thread.start()
        self._refused_s = refused_s
        try:
            self.call(self._connect(timeout_s))
        except BaseException as exc:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
            if isinstance(exc, TimeoutError) and not isinstance(exc, nats.errors.Error):
                raise NatsUnreachable(
                    f"no NATS server answered at {safe_url(self.nats_url)} within "
                    f"{timeout_s:g}s" + (f" ({self._failed})" if self._failed else "")
                ) from None
            raise
        return self

    async def _connect(self, timeout_s: float | None) -> None:
        """Reach a server within ``timeout_s`` (``start``), then check the streams."""
        refused_s = self._refused_s
        errors = _RepeatedErrors()
        shown = safe_url(self.nats_url)
        options = self.auth.options()
        connected = False
        # Why a server refused this client, when one did while connecting: retrying with
        # the same credentials cannot help, so the start fails at once.
        loop = asyncio.get_running_loop()
        refused: asyncio.Future[str] = loop.create_future()
        # Why no server can be reached, when every one refused the connection for
        # ``refused_s``: nothing listens there.
        unreachable: asyncio.Future[str] = loop.create_future()
        started = loop.time()
        # A short wait (a command's) ends in one line saying why; a long one (a daemon's)
        # says on the log, after a moment, that it goes on trying.
        patient = timeout_s is None or timeout_s > 2 * _QUIET_S
        quiet_s = _QUIET_S if patient else math.inf
        refused_since: float | None = None

        async def on_error(exc: Exception) -> None:
            nonlocal refused_since
            if connected:
                if "permissions violation" in str(exc):
                    # Only noted: what needed it fails with it (``call``), and a refusal
                    # nothing waits for (a role's reads leave their consumers to expire,
                    # not being allowed to delete them) is no news.
                    self._denials += 1
                    self._last_denial = str(exc).removeprefix("nats: ")
                    log.info("NATS refused: %s (%s)", self._last_denial, self._not_allowed())
                else:
                    errors.report(f"NATS error: {exc}")
                return
            denied = refusal(exc, self.nats_url, self.auth)
            if denied is not None:
                if not refused.done():
                    refused.set_result(denied)
                return
            self._failed = _reason(exc)
            if isinstance(exc, ConnectionRefusedError):
                refused_since = loop.time() if refused_since is None else refused_since
                if refused_s is not None and loop.time() - refused_since >= refused_s:
                    if not unreachable.done():
                        unreachable.set_result(f"nothing listens at {shown} (connection refused)")
                    return
            else:
                refused_since = None
            # The first connection: say that it is tried again, and for how long, unless
            # it is over (connected, or refused) within a moment: a server that wants a
            # client certificate drops the first attempt before it says why.
            if loop.time() - started >= quiet_s:
                until = "until one answers" if timeout_s is None else f"for {timeout_s:g}s"
                errors.report(f"no NATS server at {shown} yet ({self._failed}); trying {until}")

        async def on_disconnect() -> None:
            if self._closing:
                return
            log.warning("disconnected from NATS at %s; reconnecting", shown)
            if self.give_up_s is not None and self._giving_up is None:
                self._giving_up = loop.create_task(self._give_up(self.give_up_s, shown))

        async def on_reconnect() -> None:
            errors.reset()
            # Once given up, the connection is closed even if it came back meanwhile.
            if self._giving_up is not None and self.lost is None:
                self._giving_up.cancel()
                self._giving_up = None
            log.info("reconnected to NATS at %s", shown)

        options |= {
            "name": "kernelflow",
            # A daemon outlives NATS restarts: the client keeps trying, and the bridge
            # decides when to give up (``give_up_s``).
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": 0.5,
            # A server that vanished without closing the connection (a machine lost, a
            # network split) is noticed within 20-30 s, not nats-py's 4-6 minutes.
            "ping_interval": 10,
            "max_outstanding_pings": 2,
            "connect_timeout": 5,
            "allow_reconnect": True,
            "error_cb": on_error,
            "disconnected_cb": on_disconnect,
            "reconnected_cb": on_reconnect,
        }
        self._nc = NATS()
        connecting = asyncio.ensure_future(self._nc.connect(server_urls(self.nats_url), **options))
        try:
            outcomes: set[asyncio.Future[Any]] = {connecting, refused, unreachable}
            done, _ = await asyncio.wait(
                outcomes, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                raise TimeoutError
            if refused.done():
                raise NatsAccessRefused(refused.result())
            if unreachable.done():
                raise NatsUnreachable(unreachable.result())
            connecting.result()
            connected = True
            check_tls(self._nc._server_info, self.nats_url, self.auth)
        except BaseException:
            connecting.cancel()
            self._closing = True
            await self._nc.close()
            raise
        event_log = EventLog(self._nc, self.streams, self._after_append)
        await event_log.ensure_streams()
        self._log = event_log
        self._commands = JetStreamCommandQueue(self._nc)
        self._consumers = NatsConsumers(self._nc)
        self._requests = NatsRequests(self._nc)
        self._buckets = NatsBuckets(self._nc.jetstream())

    async def _give_up(self, after_s: float, shown: str) -> None:
        await asyncio.sleep(after_s)
        self.lost = NatsLost(f"lost NATS at {shown} for {after_s:g}s; giving up")
        self._closing = True
        try:
            # Every call waiting on NATS fails now, instead of hanging. nats-py's close
            # flushes what was buffered while reconnecting into the dead connection, and
            # that fails (or waits): the give-up must not depend on it.
            await asyncio.wait_for(self.nc.close(), _GIVE_UP_CLOSE_S)
        except Exception as exc:
            log.info("closing the lost NATS connection: %r", exc)
        finally:
            if self._on_give_up is not None:
                self._on_give_up()

    def stop(self, timeout_s: float = 10.0) -> None:
        if not self._thread.is_alive():
            return
        self._closing = True
        if self._nc is not None and not self._nc.is_closed:
            # close, not drain: every publish was already acknowledged by JetStream, and
            # unacked work is redelivered by design, so there is nothing left to flush. A
            # connection that is down is not waited for: its close flushes into nothing.
            wait_s = timeout_s if self._nc.is_connected else min(timeout_s, _GIVE_UP_CLOSE_S)
            try:
                self.call(self._nc.close(), timeout=wait_s)
            except Exception as exc:  # stopping anyway; say why it was not clean
                down = wait_s < timeout_s  # closing what was lost: no news
                log.log(logging.INFO if down else logging.WARNING, "closing NATS: %r", exc)
        try:
            self.call(self._finish_tasks(), timeout=timeout_s)
        except Exception as exc:
            log.warning("stopping what still ran on the bridge loop failed: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)

    async def _finish_tasks(self) -> None:
        """Cancel what still runs on the loop (a read someone stopped waiting for, its
        cleanup) and wait for it to end, then close the async generators left open, as
        ``asyncio.run`` does on its way out: a task still pending when the process exits
        is reported as destroyed, on the user's terminal."""
        this = asyncio.current_task()
        left = [task for task in asyncio.all_tasks() if task is not this]
        await cancel_and_wait(left)
        await self.loop.shutdown_asyncgens()

    # ------------------------------------------------------------------ access

    @property
    def nc(self) -> NATS:
        assert self._nc is not None, "bridge not started"
        return self._nc

    @property
    def log(self) -> EventLogPort:
        assert self._log is not None, "bridge not started"
        return self._log

    @property
    def commands(self) -> CommandQueuePort:
        assert self._commands is not None, "bridge not started"
        return self._commands

    @property
    def consumers(self) -> ConsumersPort:
        """The durable consumers: the daemons' pools, the read model's cursor."""
        assert self._consumers is not None, "bridge not started"
        return self._consumers

    @property
    def connected(self) -> bool:
        """Whether NATS is reachable now (False while reconnecting, and once closed)."""
        return bool(self.nc.is_connected)

    @property
    def requests(self) -> RequestsPort:
        """Requests among processes: health pings, status queries."""
        assert self._requests is not None, "bridge not started"
        return self._requests

    @property
    def buckets(self) -> Buckets:
        """The object stores: the read model's snapshots, the verifiers' extensions."""
        assert self._buckets is not None, "bridge not started"
        return self._buckets

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the bridge loop and wait for its result (never from the loop).
        A call given up on after ``timeout`` seconds raises TimeoutError; the coroutine
        itself runs on."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("Bridge.call() from the bridge loop would deadlock it")
        answer: _Answer[T] = _Answer()

        def start() -> None:
            self.loop.create_task(coro).add_done_callback(answer.settle)

        denials = self._denials
        self.post(start)
        try:
            return answer.wait(timeout)
        except nats.errors.TimeoutError as exc:
            if self._denials == denials:
                raise
            raise NatsPermissionDenied(
                f"NATS refused: {self._last_denial} ({self._not_allowed()}; docs/security.md "
                "lists what each role may do)"
            ) from exc

    def _not_allowed(self) -> str:
        creds = f"the credentials in {self.auth.creds}" if self.auth.creds else "this user"
        return f"{creds} may not do this"

    def post(self, callback: Callable[[], object]) -> None:
        """Run ``callback`` on the bridge loop soon, from any thread, in the order posted."""
        with self._posts_lock:
            self._posts.append(callback)
            if self._drain_scheduled:
                return  # the loop is already due to run the posts
            self._drain_scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._run_posts)
        except RuntimeError:  # the loop is closed: say so now and on every later post
            with self._posts_lock:
                self._drain_scheduled = False
            raise

    def _run_posts(self) -> None:
        with self._posts_lock:
            posts, self._posts = self._posts, []
            self._drain_scheduled = False  # what is posted from now on wakes the loop again
        for callback in posts:
            try:
                callback()
            except Exception:  # one bad callback must not drop the others
                log.exception("a callback posted to the bridge loop failed")

    def spawn(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the bridge loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)
