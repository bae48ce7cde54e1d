"""LLM providers against local servers that speak the real HTTP APIs (no SDK mocks)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelflow.events.codec import encode
from kernelflow.events.model import ChatMessage
from kernelflow.llm import BUDGET_EXHAUSTED, LLMError, make_provider
from kernelflow.llm.base import LLMRequest, LLMResponse, llm_called
from kernelflow.llm.config import (
    AgentLLM,
    Budgets,
    Limits,
    LLMConfig,
    Price,
    ProviderSpecError,
)
from kernelflow.llm.gateway import TokenBucket
from kernelflow.llm.router import ProviderRouter
from tests.fake_llm_servers import Failure, FakeAnthropic, FakeOpenAI

KEY = "sk-ant-api03-TESTSECRET-0123456789abcdef"
OPENAI_KEY = "sk-proj-OPENAISECRET-9876543210"
FAST = Limits(backoff_base_s=0.01, backoff_max_s=0.05, timeout_s=2.0, max_retries=4)


def request(agent: str = "coder", text: str = "write a relu kernel", n: int = 0) -> LLMRequest:
    return LLMRequest(
        task_id="t-llm",
        agent=agent,
        call_index=n,
        messages=[
            ChatMessage(role="system", content=f"You are the {agent}. Static rules and guidance."),
            ChatMessage(role="user", content=text),
        ],
    )


@pytest.fixture
def anthropic_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeAnthropic]:
    with FakeAnthropic(api_key=KEY) as server:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
        monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
        yield server


def router(spec: str, limits: Limits = FAST, **config: object) -> ProviderRouter:
    return make_provider(spec, LLMConfig(limits=limits, **config))  # type: ignore[arg-type]


def run(provider: ProviderRouter, *requests: LLMRequest) -> list[LLMResponse]:
    async def go() -> list[LLMResponse]:
        return list(await asyncio.gather(*(provider.complete(r) for r in requests)))

    return asyncio.run(go())


# --------------------------------------------------------------------------- anthropic


def test_anthropic_exchange_records_usage_cache_cost_and_params(
    anthropic_server: FakeAnthropic,
) -> None:
    provider = router(
        "anthropic:claude-test-1",
        defaults=LLMConfig().defaults,
        prices={"claude-test": Price(input=3.0, output=15.0)},
    )
    first, second = run(provider, request()), run(provider, request(text="again"))
    answer = first[0]
    assert answer.text == "hello from the fake server"
    assert (answer.provider, answer.model, answer.stop_reason) == (
        "anthropic",
        "claude-test-1",
        "end_turn",
    )
    assert answer.request_id.startswith("req_") and answer.retries == 0
    assert answer.params["model"] == "claude-test-1" and answer.params["max_tokens"] == 8192
    # The system prompt is sent as a cached block: written once, then read from the cache.
    sent = anthropic_server.seen[0].body
    assert sent["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert [m["role"] for m in sent["messages"]] == ["user"]
    assert answer.usage.cache_creation_input_tokens > 0
    assert second[0].usage.cache_read_input_tokens == answer.usage.cache_creation_input_tokens
    u = answer.usage
    expected = (
        u.input_tokens * 3 + u.output_tokens * 15 + u.cache_creation_input_tokens * 3.75
    ) / 1e6
    assert answer.cost_usd == pytest.approx(expected)
    assert provider.meter.calls == 2


def test_anthropic_without_credentials_is_refused_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    with pytest.raises(ProviderSpecError, match="no credentials: set ANTHROPIC_API_KEY"):
        router("anthropic:m")
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "a bearer token")  # the SDK's other way in
    assert router("anthropic:m").provider("anthropic:m").name == "anthropic"


def test_429_with_retry_after_is_honoured(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.fail_next(Failure(status=429, retry_after="0.4"))
    provider = router("anthropic:m")
    started = time.monotonic()
    [answer] = run(provider, request())
    assert answer.retries == 1
    assert time.monotonic() - started >= 0.4
    assert len(anthropic_server.seen) == 2
    gap = anthropic_server.seen[1].at - anthropic_server.seen[0].at
    assert gap >= 0.4


@pytest.mark.parametrize("status", [529, 500, 503])
def test_overloaded_and_server_errors_are_retried(
    anthropic_server: FakeAnthropic, status: int
) -> None:
    anthropic_server.fail_next(Failure(status=status), Failure(status=status))
    [answer] = run(router("anthropic:m"), request())
    assert answer.retries == 2 and answer.text == "hello from the fake server"


def test_a_hang_past_the_timeout_is_cut_and_retried(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.fail_next(Failure(hang_s=10.0))
    limits = Limits(backoff_base_s=0.01, timeout_s=0.3, max_retries=2)
    started = time.monotonic()
    [answer] = run(router("anthropic:m", limits), request())
    # far sooner than the hang (a margin any load leaves)
    assert answer.retries == 1 and time.monotonic() - started < 5.0


def test_retries_run_out_into_a_clear_error(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.fail_next(*[Failure(status=529)] * 3)
    limits = Limits(backoff_base_s=0.01, timeout_s=1.0, max_retries=2)
    with pytest.raises(LLMError, match=r"gave up after 3 attempts: HTTP 529 overloaded_error"):
        run(router("anthropic:m", limits), request())


def test_malformed_body_is_retried_then_reported(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.fail_next(Failure(malformed=True))
    [answer] = run(router("anthropic:m"), request())
    assert answer.retries == 1
    anthropic_server.fail_next(*[Failure(malformed=True)] * 5)
    with pytest.raises(LLMError, match="malformed response"):
        run(router("anthropic:m", Limits(backoff_base_s=0.01, max_retries=1)), request())


def test_client_errors_are_not_retried(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.fail_next(Failure(status=400))
    with pytest.raises(LLMError, match="HTTP 400 invalid_request_error"):
        run(router("anthropic:m"), request())
    assert len(anthropic_server.seen) == 1


def test_concurrency_limit_holds_under_a_burst(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.delay_s = 0.1
    provider = router("anthropic:m", Limits(max_concurrency=3, timeout_s=5))
    started = time.monotonic()
    answers = run(provider, *(request(text=f"call {i}") for i in range(12)))
    assert len(answers) == 12
    assert anthropic_server.peak_in_flight == 3
    assert time.monotonic() - started >= 0.4  # 12 calls / 3 at a time x 0.1 s


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the gateway's rate limits let each call go. The limits are measured there:
    when a request reaches the server depends on the machine's load too (a call let go
    late may arrive right behind the next)."""
    released: list[float] = []
    take = TokenBucket.take

    async def timed_take(self: TokenBucket, amount: float) -> None:
        await take(self, amount)
        released.append(time.monotonic())

    monkeypatch.setattr(TokenBucket, "take", timed_take)
    return released


