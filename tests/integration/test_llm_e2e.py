"""The real CLI against local servers that speak the Anthropic and OpenAI APIs, answering
with the relu example's scripted responses; record/replay and budgets end to end."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.log import EventLog
from kernelflow.events.model import AgentFailed, Event, LLMCalled, TaskFinished
from tests.conftest import EXAMPLES, connect, run_cli, user_env
from tests.fake_llm_servers import Failure, FakeAnthropic, FakeOpenAI, ScriptedAnswers

KEY = "sk-ant-api03-E2ESECRET-abcdef0123456789"


def task_events(nats_url: str, task_id: str) -> list[Event]:
    async def read() -> list[Event]:
        nc = await connect(nats_url, "reader")
        try:
            log = EventLog(nc)
            return [e async for _, e in log.read(subject=subjects.task_events(task_id))]
        finally:
            await nc.close()

    return asyncio.run(read())


def run_relu(nats_url: str, tmp_path: Path, llm: str, **env: str) -> dict[str, object]:
    run = run_cli(
        "run",
        "examples/tasks/relu.py",
        "--llm",
        llm,
        "--json",
        "--out",
        str(tmp_path / "out"),
        env=user_env("daemon", nats_url, KF_DATA_DIR=str(tmp_path / "data"), **env),
    )
    assert run.returncode in (0, 1) and run.stdout.strip(), run.stdout + run.stderr
    result: dict[str, object] = json.loads(run.stdout)
    result["stderr"] = run.stderr
    return result


def test_relu_with_anthropic_recorded_then_replayed(private_nats: str, tmp_path: Path) -> None:
    # Private servers here: the fake APIs count calls, and a daemon on a shared server
    # would also serve work other tests left unfinished there.
    nats_url = private_nats
    records = tmp_path / "records"
    with FakeAnthropic(ScriptedAnswers(EXAMPLES / "scripted" / "relu.yaml"), api_key=KEY) as api:
        api.fail_next(Failure(status=529))  # the normal weather: ridden through
        result = run_relu(
            nats_url,
            tmp_path,
            f"record:{records}:anthropic:claude-sonnet-4-5",
            ANTHROPIC_BASE_URL=api.url,
            ANTHROPIC_API_KEY=KEY,
            KF_LLM_MAX_RETRIES="3",
        )
    assert result["status"] == "success", result
    assert result["verifications"][-1] == "pass"
    events = task_events(nats_url, str(result["task_id"]))
    calls = [e for e in events if isinstance(e, LLMCalled)]
    assert [c.agent for c in calls] == ["designer", "coder", "conductor", "coder"]
    assert {c.provider for c in calls} == {"anthropic"}
    assert calls[0].retries == 1 and calls[0].request_id.startswith("req_")
    assert all(c.cost_usd and c.cost_usd > 0 for c in calls)
    assert [m.role for m in calls[0].messages] == ["system", "user"]
    log_text = "".join(encode(e).decode() for e in events)
    assert KEY not in log_text and KEY not in str(result["stderr"])
    assert len(list(records.glob("pos-*.json"))) == 4

    # Replayed: no API at all, another task id, the same run. (The verifier's feedback on
    # the first kernel reads uninitialised memory, so a prompt showing it may differ: the
    # position fallback covers it.)
    replayed = run_relu(nats_url, tmp_path, f"replay:{records}#position")
    assert replayed["status"] == "success", replayed
    calls = [e for e in task_events(nats_url, str(replayed["task_id"])) if isinstance(e, LLMCalled)]
    assert {c.provider for c in calls} == {"replay"}


def test_relu_with_an_openai_compatible_policy_server(private_nats: str, tmp_path: Path) -> None:
    nats_url = private_nats
    scripted = ScriptedAnswers(EXAMPLES / "scripted" / "relu.yaml")
    with FakeOpenAI(scripted, model="kernel-policy") as server:
        result = run_relu(nats_url, tmp_path, f"openai:{server.url}/v1#kernel-policy")
    assert result["status"] == "success", result
    calls = [e for e in task_events(nats_url, str(result["task_id"])) if isinstance(e, LLMCalled)]
    assert {(c.provider, c.model) for c in calls} == {("openai", "kernel-policy")}
    for call in calls:
        assert call.token_ids and call.logprobs and len(call.token_ids) == len(call.logprobs)


def test_task_budget_ends_the_task_with_its_own_status(private_nats: str, tmp_path: Path) -> None:
    nats_url = private_nats
    # The designer's scripted call alone uses more than 300 (word-)tokens.
    result = run_relu(
        nats_url,
        tmp_path,
        "scripted:examples/scripted/relu.yaml",
        KF_BUDGET_TASK_TOKENS="300",
    )
    assert result["status"] == "budget_exceeded", result
    events = task_events(nats_url, str(result["task_id"]))
    failed = [e for e in events if isinstance(e, AgentFailed)]
    assert len(failed) == 1 and failed[0].error.startswith("budget exhausted:")
    assert [e.agent for e in events if isinstance(e, LLMCalled)] == ["designer"]
    finished = [e for e in events if isinstance(e, TaskFinished)]
    assert len(finished) == 1 and finished[0].status == "budget_exceeded"


def test_an_api_nothing_answers_at_is_refused_before_the_run(
    private_nats: str, tmp_path: Path
) -> None:
    run = run_cli(
        "run",
        "examples/tasks/relu.py",
        "--llm",
        "anthropic:claude-x",
        env=user_env(
            "daemon",
            private_nats,
            KF_DATA_DIR=str(tmp_path / "data"),
            ANTHROPIC_BASE_URL="http://127.0.0.1:9",
            ANTHROPIC_API_KEY=KEY,
        ),
        timeout=60,
    )
    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr == (
        "kernelflow: LLM anthropic:claude-x: nothing answers at http://127.0.0.1:9 "
        "(connection refused)\n"
    )


def test_an_api_that_fails_every_call_fails_the_task_not_the_daemon(
    private_nats: str, tmp_path: Path
) -> None:
    # A server of its own: on the shared one, this run's daemon would also take work
    # other tests left unfinished there, with an API that fails it.
    nats_url = private_nats
    with FakeAnthropic(api_key=KEY) as api:
        api.fail_next(*[Failure(status=500)] * 2)  # the designer's call and its retry
        result = run_relu(
            nats_url,
            tmp_path,
            "anthropic:claude-x",
            ANTHROPIC_BASE_URL=api.url,
            ANTHROPIC_API_KEY=KEY,
            KF_LLM_MAX_RETRIES="1",
        )
    assert result["status"] == "failed"
    events = task_events(nats_url, str(result["task_id"]))
    failed = [e for e in events if isinstance(e, AgentFailed)]
    assert failed and "gave up after 2 attempts" in failed[0].error
    assert KEY not in "".join(encode(e).decode() for e in events)
