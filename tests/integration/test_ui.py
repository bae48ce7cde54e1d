"""``kernelflow ui`` in a real browser: headless Chromium (Debian's ``chromium`` package,
driven by Playwright) against the dashboard run as a subprocess, a real NATS and a real
daemon whose LLM answers from a script.

One module-wide setup: the search's candidates are recorded first (no daemon yet), then a
daemon runs the relu task (its designer answers after ``DESIGNER_S`` seconds, with a
``<script>`` in its answer; its first kernel fails verification, the second passes) and a
task of the same group whose deadline ends it while its designer works.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import signal
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from PIL import Image

from kernelflow.events.log import EventLog, TaskHistory
from kernelflow.events.model import (
    Event,
    TaskFinished,
    TaskSubmitted,
    VerificationCompleted,
    VerificationReport,
)
from tests.conftest import REPO, as_user, connect, creds, keyed_nats, run_cli
from tests.daemons import (
    RELU_SCRIPT,
    serving_ui,
    start_daemon,
    submit,
    wait_for_line,
    wait_until_settled,
)

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}
DESIGNER_S = 10.0  # long enough to see it running after two submits on a loaded machine
INJECTED = '<script>window.kfInjected = 1</script><img src=x onerror="window.kfInjected = 2">'
SECRET = "kfsecret"
UI_TOKEN = "kf-browser-token-0123456789"
TASK, LATE, GROUP, SEARCH, BENCH = "ui-relu", "ui-late", "ui-grp", "ui-search", "ui-bench"
WAIT_MS = 90_000
T = TypeVar("T")

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="no /usr/bin/chromium: apt-get install chromium (.ci/run does)",
    ),
]


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of this module's own: the dashboard lists only this module's tasks."""
    with keyed_nats(tmp_path_factory.mktemp("ui-nats")) as url:
        yield url