def test_requests_per_minute_limit_spaces_calls(
    anthropic_server: FakeAnthropic, releases: list[float]
) -> None:
    """600 a minute = one every 0.1 s, with a burst of one (a 0.1 s window): each call
    goes at least 0.1 s after the one before."""
    limits = Limits(requests_per_minute=600, rate_window_s=0.1, timeout_s=5)
    run(router("anthropic:m", limits), *(request(text=f"call {i}") for i in range(6)))
    assert len(releases) == len(anthropic_server.seen) == 6
    assert min(b - a for a, b in itertools.pairwise(releases)) >= 0.1 - 1e-3


def test_tokens_per_minute_limit_spaces_calls(
    anthropic_server: FakeAnthropic, releases: list[float]
) -> None:
    """Each call is estimated at ~10 prompt tokens + 100 max_tokens; 6000 a minute is 100
    every 0.1 s, a 0.11 s window holds one call: four calls span 0.3 s at least."""
    limits = Limits(tokens_per_minute=6000, rate_window_s=0.11, timeout_s=5)
    provider = ProviderRouter(
        LLMConfig(provider="anthropic:m", limits=limits, defaults=AgentLLM(max_tokens=100))
    )
    run(provider, *(request(text=f"call {i}") for i in range(4)))
    assert len(releases) == len(anthropic_server.seen) == 4
    assert releases[-1] - releases[0] >= 0.3 - 1e-3


