"""The dashboard's web application: Starlette, served by uvicorn (``kernelflow ui``).

Each page is rendered whole on the server. It holds a live region, and its stream (the
same path under ``/stream``: server-sent events) sends a newer rendering of that region
whenever the log moves in a way the page shows (``LogView.watching``), a burst of events
making one update. The browser's script only swaps the region; nothing is rendered there.

Pages: ``/`` the task list, ``/tasks/ID`` a task, ``/groups/ID`` a group or a search,
``/run`` the run (``?group=`` / ``?workflow=`` narrow it), ``/bench/RUN`` a bench run;
``/healthz`` answers ``ok``. With a token (``kernelflow ui --token-file``) every page and
stream but ``/healthz`` and ``/static/`` needs it (:mod:`.access`).
Every page and stream carries a Content-Security-Policy that runs no script but
``/static/ui.js``, as a second line behind the escaping of everything from the log.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp

from kernelflow.cli.http_access import TokenGate
from kernelflow.cli.ui.data import ROW_SUBJECTS, LogView
from kernelflow.cli.ui.group_page import group_fragment
from kernelflow.cli.ui.html import HEADERS, esc, href, page, problem_page, version_of
from kernelflow.cli.ui.list_pages import bench_fragment, run_fragment, task_list_fragment
from kernelflow.cli.ui.task_page import task_fragment
from kernelflow.events import subjects
from kernelflow.events.model import TASK_ID_PATTERN

log = logging.getLogger("kernelflow.cli.ui")

SETTLE_S = 0.3  # after a wake, wait this long: a burst of events makes one update
RUN_SETTLE_S = 5.0  # the run page's plots are costly: updated at most this often
HEARTBEAT_S = 15.0  # a stream renders again (and shows it is alive) at least this often
_TASK_ID = re.compile(TASK_ID_PATTERN)


@dataclass(frozen=True)
class Live:
    """A page: its title, how its live region is rendered (None: nothing to show yet, and
    ``missing`` says why), the subjects whose events change it, and its stream's URL."""

    title: str
    render: Callable[[], Awaitable[str | None]]
    watched: Sequence[str]
    stream: str
    missing: str = ""
    settle_s: float = SETTLE_S
    active: str = ""


