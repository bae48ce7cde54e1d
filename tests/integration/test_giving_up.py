"""Work that fails on every delivery is given up and recorded, so that its task goes on.

JetStream stops delivering a message after the consumer's ``max_deliver``; before these
tests, work that failed that often (a provider plugin raising something other than an
LLMError, a conductor bug) simply stopped, and its task waited forever."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import yaml

from kernelflow.actors.bridge import Bridge
from kernelflow.actors.daemon import Daemon, DaemonConfig
from kernelflow.events import subjects
from kernelflow.events.model import AgentFailed, LLMCalled, SubmitTask, TaskFinished
from kernelflow.llm.base import LLMRequest, LLMResponse
from kernelflow.llm.scripted import ScriptedProvider
from tests.conftest import EXAMPLES, role_auth
from tests.daemons import task_events, wait_until_settled

ATTEMPTS = 2
WORKFLOW = {
    "agent_info": {
        "designer": {
            "possible_next_agent": ["finish"],
            "output_format": {
                "parser_name": "designer_parser",
                "parser_definition": {
                    "output_fields": {
                        "code": {
                            "field_type": "str",
                            "mandatory": True,
                            "field_description": "a sketch of the kernel",
                        }
                    }
                },
            },
        }
    },
    "start_agent": "designer",
    "limitation_info": {"required": {"max_step": 3}},
}


class BuggyProvider:
    """A provider plugin with a bug for some agents: it raises something that is not an
    LLMError (which would be recorded as the agent's failure at once). Other agents are
    answered from the relu script."""

    name = "buggy"

    def __init__(self, *broken_for: str) -> None:
        self.script = ScriptedProvider(EXAMPLES / "scripted" / "relu.yaml")
        self.broken_for = broken_for
        self.calls: Counter[str] = Counter()

    async def complete(self, request: LLMRequest) -> LLMResponse:
        self.calls[request.agent] += 1
        if request.agent in self.broken_for:
            raise RuntimeError(f"{request.agent}: a bug in the provider")
        return await self.script.complete(request)


@pytest.fixture
def bridge(private_nats: str) -> Iterator[Bridge]:
    bridge = Bridge(private_nats, auth=role_auth(private_nats, "daemon")).start()
    yield bridge
    bridge.stop()


def run_task(bridge: Bridge, url: str, provider: BuggyProvider, **workflow: object) -> TaskFinished:
    """One task through a daemon that gives work up after ``ATTEMPTS`` deliveries, one
    second apart; its finish."""
    config = DaemonConfig(
        roles=("conductor", "designer"),
        llm=provider,
        ack_wait_s=1.0,  # also the delay before a failed job is delivered again
        max_deliveries=ATTEMPTS,
    )
    daemon = Daemon(bridge, config).start()
    try:
        command = SubmitTask(
            task_id="t1",
            task_name="relu",
            task_source=(EXAMPLES / "tasks" / "relu.py").read_text(),
            workflow_name="giving-up",
            workflow_yaml=yaml.safe_dump({**WORKFLOW, **workflow}),
        )
        bridge.call(bridge.commands.publish(command, subjects.SUBMIT))
        events = wait_until_settled(url, "t1", timeout_s=60)
    finally:
        daemon.stop()
    return next(e for e in events if isinstance(e, TaskFinished))


def test_an_agent_whose_work_fails_on_every_delivery_fails_its_dispatch(
    bridge: Bridge, private_nats: str
) -> None:
    provider = BuggyProvider("designer")
    started = time.monotonic()
    finished = run_task(bridge, private_nats, provider)
    assert time.monotonic() - started < 30
    assert provider.calls["designer"] == ATTEMPTS  # tried on each delivery, then given up
    [failed] = [e for e in task_events(private_nats, "t1") if isinstance(e, AgentFailed)]
    assert failed.agent == "designer"
    assert failed.error == (
        f"gave up after {ATTEMPTS} attempts: RuntimeError: designer: a bug in the provider"
    )
    assert finished.status == "failed"


def test_a_decision_that_fails_on_every_delivery_ends_the_task_with_the_reason(
    bridge: Bridge, private_nats: str
) -> None:
    provider = BuggyProvider("conductor")  # asked after the designer, which answers
    finished = run_task(bridge, private_nats, provider, mandatory_llm_analysis=["designer"])
    assert provider.calls == {"designer": 1, "conductor": ATTEMPTS}
    assert finished.status == "failed"
    assert finished.reason == (
        f"conductor gave up after {ATTEMPTS} attempts: RuntimeError: conductor: a bug in the "
        "provider"
    )
    events = task_events(private_nats, "t1")
    assert not [e for e in events if isinstance(e, LLMCalled) and e.agent == "conductor"]