def test_api_key_never_reaches_events_or_logs(
    anthropic_server: FakeAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    anthropic_server.fail_next(Failure(status=429, retry_after="0"))
    provider = router("anthropic:m")
    [answer] = run(provider, request())
    event = llm_called(request(), answer, dispatch_id="t-llm:d1", cause="t-llm:1")
    assert KEY not in encode(event).decode()
    assert KEY in anthropic_server.seen[0].headers.get("x-api-key", "") + anthropic_server.seen[
        0
    ].headers.get("authorization", "")
    # A rejected key: the error names the problem, never the key.
    anthropic_server.api_key = "another-key"
    with pytest.raises(LLMError) as failure:
        run(provider, request())
    assert "authentication_error" in str(failure.value) and KEY not in str(failure.value)
    assert KEY not in caplog.text


# --------------------------------------------------------------------------- openai


def test_openai_records_token_ids_and_logprobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    with FakeOpenAI(api_key=OPENAI_KEY, model="policy-7b") as server:
        # No #MODEL: the server's model is read from /v1/models.
        provider = router(f"openai:{server.url}/v1")
        [answer] = run(provider, request(text="write it"))
        body = server.seen[-1].body
        assert body["logprobs"] is True and body["return_token_ids"] is True
        assert answer.model == "policy-7b" and answer.provider == "openai"
        words = answer.text.split()
        assert answer.token_ids is not None and len(answer.token_ids) == len(words)
        assert answer.logprobs is not None and len(answer.logprobs) == len(words)
        assert answer.prompt_token_ids and answer.request_id.startswith("oa-")
        event = llm_called(request(text="write it"), answer, dispatch_id="d", cause="c")
        assert event.token_ids == answer.token_ids and event.logprobs == answer.logprobs
        assert OPENAI_KEY not in encode(event).decode()


def test_openai_server_without_extensions_still_gives_logprobs() -> None:
    with FakeOpenAI(strict=True) as server:
        provider = router(f"openai:{server.url}/v1#gpt-test")
        [first] = run(provider, request())
        [second] = run(provider, request(text="again"))
        assert first.logprobs and first.token_ids is None
        assert second.logprobs
        # Refused once (400), then never asked for the extensions again.
        assert [s.body.get("return_token_ids") for s in server.seen] == [True, None, None]


def test_openai_retries_429_and_500() -> None:
    with FakeOpenAI() as server:
        server.fail_next(Failure(status=429, retry_after="0.2"), Failure(status=500))
        [answer] = run(router(f"openai:{server.url}/v1#m"), request())
        assert answer.retries == 2 and answer.token_ids


def test_per_agent_providers_and_parameters(
    anthropic_server: FakeAnthropic, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with FakeOpenAI() as policy:
        config = tmp_path / "llm.yaml"
        config.write_text(
            "provider: anthropic:claude-x\n"
            "temperature: 0.5\n"
            "agents:\n"
            f"  coder: {{provider: 'openai:{policy.url}/v1#policy', temperature: 1.0}}\n"
            "  conductor: {temperature: 0, max_tokens: 512}\n"
        )
        monkeypatch.setenv("KF_LLM_CONFIG", str(config))
        monkeypatch.setenv("KF_AGENT_DESIGNER_MAX_TOKENS", "1000")
        provider = make_provider(None)
        answers = run(provider, request("coder"), request("designer"), request("conductor"))
        assert [a.provider for a in answers] == ["openai", "anthropic", "anthropic"]
        assert policy.seen[-1].body["temperature"] == 1.0
        sent = {s.body["max_tokens"]: s.body["temperature"] for s in anthropic_server.seen}
        assert sent == {1000: 0.5, 512: 0.0}
        assert answers[1].params["max_tokens"] == 1000


# --------------------------------------------------------------------------- record/replay


def test_record_then_replay_round_trip(anthropic_server: FakeAnthropic, tmp_path: Path) -> None:
    records = tmp_path / "records"
    recorded = run(
        router(f"record:{records}:anthropic:claude-rec"),
        request("coder", "first"),
        request("designer", "second"),
    )
    assert len(list(records.glob("[!p]*.json"))) == 2
    served = len(anthropic_server.seen)
    # Another task, another call position: the same prompt gets the same answer.
    replayed = run(
        router(f"replay:{records}"),
        LLMRequest("other-task", "coder", 7, request("coder", "first").messages),
        request("designer", "second"),
    )
    assert len(anthropic_server.seen) == served  # nothing reached the API
    assert [r.text for r in replayed] == [r.text for r in recorded]
    assert [r.usage for r in replayed] == [r.usage for r in recorded]
    assert replayed[0].provider == "replay" and replayed[0].model == "claude-rec"
    assert replayed[0].cost_usd == 0.0
    with pytest.raises(LLMError, match="replay: no recorded answer for this coder request"):
        run(router(f"replay:{records}"), request("coder", "never asked"))
    # By position: an unseen prompt gets the answer the agent's call at its position got.
    [fallback] = run(router(f"replay:{records}#position"), request("coder", "never asked"))
    assert fallback.text == recorded[0].text and fallback.params["replay_match"] == "position"


def test_bad_specs_are_refused_up_front(tmp_path: Path) -> None:
    from kernelflow.llm import ProviderSpecError

    for spec, problem in [
        ("claude:x", "unknown LLM provider 'claude'"),
        ("openai:localhost:8000", "openai needs a base URL"),
        (f"replay:{tmp_path / 'missing'}", "not a directory of records"),
        ("record:only-a-dir", "use record:DIR:SPEC"),
    ]:
        with pytest.raises(ProviderSpecError, match=problem):
            make_provider(spec, LLMConfig())


# --------------------------------------------------------------------------- budgets


def test_run_budget_stops_new_calls(anthropic_server: FakeAnthropic) -> None:
    provider = router("anthropic:m", budgets=Budgets(run_tokens=10))
    run(provider, request())  # ~16 tokens: over the budget once it is recorded
    with pytest.raises(LLMError) as failure:
        run(provider, request(text="one more"))
    assert str(failure.value).startswith(BUDGET_EXHAUSTED)
    assert len(anthropic_server.seen) == 1
