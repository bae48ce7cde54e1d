"""The versions pinned on a task (kernelflow.actors.pins; docs/workflows.md, "Versions
pinned on a task"): the LLM spec of each agent, credentials scrubbed, one ``llm`` where
all agents share it; and what differs from today, said as ``name: then → now``."""

from __future__ import annotations

from dataclasses import dataclass

from kernelflow.actors.pins import differences, llm_specs, pinned_versions, toolchain
from kernelflow.llm.config import AgentLLM, LLMConfig
from kernelflow.verification.engine import VERIFIER_VERSION


@dataclass
class Router:
    config: LLMConfig


def test_the_llm_of_each_agent_is_pinned_without_its_credentials() -> None:
    shared = Router(LLMConfig(provider="scripted:a.yaml"))
    assert llm_specs(shared, ["conductor", "coder"]) == {"llm": "scripted:a.yaml"}
    own = LLMConfig(
        provider="scripted:a.yaml",
        agents={"coder": AgentLLM(provider="openai:https://user:s3cret@llm.example/v1#m")},
    )
    specs = llm_specs(Router(own), ["conductor", "coder"])
    assert set(specs) == {"llm.conductor", "llm.coder"}
    assert specs["llm.conductor"] == "scripted:a.yaml" and "s3cret" not in specs["llm.coder"]
    assert llm_specs(None, ["coder"]) == {}


def test_a_task_pins_its_workflow_text_verifier_policy_toolchain_and_llm() -> None:
    pinned = pinned_versions("agent_info: {}\n", "kernelbench", {"llm": "scripted:a.yaml"})
    assert pinned["verifier"] == str(VERIFIER_VERSION) and pinned["policy"] == "kernelbench"
    assert len(pinned["workflow_sha256"]) == 64 and pinned["llm"] == "scripted:a.yaml"
    assert {k: pinned[k] for k in ("torch", "triton", "compiler")} == toolchain()
    assert (
        pinned_versions("other: 1\n", "kernelbench", {})["workflow_sha256"]
        != pinned["workflow_sha256"]
    )


def test_what_differs_is_said_and_what_is_not_known_today_is_not_compared() -> None:
    then = {"verifier": "3", "torch": "2.3.0", "workflow_sha256": "a" * 64, "llm": "x"}
    now = {"verifier": "4", "torch": "2.3.0", "workflow_sha256": "b" * 64}
    assert differences(then, now) == [
        "verifier: 3 → 4",
        "workflow text: aaaaaaaaaaaa → bbbbbbbbbbbb (sha256)",
    ]
    assert differences({}, now) == []  # a task recorded before versions were pinned