@pytest.fixture(scope="module")
def ui(nats_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``kernelflow ui`` on a free port, given a NATS URL with credentials in it (which no
    page may show); yields its base URL."""
    url_with_secret = nats_server.replace("nats://", f"nats://kfuser:{SECRET}@")
    key = ("--creds", str(creds(nats_server, "reader")))  # the URL's password goes unused
    with serving_ui(url_with_secret, tmp_path_factory.mktemp("ui"), *key) as server:
        assert SECRET not in server.first_line
        yield server.url
    assert SECRET not in server.printed


@pytest.fixture(scope="module")
def guarded_ui(nats_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``kernelflow ui --token-file`` (tokens: tests/integration/test_ui_token.py); its base URL."""
    tmp = tmp_path_factory.mktemp("ui-guarded")
    (tmp / "ui.token").write_text(UI_TOKEN + "\n")
    with serving_ui(nats_server, tmp, env={"KF_UI_TOKEN_FILE": str(tmp / "ui.token")}) as server:
        yield server.url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def running(nats_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A daemon, and the relu task and a late one of the same group submitted to it."""
    tmp = tmp_path_factory.mktemp("daemon")
    script = yaml.safe_load((REPO / RELU_SCRIPT).read_text())
    designer = script["designer"][0]
    designer["latency_s"] = DESIGNER_S
    designer["text"] = f"{INJECTED}\n{designer['text']}"
    (tmp / "script.yaml").write_text(yaml.safe_dump(script))
    log = tmp / "daemon.log"
    daemon = start_daemon(nats_server, log, script=tmp / "script.yaml")
    try:
        wait_for_line(log, "daemon started")
        submit(nats_server, TASK, "--group", GROUP)
        submit(nats_server, LATE, "--group", GROUP, "--deadline", "1")
        yield nats_server
    finally:
        daemon.send_signal(signal.SIGINT)
        daemon.wait(timeout=60)


@pytest.fixture(scope="module")
def settled(running: str) -> str:
    for task_id in (TASK, LATE):
        off_the_loop(wait_until_settled, running, task_id)
    return running


def candidate(
    task_id: str, n: int, gen: int, island: int, speedup: float, **more: str
) -> list[Event]:
    """A search candidate's events, as a search's task records them."""
    metadata = {
        "search": SEARCH,
        "strategy": "evolve",
        "candidate": str(n),
        "generation": str(gen),
        "island": str(island),
        "bench": BENCH,
        "problem": "3_hardswish",
        **more,
    }
    report = VerificationReport(verdict="pass", summary="pass", speedup=speedup)
    return [
        TaskSubmitted(
            task_id=task_id,
            task_name="relu",
            task_source="class Model: ...",
            workflow_name="default",
            workflow_yaml="",
            backend="triton",
            group_id=SEARCH,
            metadata=metadata,
        ),
        VerificationCompleted(
            task_id=task_id, agent="verifier", dispatch_id=f"{task_id}-v", code="k", report=report
        ),
        TaskFinished(
            task_id=task_id, status="success", reason="passed", final_code="k", verdict="pass"
        ),
    ]


def record(url: str, events: list[Event]) -> None:
    async def append() -> None:  # as a daemon records them
        nc = await connect(url, "daemon")
        try:
            log = EventLog(nc)
            await log.ensure_streams()
            await log.append(TaskHistory(events[0].task_id), events)
        finally:
            await nc.close()

    off_the_loop(asyncio.run, append())


def off_the_loop(function: Callable[..., T], *args: Any) -> T:
    """``function(*args)`` on a thread of its own: Playwright's synchronous API keeps an
    event loop running on this one, where ``asyncio.run`` may not start another."""
    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return thread.submit(function, *args).result()


@pytest.fixture(scope="module")
def search(nats_server: str) -> str:
    """A search's candidates in the log, recorded before any daemon runs (no conductor
    looks at these made-up tasks): whichever test asks first records them."""
    record(nats_server, candidate("s-a", 0, 0, 0, 1.5))
    record(nats_server, candidate("s-b", 1, 0, 1, 0.8))
    record(nats_server, candidate("s-c", 2, 1, 0, 2.4, parents="s-a", inspirations="s-b"))
    record(nats_server, candidate("s-d", 3, 2, 1, 1.1, parents="s-b,s-c"))
    return SEARCH


def test_a_search_shows_its_islands_and_its_tree(search: str, ui: str, browser: Any) -> None:
    page = browser.new_page()
    page.goto(f"{ui}/groups/{SEARCH}")
    tree = page.locator("ul.tree")
    # Children under their first parent; a second parent named beside.
    assert tree.locator("li:has(> span[data-task=s-a]) span[data-task=s-c]").count() == 1
    assert tree.locator("li:has(> span[data-task=s-b]) span[data-task=s-d]").count() == 1
    assert "also from s-c" in tree.inner_text()
    islands = page.locator(".island")
    assert islands.count() == 2
    assert "s-a" in islands.nth(0).inner_text() and "s-b" in islands.nth(1).inner_text()
    best = page.locator(".islands .best")
    assert best.get_attribute("data-task") == "s-c"
    assert "pass" in best.inner_text() and "2.40x" in best.inner_text()
    assert "inspired by s-b" in best.inner_text()
    # The search is its bench run's one problem.
    page.goto(f"{ui}/bench/{BENCH}")
    problem = page.locator("table tbody tr", has_text="3_hardswish")
    assert problem.locator("a").first.inner_text() == SEARCH
    assert "s-c" in problem.inner_text() and "pass" in problem.inner_text()
    assert "solved 1/1" in page.locator("pre").first.inner_text()
    page.close()


def test_a_running_task_shows_what_it_is_doing_and_turns_to_success_live(
    ui: str, browser: Any, running: str, tmp_path: Path
) -> None:
    expect = playwright_api.expect
    tasks = browser.new_page(viewport=VIEWPORT)
    tasks.goto(ui)
    row = tasks.locator(f"tr:has(a:text-is('{TASK}'))")
    expect(row.locator(".badge").first).to_have_text("running", timeout=WAIT_MS)
    tasks.evaluate("window.kfNotReloaded = true")

    task = browser.new_page(viewport=VIEWPORT)
    task.goto(f"{ui}/tasks/{TASK}")
    expect(task.locator("#now")).to_contain_text("designer is running", timeout=WAIT_MS)
    shot = task.screenshot()
    (tmp_path / "running.png").write_bytes(shot)
    image = Image.open(io.BytesIO(shot)).convert("RGB")
    assert image.size == (VIEWPORT["width"], VIEWPORT["height"])
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, badges, borders: not blank
    background = max(colours)[0]
    assert image.width * image.height - background > 0.05 * image.width * image.height

    # Both pages follow the task to its end without being reloaded.
    expect(row.locator(".badge").first).to_have_text("success", timeout=WAIT_MS)
    assert tasks.evaluate("window.kfNotReloaded") is True
    expect(task.locator("li.end")).to_contain_text("success", timeout=WAIT_MS)
    expect(task.locator("#now")).to_have_count(0)
    tasks.close()
    task.close()


def test_the_task_page_shows_the_trajectory_as_a_timeline(
    ui: str, browser: Any, settled: str
) -> None:
    page = browser.new_page()
    page.goto(f"{ui}/tasks/{TASK}")
    # After the failed check the conductor's LLM sent the task back to the coder.
    decision = page.locator("li.decision", has_text="after verifier").first
    assert decision.locator(".badge").inner_text() == "llm"
    assert "the LLM chose coder" in decision.inner_text()
    answers = page.locator("li.answer")
    assert (
        "The grid used floor division"
        in answers.filter(has_text="coder answered").nth(1).inner_text()
    )
    prompt = answers.first.locator("details", has_text="prompt")
    prompt.locator("summary").click()
    assert "class Model" in prompt.inner_text()  # the task, in the designer's prompt
    checks = page.locator("li.verify")
    assert checks.count() == 2
    assert checks.nth(0).locator(".badge").inner_text() == "mismatch"
    assert "differ" in checks.nth(0).inner_text()  # the verifier's feedback
    assert checks.nth(1).locator(".badge").inner_text() == "pass"
    diff = checks.nth(1).locator("pre.diff")
    assert "grid = (n_elements // BLOCK_SIZE,)" in diff.locator(".del").inner_text()
    assert "grid = (triton.cdiv(n_elements, BLOCK_SIZE),)" in diff.locator(".add").inner_text()
    assert "binary = 1.000" in page.locator(".facts").inner_text()
    page.close()


def test_llm_text_is_shown_as_text_and_never_run(ui: str, browser: Any, settled: str) -> None:
    page = browser.new_page()
    response = page.goto(f"{ui}/tasks/{TASK}")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    designer = page.locator("li.answer", has_text="designer answered")
    assert INJECTED in designer.locator("pre.reply").inner_text()
    assert page.evaluate("window.kfInjected") is None
    assert page.locator("script", has_text="kfInjected").count() == 0
    assert page.locator("img").count() == 0
    page.close()


def test_the_group_page_shows_rewards_and_advantages(ui: str, browser: Any, settled: str) -> None:
    page = browser.new_page()
    page.goto(f"{ui}/tasks/{TASK}")
    page.locator(".facts a", has_text=GROUP).click()  # the task's group, one click away
    rows = page.locator("table.rollouts tbody tr")
    won = rows.filter(has_text=TASK).inner_text()
    lost = rows.filter(has_text=LATE).inner_text()
    assert "success" in won and "1.000" in won and "0.707" in won
    assert "timeout" in lost and "0.000" in lost and "-0.707" in lost
    page.close()


def test_the_run_page_draws_the_plots(search: str, ui: str, browser: Any, settled: str) -> None:
    page = browser.new_page()
    page.goto(f"{ui}/run")
    assert page.locator("figure svg").count() >= 4
    assert page.locator("a", has_text=GROUP).count() == 1  # the groups worth a look
    assert page.locator("a", has_text=BENCH).count() == 1  # and the bench runs
    page.close()


def test_pages_show_no_credentials_and_refuse_what_is_not_a_task_id(
    ui: str, browser: Any, settled: str
) -> None:
    page = browser.new_page()
    for path in ("/", f"/tasks/{TASK}", f"/groups/{GROUP}", "/run"):
        page.goto(ui + path)
        assert SECRET not in page.content() and "kfuser" not in page.content()
    assert "nats://127.0.0.1:" in page.locator("footer").inner_text()
    missing = page.goto(f"{ui}/tasks/no-such-task")
    assert missing.status == 404 and "no task no-such-task" in page.inner_text("main")
    wildcard = page.goto(f"{ui}/tasks/*")  # a subject wildcard: would read every task
    assert wildcard.status == 404 and "not a task id" in page.inner_text("main")
    page.close()


def test_usage_errors_are_one_line(nats_server: str) -> None:
    bad = run_cli("ui", "--port", "70000", *as_user("reader", nats_server))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "--port 70000" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        busy = run_cli("ui", "--port", port, *as_user("reader", nats_server))
    assert busy.returncode == 2 and busy.stderr.count("\n") == 1, busy.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr


def test_a_browser_shows_the_token_once_and_the_page_goes_on_live(
    guarded_ui: str, browser: Any, settled: str
) -> None:
    expect = playwright_api.expect
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    refused = page.goto(guarded_ui + "/")
    assert refused is not None and refused.status == 401
    assert "needs its token" in page.inner_text("main")
    page.goto(f"{guarded_ui}/?token={UI_TOKEN}")
    assert page.url == guarded_ui + "/"  # the token is not left in the address bar
    expect(page.locator(f"a:text-is('{TASK}')")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#conn")).to_have_text("live", timeout=WAIT_MS)  # the stream too
    page.goto(f"{guarded_ui}/tasks/{TASK}")  # the session holds for other pages
    expect(page.locator("li.end")).to_contain_text("success", timeout=WAIT_MS)
    assert all(UI_TOKEN not in c["value"] for c in context.cookies())
    context.close()
