"""What the conductor's LLM reads when it decides (docs/workflows.md, "Routing"): the
task, the work of the agent that just finished (each field up to a bound, cut with a
marker), the last verification and the limits' counters, under a system prompt that
speaks of the task's kind. The conductor and agent actors run on the in-memory log with
scripted models."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kernelflow.actors.agents import LLMAgent
from kernelflow.actors.conductor import Conductor
from kernelflow.actors.prompts import CONDUCTOR_FIELD_CHARS, conductor_messages
from kernelflow.events.log import TaskHistory
from kernelflow.events.model import (
    AgentDispatched,
    ConductorDecided,
    OutputParsed,
    TaskSubmitted,
)
from kernelflow.llm import make_provider
from kernelflow.projections.task_state import fold
from kernelflow.workflows.loader import load_workflow, parse_workflow
from tests.conftest import EXAMPLES
from tests.daemons import trigger_message
from tests.memory import running_bridge

RELU = (EXAMPLES / "tasks" / "relu.py").read_text()
KERNEL = "```python\nclass ModelNew:  # the coder's kernel, line 1\n    pass\n```"


def test_the_conductor_reads_the_coders_code_the_task_and_the_counters(tmp_path: Path) -> None:
    """conductor_connect_all: the designer's sketch, the conductor sends it to the coder,
    whose code the conductor then reads before it chooses the verifier."""
    script = {
        "designer": ["```python\n# sketch: one program per block\n```"],
        "coder": [KERNEL],
        "conductor": [
            json.dumps({"decision": "coder", "error_and_suggestion": "write it"}),
            json.dumps({"decision": "verifier", "error_and_suggestion": ""}),
        ],
    }
    path = tmp_path / "script.yaml"
    path.write_text(yaml.safe_dump(script))
    provider = make_provider(f"scripted:{path}")
    _, text = load_workflow("conductor_connect_all")
    submitted = TaskSubmitted(
        task_id="c-1", task_name="relu", task_source=RELU, workflow_name="conductor_connect_all",
        workflow_yaml=text, backend="triton", group_id="g",
    )  # fmt: skip
    with running_bridge() as bridge:
        conductor = Conductor(bridge, llm=provider)
        conductor.advance(bridge.call(bridge.log.append(TaskHistory("c-1"), [submitted])))
        for agent in ("designer", "coder"):
            history = bridge.call(bridge.log.read_task("c-1"))
            assert isinstance(history.events[-1], AgentDispatched)
            assert history.events[-1].agent == agent
            LLMAgent(bridge, agent, provider).handle(trigger_message(history))
            conductor.advance(bridge.call(bridge.log.read_task("c-1")))
        state = fold("c-1", bridge.call(bridge.log.read_task("c-1")).events)
    assert [d.chosen for d in state.decisions] == ["designer", "coder", "verifier"]
    after_coder = state.conductor_calls[state.dispatches[1].result.event_id]  # type: ignore[union-attr]
    system, user = (m.content for m in after_coder.messages)
    assert "verified GPU kernels" in system
    assert "class ModelNew:  # the coder's kernel, line 1" in user  # the work itself
    assert "def get_inputs" in user  # the task: the reference it must match
    assert "Limits: step 2 of max_step 10; coder ran 1 time(s) in a row (single_agent limit 2)" in (
        user
    )
    assert "sequence coder_verifier repeated 0 time(s) (max_repeats 3)" in user
    assert "## Last verification\n(none yet)" in user


PROMPT_WORKFLOW = """
agent_info:
  solver:
    possible_next_agent: [finish, checker]
    output_format:
      parser_name: p
      parser_definition:
        output_fields:
          answer: {field_type: str, mandatory: true}
  checker:
    possible_next_agent: [finish]
start_agent: solver
mandatory_llm_analysis: [solver]
limitation_info:
  required:
    max_step: 3
"""


def test_a_prompt_tasks_conductor_speaks_of_the_query_and_cuts_long_work() -> None:
    long_answer = "7" * (CONDUCTOR_FIELD_CHARS + 50)
    events = [
        TaskSubmitted(
            task_id="p-1", seq=1, task_name="q", task_source="", workflow_name="w",
            workflow_yaml=PROMPT_WORKFLOW, backend="triton", group_id="g",
            prompt="What is 6 times 7?",
        ),
        ConductorDecided(
            task_id="p-1", seq=2, after_agent="", options=["solver"], mode="auto",
            chosen="solver", reason="start",
        ),
        AgentDispatched(task_id="p-1", seq=3, agent="solver", step=1, dispatch_id="p-1:d1"),
        OutputParsed(
            task_id="p-1", seq=4, agent="solver", dispatch_id="p-1:d1",
            fields={"answer": long_answer},
        ),
    ]  # fmt: skip
    workflow = parse_workflow(PROMPT_WORKFLOW, "w")
    system, user = (
        m.content
        for m in conductor_messages(fold("p-1", events), workflow, ("finish", "checker"), "solver")
    )
    for part in (system, user):
        assert "GPU" not in part and "PyTorch" not in part and "designer" not in part
    assert "answer a query" in system and "What is 6 times 7?" in user
    assert "7" * CONDUCTOR_FIELD_CHARS + "\n[… 50 more characters not shown]" in user
    assert "7" * (CONDUCTOR_FIELD_CHARS + 1) not in user
    assert "a prompt task is not verified" in user
