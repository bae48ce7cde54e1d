"""``kernelflow report --html``: a page with the run's plots and the report's tables, run
as a user would on a log that real tasks wrote (a daemon, a group of three ReLU samples
and one more task whose name is markup), and the plots' contracts (no timing is never 0,
capped groups are said to be capped)."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kernelflow.cli import plots
from kernelflow.cli.html_report import report_page
from kernelflow.projections.metrics import TaskMetrics
from kernelflow.projections.statistics import run_metrics
from tests.conftest import EXAMPLES, KERNELFLOW, REPO, as_user, cli_env, keyed_nats, run_cli
from tests.daemons import start_daemon

MARKUP_NAME = "<img src=x onerror=alert(1)>"
SVG = "{http://www.w3.org/2000/svg}"
PLOT_TITLES = [
    "Verdicts over time",
    "Steps and tokens per task",
    "Reward per group",
    "fast_p by speedup threshold p",
    "Speedup over the baseline",
]


@pytest.fixture(scope="module")
def run_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A NATS whose log holds four finished tasks: three samples of one group, and one
    whose task file's name (and so the task's name) is an HTML tag."""
    tmp = tmp_path_factory.mktemp("report-html")
    markup_task = tmp / f"{MARKUP_NAME}.py"
    shutil.copy(EXAMPLES / "tasks" / "relu.py", markup_task)
    with keyed_nats(tmp / "nats") as url:
        daemon = start_daemon(url, tmp / "daemon.log", "--pool", "verifier=4")
        try:
            submits = [
                [
                    "examples/tasks/relu.py",
                    "--samples",
                    "3",
                    "--group",
                    "relu-grp",
                    "--task-id",
                    "relu",
                ],
                [str(markup_task), "--task-id", "markup"],
            ]
            waiting = [
                subprocess.Popen(
                    [
                        *KERNELFLOW,
                        "submit",
                        *args,
                        "--wait",
                        "--timeout",
                        "120",
                        *as_user("publisher", url),
                    ],
                    cwd=REPO,
                    env=cli_env(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for args in submits
            ]
            for submit in waiting:
                out, _ = submit.communicate(timeout=180)
                assert submit.returncode == 0, out
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(30)
        yield url


class Page(HTMLParser):
    """What a browser would see of the page: elements, their attributes, and texts."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.open: list[str] = []
        self.svg_titles: list[str] = []
        self.captions: list[str] = []
        self.cells: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self.open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        where = self.open[-1] if self.open else ""
        if where == "title" and "svg" in self.open:
            self.svg_titles.append(data)
        elif where == "figcaption":
            self.captions.append(data)
        elif where == "td":
            self.cells.append(data)

    def named(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for t, attrs in self.tags if t == tag]


def test_report_html_writes_a_page_of_plots_and_tables(run_log: str, tmp_path: Path) -> None:
    out = tmp_path / "pages" / "x.html"
    result = run_cli("report", "--html", "--out", str(out), *as_user("reader", run_log))
    assert result.returncode == 0, result.stderr
    assert f"wrote {out}: 4 tasks" in result.stdout
    assert [p.name for p in out.parent.iterdir()] == ["x.html"]  # no partial file left
    text = out.read_text(encoding="utf-8")
    page = Page(text)

    # Five inline plots, each titled, each in its figure with a caption.
    assert len(page.named("svg")) == 5
    assert [t.split(" (")[0] for t in page.svg_titles] == PLOT_TITLES
    assert len(page.named("figure")) == len(page.captions) == 5
    assert "Reward per group (1 group of more than one task)" in page.svg_titles
    # Triton on the CPU is never timed: said so, not drawn as 0.
    assert "fast_p by speedup threshold p (partly untimed)" in page.svg_titles
    assert "Speedup over the baseline (0 kernels)" in page.svg_titles
    assert "no timing" in text

    # The tables of the text report, cell for cell.
    for task_id in ("relu-1", "relu-2", "relu-3", "markup"):
        assert page.cells.count(task_id) == 1, task_id  # one row each
    terminal = run_cli("report", *as_user("reader", run_log))
    assert terminal.returncode == 0, terminal.stderr
    for heading in ("Tasks", "Summary (rates", "Per agent"):
        assert heading in terminal.stdout
        assert any(h.startswith(heading) for h in _texts_of(text, "h2"))
    assert "workflow default" in page.cells

    # The task named after a tag is its text, nowhere an element.
    assert MARKUP_NAME in page.cells
    assert not page.named("img") and "<img" not in text

    # Nothing to fetch: no scripts, stylesheets or frames; links only within the page.
    assert not page.named("script") and not page.named("link") and not page.named("iframe")
    for tag, attrs in page.tags:
        assert "src" not in attrs, tag
        for name in ("href", "xlink:href"):
            assert (attrs.get(name) or "#").startswith("#"), (tag, attrs)
        assert "url(http" not in (attrs.get("style") or "")
    ids = [attrs["id"] for _, attrs in page.tags if attrs.get("id")]
    assert len(ids) == len(set(ids)), "element ids repeat across the inline plots"


def _texts_of(text: str, tag: str) -> list[str]:
    found: list[str] = []

    class Collect(HTMLParser):
        inside = False

        def handle_starttag(self, t: str, attrs: list[tuple[str, str | None]]) -> None:
            self.inside = t == tag

        def handle_data(self, data: str) -> None:
            if self.inside:
                found.append(data)
                self.inside = False

    Collect().feed(text)
    return found


def test_plain_reports_need_no_matplotlib_and_html_says_what_to_install(
    run_log: str, tmp_path: Path
) -> None:
    """Without matplotlib (its import blocked), the terminal report works, and --html
    stops with one line naming the extra to install."""
    out = tmp_path / "x.html"

    def without_matplotlib(*args: str) -> subprocess.CompletedProcess[str]:
        code = (
            "import sys; sys.modules['matplotlib'] = None\n"
            "from kernelflow.cli.main import main\n"
            f"sys.exit(main({list(args)!r}))"
        )
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=60
        )

    plain = without_matplotlib("report", *as_user("reader", run_log))
    assert plain.returncode == 0 and "Tasks" in plain.stdout, plain.stderr
    refused = without_matplotlib("report", "--html", "--out", str(out), *as_user("reader", run_log))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "kernelflow: report --html needs matplotlib: pip install 'kernelflow[report]'"
    ]
    assert not out.exists()
    needs_out = run_cli("report", "--html", *as_user("reader", run_log))
    assert needs_out.returncode == 2 and "--html needs --out FILE" in needs_out.stderr


def measured_points(svg: str) -> int:
    """Markers of the fast_p curve's measured line."""
    root = ET.fromstring(svg)
    (line,) = (g for g in root.iter(f"{SVG}g") if g.get("id") == "kf-fast_p-measured")
    return len(list(line.iter(f"{SVG}use")))


def test_fast_p_curve_shows_no_timing_as_such_never_as_zero() -> None:
    partly = plots.fast_p_curve({0.0: 0.75, 0.5: None, 1.0: 0.25, 2.0: None})
    assert measured_points(partly) == 2  # the two Nones are not points at 0
    assert partly.count(">no timing<") == 2
    assert "<title>fast_p by speedup threshold p (partly untimed)</title>" in partly
    untimed = plots.fast_p_curve({0.5: None, 1.0: None})
    assert measured_points(untimed) == 0 and untimed.count(">no timing<") == 2
    assert "(no timing)</title>" in untimed
    timed = plots.fast_p_curve({0.0: 1.0, 1.0: 0.5})
    assert measured_points(timed) == 2 and "no timing" not in timed


def test_speedup_histogram_counts_what_it_draws() -> None:
    svg = plots.speedup_histogram([0.5, 2.0, 2.0, float("nan"), 0.0])
    assert "<title>Speedup over the baseline (3 kernels, 2 invalid left out)</title>" in svg
    assert "geomean 1.26x" in svg
    assert "no timing" in plots.speedup_histogram([])


def test_the_page_says_how_many_groups_it_leaves_out() -> None:
    """More groups than are drawn: the plot's title and the page's caption say so; markup
    in a task name is escaped in the plots too."""
    tasks = [
        TaskMetrics(
            task_id=f"t{i}",
            task_name="<b>bold</b>",
            group_id=f"g{i // 2}",
            status="success" if i % 3 else "failed",
            submitted_at=1000.0 + i,
            ended_at=1010.0 + i,
            verdicts=("pass",),
        )
        for i in range(2 * (plots.MAX_GROUPS + 3))
    ]
    text = report_page(
        run_metrics(tasks),
        {},
        tasks,
        None,
        fast_ps=(0.0, 1.0),
        generated_at=datetime(2025, 1, 1, tzinfo=UTC),
    )
    page = Page(text)
    total = plots.MAX_GROUPS + 3
    assert f"Reward per group ({plots.MAX_GROUPS} of {total} groups" in page.svg_titles[2]
    assert f"Only the first {plots.MAX_GROUPS} of {total} are drawn." in page.captions[2]
    assert "<b>" not in text and not page.named("b")


def test_the_plots_judge_kernels_by_the_verifier_version_the_tables_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``report --html --verifier-version N``: the rewards, fast_p and speedups drawn are
    those of the newest check by a verifier no newer than N, as in the tables."""
    from kernelflow.cli import html_report

    def task(task_id: str, revisions: tuple[tuple[int, str, float | None], ...]) -> TaskMetrics:
        return TaskMetrics(
            task_id=task_id,
            group_id="g",
            status="success",
            submitted_at=1000.0,
            ended_at=1010.0,
            verdicts=("pass",),
            final_verdict="pass",
            final_speedup=2.0,
            revisions=revisions,
        )

    # Both passed when recorded (verifier 0); verifier 2 refuses the hack. (Groups list
    # their tasks by submission, then id: "hack" first.)
    tasks = [task("legit", ()), task("hack", ((2, "rejected_static", None),))]
    drawn: dict[str, object] = {}
    monkeypatch.setattr(
        plots, "reward_distribution_per_group", lambda groups, **_: drawn.update(rewards=groups)
    )
    monkeypatch.setattr(plots, "fast_p_curve", lambda f: drawn.update(fast_p=f))
    monkeypatch.setattr(plots, "speedup_histogram", lambda s: drawn.update(speedups=list(s)))
    html_report.report_plots(tasks, None, (0.0, 1.0))
    assert drawn == {
        "rewards": {"g": [0.0, 1.0]},
        "fast_p": {0.0: 0.5, 1.0: 0.5},
        "speedups": [2.0],
    }
    html_report.report_plots(tasks, None, (0.0, 1.0), verifier_version=0)
    assert drawn == {
        "rewards": {"g": [1.0, 1.0]},
        "fast_p": {0.0: 1.0, 1.0: 1.0},
        "speedups": [2.0, 2.0],
    }


CHROMIUM = Path("/usr/bin/chromium")


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium: apt-get install chromium")
def test_the_page_as_a_browser_shows_it(tmp_path: Path) -> None:
    """The page in headless Chromium: every label of every plot inside its plot; time
    ticks each a whole time of day (the date in the axis label); long task ids cut in the
    middle so that samples stay apart; a plot with nothing to draw a strip, not a plot's
    space."""
    playwright = pytest.importorskip("playwright.sync_api")
    start = datetime(2026, 3, 1, 23, 59, 20, tzinfo=UTC).timestamp()  # across midnight
    tasks = [
        TaskMetrics(
            task_id=f"rollout-of-the-arithmetic-dataset-sample-{i}",
            task_name="relu",
            group_id="g",
            status="success",
            submitted_at=start + 20 * i,
            ended_at=start + 20 * i + 15,
            steps=3,
            input_tokens=500,
            output_tokens=100,
            verdicts=("mismatch", "pass"),
            final_verdict="pass",
        )
        for i in range(1, 4)
    ]
    page_file = tmp_path / "report.html"
    page_file.write_text(
        report_page(
            run_metrics(tasks),
            {},
            tasks,
            None,
            fast_ps=(0.0, 1.0),
            generated_at=datetime(2026, 3, 2, tzinfo=UTC),
        ),
        encoding="utf-8",
    )
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"], timeout=60_000
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(page_file.as_uri(), timeout=60_000)
            shown = page.evaluate(
                """() => {
                const ancestors = (e, svg) => {
                    const ids = [];
                    for (; e && e !== svg; e = e.parentElement) if (e.id) ids.push(e.id);
                    return ids.join(' ');
                };
                return [...document.querySelectorAll('svg')].map(svg => {
                    const box = svg.getBoundingClientRect();
                    const texts = [...svg.querySelectorAll('text')].map(t => {
                        const r = t.getBoundingClientRect();
                        return {text: t.textContent, ids: ancestors(t, svg),
                                inside: r.left >= box.left - 1 && r.right <= box.right + 1
                                        && r.top >= box.top - 1 && r.bottom <= box.bottom + 1};
                    });
                    return {title: svg.querySelector('title').textContent,
                            height: box.height, texts};
                });
                }"""
            )
        finally:
            browser.close()
    by_title = {plot["title"].split(" (")[0]: plot for plot in shown}
    assert list(by_title) == PLOT_TITLES
    for plot in shown:
        cut = [t["text"] for t in plot["texts"] if not t["inside"]]
        assert not cut, (plot["title"], cut)
    verdicts = by_title["Verdicts over time"]["texts"]
    ticks = [t["text"] for t in verdicts if "xtick" in t["ids"]]
    assert ticks and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", tick) for tick in ticks), ticks
    assert any("2026-03-01 to 2026-03-02" in t["text"] for t in verdicts)
    rows = [
        t["text"] for t in by_title["Steps and tokens per task"]["texts"] if "ytick" in t["ids"]
    ]
    assert len(set(rows)) == 3 and all(
        "…" in r and r.endswith(f"-{i}") for i, r in enumerate(rows, 1)
    )
    # Nothing was timed: the speedup plot says so in a strip; the others are drawn.
    empty = by_title["Speedup over the baseline"]
    assert any(t["text"] == "no timing: no speedup measured" for t in empty["texts"])
    drawn = [plot["height"] for plot in shown if plot is not empty]
    assert empty["height"] < 100 < min(drawn)
