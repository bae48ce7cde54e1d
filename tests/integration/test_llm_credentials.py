"""Credentials never reach the log, the daemon's output or an error.

Reported: ``--llm openai:http://user:pass@host/v1#model`` recorded the password with
every call (``llm_called``'s ``base_url``) and in every ``agent_failed`` error that quoted
the URL, printed it in request logs, and sent it as Basic auth in place of the configured
bearer key. A URL with credentials is now refused, without quoting them, and the errors
recorded for good are scrubbed of whatever looks like a credential."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import Daemon, DaemonConfig
from kernelflow.events import subjects
from kernelflow.events.codec import encode
from kernelflow.events.model import AgentFailed, SubmitTask
from kernelflow.llm import LLMError, make_provider
from kernelflow.llm.anthropic import AnthropicProvider
from kernelflow.llm.base import LLMRequest, LLMResponse
from kernelflow.llm.config import Limits, LLMConfig, ProviderSpecError
from kernelflow.llm.gateway import Gateway
from kernelflow.llm.openai import OpenAIProvider
from kernelflow.llm.scripted import ScriptedProvider
from tests.conftest import EXAMPLES, role_auth
from tests.daemons import wait_until_settled
from tests.fake_llm_servers import FakeOpenAI
from tests.integration.test_llm_providers import OPENAI_KEY, request

PASSWORD = "hunter2-correct-horse"
RELU = (EXAMPLES / "tasks" / "relu.py").read_text()


@pytest.fixture
def openai_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv("KF_OPENAI_API_KEY", OPENAI_KEY)
    with FakeOpenAI(api_key=OPENAI_KEY) as server:
        yield server


@pytest.mark.parametrize(
    "userinfo", [f"alice:{PASSWORD}@", f"{PASSWORD}@", f"alice:pa#ss{PASSWORD}@"]
)
def test_an_openai_url_with_credentials_is_refused_without_quoting_them(
    openai_server: FakeOpenAI, userinfo: str
) -> None:
    url = openai_server.url.replace("http://", f"http://{userinfo}")
    with pytest.raises(ProviderSpecError) as refused:
        make_provider(f"openai:{url}/v1#m", LLMConfig())
    message = str(refused.value)
    assert "carries credentials" in message and "KF_OPENAI_API_KEY" in message
    assert PASSWORD not in message and "alice" not in message
    with pytest.raises(ProviderSpecError):
        OpenAIProvider(f"{url}/v1", "m", Gateway("openai", Limits()))
    assert openai_server.seen == []  # nothing was sent anywhere


def test_the_configured_key_is_sent_as_the_bearer(
    openai_server: FakeOpenAI,
) -> None:
    provider = make_provider(f"openai:{openai_server.url}/v1#m", LLMConfig())
    asyncio.run(provider.complete(request()))
    assert openai_server.seen[-1].headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_an_anthropic_base_url_with_credentials_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", f"https://bob:{PASSWORD}@llm.example/")
    with pytest.raises(ProviderSpecError) as refused:
        AnthropicProvider("claude-test", Gateway("anthropic", Limits()))
    assert PASSWORD not in str(refused.value) and "ANTHROPIC_API_KEY" in str(refused.value)


class LeakyDesigner:
    """Fails the designer's calls with errors that quote credentials: as a provider's
    error (``LLMError``, recorded at once) for one task, as a bug (given up on) for the
    other."""

    name = "leaky"

    def __init__(self) -> None:
        self.script = ScriptedProvider(EXAMPLES / "scripted" / "relu.yaml")

    async def complete(self, request: LLMRequest) -> LLMResponse:
        if request.agent != "designer":
            return await self.script.complete(request)
        where = f"http://alice:{PASSWORD}@10.0.0.7/v1 (Authorization: Bearer {OPENAI_KEY})"
        if request.task_id == "provider-error":
            raise LLMError(f"openai: connection failed: {where}")
        raise RuntimeError(f"a bug, posting to {where}")


def test_errors_recorded_for_good_are_scrubbed_of_credentials(private_nats: str) -> None:
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    config = DaemonConfig(roles=("conductor", "designer"), llm=LeakyDesigner(), max_deliveries=1)
    daemon = Daemon(bridge, config).start()
    try:
        for task_id in ("provider-error", "given-up"):
            command = SubmitTask(task_id=task_id, task_source=RELU)
            bridge.call(bridge.commands.publish(command, subjects.SUBMIT))
        histories = {t: wait_until_settled(private_nats, t) for t in ("provider-error", "given-up")}
    finally:
        daemon.stop()
        bridge.stop()
    for task_id, events in histories.items():
        failures = [e for e in events if isinstance(e, AgentFailed)]
        assert failures, task_id
        assert all("http://***@10.0.0.7/v1" in f.error for f in failures), failures
        recorded = b"".join(encode(e) for e in events).decode()
        assert PASSWORD not in recorded and OPENAI_KEY not in recorded and "alice" not in recorded
