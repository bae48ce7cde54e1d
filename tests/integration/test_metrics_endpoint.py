"""A daemon's Prometheus metrics, as an operator scrapes them: a real `kernelflow daemon
--metrics-port` runs one task to success with a scripted LLM, /metrics is read over HTTP
and parsed with prometheus_client's own parser, and the shipped Grafana dashboard is
checked against what the daemon exposes."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kernelflow.events.log import TaskHistory
from kernelflow.events.model import AgentDispatched, AgentFailed, Event
from kernelflow.host.observability import Telemetry
from kernelflow.telemetry.prometheus import DaemonMetrics
from tests.conftest import REPO, cli_env, creds, keyed_nats, run_cli
from tests.daemons import start_daemon, submit, wait_for_line, wait_until_settled

TASK = "metrics-relu-1"
NATS_PASSWORD = "n4ts-pass-word-never-shown"
API_KEY = "sk-ant-api03-never-shown-in-metrics"
DASHBOARD = REPO / "deploy/grafana/kernelflow.json"
NOWHERE = "nats://127.0.0.1:9"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Scraped:
    text: str
    port: int

    def samples(self, name: str, **labels: str) -> list[Sample]:
        return [
            s
            for family in text_string_to_metric_families(self.text)
            for s in family.samples
            if s.name == name and labels.items() <= s.labels.items()
        ]

    def value(self, name: str, **labels: str) -> float:
        found = self.samples(name, **labels)
        assert len(found) == 1, (name, labels, found)
        return found[0].value

    def families(self) -> set[str]:
        return {family.name for family in text_string_to_metric_families(self.text)}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    """One daemon (every role) with its metrics on, after one task ran to success. Its
    NATS URL carries a password and its environment an API key: neither may show."""
    tmp = tmp_path_factory.mktemp("metrics")
    port = free_port()
    with keyed_nats(tmp / "nats") as url:
        # The server asks for its keys: the URL's user and password go along unused.
        secret_url = url.replace("nats://", f"nats://kf:{NATS_PASSWORD}@")
        log = tmp / "daemon.log"
        daemon = start_daemon(
            secret_url,
            log,
            "--creds",
            str(creds(url, "daemon")),
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
            ANTHROPIC_API_KEY=API_KEY,
            KF_OPENAI_API_KEY=API_KEY,
        )
        try:
            wait_for_line(log, "kernelflow daemon on")
            submit(url, TASK)
            wait_until_settled(url, TASK)
            text = scrape(port)
            # The read model folds the log a moment after the appends: scrape until it is there.
            for _ in range(50):
                got = Scraped(text, port)
                if got.value("kernelflow_readmodel_position") == got.value(
                    "kernelflow_log_last_sequence"
                ):
                    break
                text = scrape(port)
            yield Scraped(text, port)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=60)


def test_the_finished_task_is_counted_by_status(scraped: Scraped) -> None:
    assert scraped.value("kernelflow_tasks_finished_total", status="success") == 1
    assert scraped.value("kernelflow_tasks_finished_total", status="failed") == 0
    assert scraped.value("kernelflow_tasks_submitted_total") == 1
    assert scraped.value("kernelflow_task_duration_seconds_count", status="success") == 1


def test_steps_llm_calls_and_verdicts(scraped: Scraped) -> None:
    # relu.yaml: designer, coder, verifier (mismatch), coder, verifier (pass).
    steps = "kernelflow_step_duration_seconds_count"
    assert scraped.value(steps, agent="designer", outcome="ok") == 1
    assert scraped.value(steps, agent="coder", outcome="ok") == 2
    assert scraped.value(steps, agent="verifier", outcome="ok") == 2
    verdicts = "kernelflow_verification_duration_seconds_count"
    assert scraped.value(verdicts, verdict="mismatch", device="cpu") == 1
    assert scraped.value(verdicts, verdict="pass", device="cpu") == 1
    calls = "kernelflow_llm_call_duration_seconds_count"
    assert scraped.value(calls, agent="coder", model="relu.yaml") == 2
    tokens = "kernelflow_llm_tokens_total"
    assert scraped.value(tokens, agent="coder", model="relu.yaml", type="input") > 0
    assert scraped.value(tokens, agent="designer", model="relu.yaml", type="output") > 0
    assert scraped.value("kernelflow_decision_latency_seconds_count", mode="auto") >= 4
    assert scraped.value("kernelflow_give_ups_total", role="coder") == 0


def test_queues_and_read_model_position(scraped: Scraped) -> None:
    for role in ("conductor", "designer", "coder", "verifier"):
        assert scraped.samples("kernelflow_consumer_pending_messages", role=role)
        assert scraped.samples("kernelflow_pool_actors", role=role)
    assert scraped.value("kernelflow_pool_actors", consumer="kf-agent-verifier") == 1
    assert scraped.value("kernelflow_nats_connected") == 1
    end = scraped.value("kernelflow_log_last_sequence")
    assert end > 0 and scraped.value("kernelflow_readmodel_position") == end
    assert scraped.value("kernelflow_readmodel_tasks") == 1


def test_no_secret_reaches_the_metrics(scraped: Scraped) -> None:
    assert NATS_PASSWORD not in scraped.text
    assert API_KEY not in scraped.text
    assert "kf:" not in scraped.text  # the URL's user-info


def test_the_dashboard_queries_only_exported_metrics(scraped: Scraped) -> None:
    """Every expression of deploy/grafana/kernelflow.json names metrics this daemon
    exposes (a renamed metric would leave a panel empty, silently)."""
    exported = {_family(name) for name in scraped.families()}
    exprs = [t["expr"] for p in _panels(json.loads(DASHBOARD.read_text())) for t in p["targets"]]
    assert len(exprs) >= 10
    for expr in exprs:
        names = re.findall(r"\b(?:kernelflow|process)_[a-z0-9_]+", expr)
        assert names, f"names no metric: {expr}"
        unknown = [n for n in names if _family(n) not in exported]
        assert not unknown, f"{unknown} in {expr!r} are not exposed by the daemon"


def _family(sample_name: str) -> str:
    return re.sub(r"_(bucket|count|sum|total|info)$", "", sample_name)


def _panels(dashboard: dict[str, object]) -> Iterator[dict[str, list[dict[str, str]]]]:
    for panel in dashboard["panels"]:  # type: ignore[attr-defined]
        yield from (panel.get("panels") or [])
        if panel.get("targets"):
            yield panel


def test_a_port_in_use_is_one_line_and_exit_2(scraped: Scraped) -> None:
    run = run_cli(
        "daemon", "--metrics-port", str(scraped.port), "--metrics-host", "127.0.0.1",
        "--nats-url", NOWHERE,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "cannot listen on 127.0.0.1" in run.stderr


def test_metrics_asked_for_without_the_package(tmp_path: Path) -> None:
    """Without prometheus_client the daemon says what to install, in one line."""
    blocker = tmp_path / "prometheus_client"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('blocked', name='prometheus_client')\n")
    env = cli_env(PYTHONPATH=str(tmp_path))
    run = run_cli("daemon", "--metrics-port", str(free_port()), "--nats-url", NOWHERE, env=env)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1
    assert "pip install 'kernelflow[observability]'" in run.stderr


def test_metrics_off_by_default_import_nothing() -> None:
    code = (
        "import sys, kernelflow.cli.main, kernelflow.host.observability\n"
        "from kernelflow.host.settings import Settings\n"
        "t = kernelflow.host.observability.start_telemetry(Settings(), ['coder'], 'd', {})\n"
        "assert t.after_append is None and t.on_message is None\n"
        "print(sorted(m for m in sys.modules if m.startswith(('prometheus_client', "
        "'opentelemetry.sdk'))))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), cwd=REPO
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_give_ups_counted_and_a_telemetry_bug_never_fails_an_append() -> None:
    metrics = DaemonMetrics(["coder"])
    dispatched = AgentDispatched(
        task_id="t", seq=2, at=10.0, agent="coder", step=1, dispatch_id="t:d1"
    )
    failed = AgentFailed(
        task_id="t", seq=3, at=12.5, agent="coder", dispatch_id="t:d1",
        error="gave up after 20 attempts: RuntimeError: boom",
    )  # fmt: skip
    history = TaskHistory("t", (dispatched, failed))
    metrics.after_append(failed, history)
    value = metrics.registry.get_sample_value
    assert value("kernelflow_give_ups_total", {"role": "coder"}) == 1
    labels = {"agent": "coder", "outcome": "failed"}
    assert value("kernelflow_step_duration_seconds_sum", labels) == 2.5

    def broken(event: Event, history: TaskHistory) -> None:
        raise RuntimeError("a bug in a hook")

    telemetry = Telemetry(metrics=metrics)
    metrics.after_append = broken  # type: ignore[method-assign]
    hook = telemetry.after_append
    assert hook is not None
    hook(failed, history)  # logged, not raised: the append it follows stands