class Dashboard:
    def __init__(self, view: LogView, where: str) -> None:
        self.view = view
        self.where = where  # what the footer says the dashboard reads (no credentials)
        self._run_cache: tuple[tuple[int, str, str], str] | None = None

    # ------------------------------------------------------------------ the pages

    def tasks(self, request: Request) -> Live:
        status = request.query_params.get("status", "")
        text = request.query_params.get("q", "")

        async def render() -> str:
            return task_list_fragment(await self.view.task_rows(), status, text)

        stream = href("stream", status=status, q=text)
        return Live("tasks", render, ROW_SUBJECTS, stream, active="tasks")

    def task(self, request: Request) -> Live:
        task_id = request.path_params["task_id"]

        async def render() -> str | None:
            if not _TASK_ID.fullmatch(task_id):
                return None
            history = await self.view.task_history(task_id)
            return task_fragment(task_id, history.events) if history.events else None

        watched = [subjects.task_events(task_id)] if _TASK_ID.fullmatch(task_id) else []
        missing = (
            f"no task {task_id} in the log yet (a submit waits in the queue until a conductor "
            "takes it): this page shows it as soon as it is recorded"
            if watched
            else f"{task_id!r} is not a task id (letters, digits, _ and -, at most 64)"
        )
        stream = href("stream", "tasks", task_id)
        return Live(f"task {task_id}", render, watched, stream, missing)

    def group(self, request: Request) -> Live:
        group_id = request.path_params["group_id"]

        async def render() -> str | None:
            async with self.view.folded() as fold:
                return group_fragment(group_id, fold)

        missing = f"no task of group {group_id} in the log yet"
        stream = href("stream", "groups", group_id)
        return Live(f"group {group_id}", render, ROW_SUBJECTS, stream, missing)

    def bench(self, request: Request) -> Live:
        run = request.path_params["run"]

        async def render() -> str | None:
            async with self.view.folded() as fold:
                return await asyncio.to_thread(bench_fragment, run, fold)

        stream = href("stream", "bench", run)
        missing = f"no bench run {run} in the log"
        return Live(f"bench {run}", render, ROW_SUBJECTS, stream, missing, RUN_SETTLE_S, "run")

    def run(self, request: Request) -> Live:
        group = request.query_params.get("group", "")
        workflow = request.query_params.get("workflow", "")

        async def render() -> str:
            async with self.view.folded() as fold:
                key = (fold.through, group, workflow)
                if self._run_cache is None or self._run_cache[0] != key:
                    # Plots take a while to draw: not on the loop that serves every page.
                    fragment = await asyncio.to_thread(run_fragment, fold, group, workflow)
                    self._run_cache = (key, fragment)
                return self._run_cache[1]

        stream = href("stream", "run", group=group, workflow=workflow)
        return Live("run", render, ROW_SUBJECTS, stream, settle_s=RUN_SETTLE_S, active="run")

    # ------------------------------------------------------------------ serving them

    async def whole(self, request: Request, live: Live) -> Response:
        try:
            fragment = await live.render()
        except Exception as exc:
            log.warning("rendering %s failed: %r", request.url.path, exc)
            text = f"cannot read the log now: {_why(exc)}"
            return HTMLResponse(problem_page(live.title, text, self.where), 503, HEADERS)
        found = fragment is not None
        if fragment is None:
            fragment = f'<p class="problem">{esc(live.missing)}</p>'
        html = page(live.title, fragment, stream=live.stream, where=self.where, active=live.active)
        return HTMLResponse(html, 200 if found else 404, HEADERS)

    def stream(self, request: Request, live: Live) -> Response:
        known = request.headers.get("last-event-id") or request.query_params.get("v", "")
        return StreamingResponse(
            self._updates(live, known),
            media_type="text/event-stream",
            headers={**HEADERS, "X-Accel-Buffering": "no"},
        )

    async def _updates(self, live: Live, known: str) -> AsyncIterator[str]:
        async with self.view.watching(live.watched) as moved:
            while True:
                try:
                    fragment = await live.render()
                except Exception as exc:
                    log.warning("updating a page failed: %r", exc)
                    yield _event(f"cannot read the log now: {_why(exc)}", kind="problem")
                else:
                    if fragment is None:
                        fragment = f'<p class="problem">{esc(live.missing)}</p>'
                    version = version_of(fragment)
                    if version != known:
                        known = version
                        yield _event(fragment, ident=version)
                try:
                    await asyncio.wait_for(moved.wait(), HEARTBEAT_S)
                except TimeoutError:
                    yield ": alive\n\n"
                    continue
                moved.clear()
                await asyncio.sleep(live.settle_s)


def _event(data: str, *, kind: str = "", ident: str = "") -> str:
    """One server-sent event (each line of the data on a ``data:`` line of its own)."""
    head = (f"event: {kind}\n" if kind else "") + (f"id: {ident}\n" if ident else "")
    return head + "".join(f"data: {line}\n" for line in data.splitlines() or [""]) + "\n"


def _why(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def create_app(view: LogView, where: str, token: str | None = None) -> ASGIApp:
    """The dashboard over ``view``; with ``token``, only for those who show it
    (:mod:`.access`)."""
    dashboard = Dashboard(view, where)

    def served(path: str, make: Callable[[Request], Live]) -> list[BaseRoute]:
        async def whole(request: Request) -> Response:
            return await dashboard.whole(request, make(request))

        async def stream(request: Request) -> Response:
            return dashboard.stream(request, make(request))

        return [Route(path, whole), Route("/stream" + path.rstrip("/"), stream)]

    async def healthz(_: Request) -> Response:
        return PlainTextResponse("ok", headers=HEADERS)

    routes: list[BaseRoute] = [
        *served("/", dashboard.tasks),
        *served("/tasks/{task_id}", dashboard.task),
        *served("/groups/{group_id:path}", dashboard.group),
        *served("/run", dashboard.run),
        *served("/bench/{run:path}", dashboard.bench),
        Route("/healthz", healthz),
        Mount("/static", StaticFiles(packages=[("kernelflow.cli.ui", "static")]), name="static"),
    ]
    app = Starlette(routes=routes)
    return app if token is None else TokenGate(app, token, where)
